//! Tensors of the Open Inference Protocol (KServe v2) over HTTP: the JSON body of an inference
//! request or response, and the binary tensor extension.
//!
//! A tensor is `{name, shape, datatype, parameters, data}`; `data` is row-major, flat or nested
//! in arrays (both are accepted, flat is written), numbers for the numeric types, `true`/`false`
//! for `BOOL`, strings for `BYTES`. With the binary extension the body is the JSON header (its
//! length in the HTTP header `Inference-Header-Content-Length`) followed by the tensors that
//! carry `parameters.binary_data_size` in the order they are listed: little-endian values, and
//! for `BYTES` each element as a 4-byte little-endian length and its bytes.
//!
//! Parsing checks what a predictor must not trust: a known datatype, a shape whose product is
//! the element count (within [`Limits`]), values inside the datatype's range, binary sizes that
//! add up to the body exactly. Every refusal is an [`Error::Inference`] naming the tensor.
//!
//! The gRPC protocol carries the same tensors in protobuf: [`Tensor::from_raw`] and
//! [`Tensor::to_raw`] read and write its raw contents (the binary extension's layout),
//! [`Tensor::from_data`] checks its typed contents.

use serde_json::{Map, Value};

use crate::{Error, Result};

mod binary;
mod json;

use binary::{from_binary, take, to_binary};
use json::{flatten, from_json, json_can_hold, to_json};

/// The HTTP header giving the JSON header's length in a body with binary tensors.
pub const HEADER_LENGTH: &str = "Inference-Header-Content-Length";
/// The tensor parameter giving its size in the binary part.
pub const BINARY_DATA_SIZE: &str = "binary_data_size";

/// The bounds a parsed body must keep.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Elements in one tensor.
    pub max_elements: u64,
    /// Tensors in one request or response.
    pub max_tensors: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_elements: 64 << 20,
            max_tensors: 1024,
        }
    }
}

/// A tensor's element type, as the protocol names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Fp32,
    Fp64,
    Bytes,
}

const DATA_TYPES: [(DataType, &str); 13] = [
    (DataType::Bool, "BOOL"),
    (DataType::Uint8, "UINT8"),
    (DataType::Uint16, "UINT16"),
    (DataType::Uint32, "UINT32"),
    (DataType::Uint64, "UINT64"),
    (DataType::Int8, "INT8"),
    (DataType::Int16, "INT16"),
    (DataType::Int32, "INT32"),
    (DataType::Int64, "INT64"),
    (DataType::Fp16, "FP16"),
    (DataType::Fp32, "FP32"),
    (DataType::Fp64, "FP64"),
    (DataType::Bytes, "BYTES"),
];

impl DataType {
    pub fn parse(name: &str) -> Option<DataType> {
        DATA_TYPES.iter().find(|(_, known)| *known == name).map(|(dt, _)| *dt)
    }

    /// The datatype called `name`; refused naming `what` (`input `x``) and the known names.
    pub fn named(name: &str, what: &str) -> Result<DataType> {
        DataType::parse(name).ok_or_else(|| {
            let known: Vec<&str> = DATA_TYPES.iter().map(|(_, known)| *known).collect();
            refuse(format!(
                "{what}: unknown datatype `{name}` (known: {})",
                known.join(", ")
            ))
        })
    }

    pub fn name(self) -> &'static str {
        DATA_TYPES
            .iter()
            .find(|(dt, _)| *dt == self)
            .map_or("", |(_, name)| name)
    }

    /// Bytes an element takes in the binary part (`None` for `BYTES`, which are prefixed).
    pub fn width(self) -> Option<usize> {
        Some(match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => 1,
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 => 2,
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => 4,
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => 8,
            DataType::Bytes => return None,
        })
    }

    /// The range of an integer type.
    fn int_range(self) -> Option<(i128, i128)> {
        Some(match self {
            DataType::Uint8 => (0, u8::MAX.into()),
            DataType::Uint16 => (0, u16::MAX.into()),
            DataType::Uint32 => (0, u32::MAX.into()),
            DataType::Uint64 => (0, u64::MAX.into()),
            DataType::Int8 => (i8::MIN.into(), i8::MAX.into()),
            DataType::Int16 => (i16::MIN.into(), i16::MAX.into()),
            DataType::Int32 => (i32::MIN.into(), i32::MAX.into()),
            DataType::Int64 => (i64::MIN.into(), i64::MAX.into()),
            _ => return None,
        })
    }
}

/// A tensor's elements, by kind: every integer type in `Int` (checked against its own range),
/// every float type in `Float`.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    Bool(Vec<bool>),
    Int(Vec<i128>),
    Float(Vec<f64>),
    Bytes(Vec<Vec<u8>>),
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::Bool(values) => values.len(),
            Data::Int(values) => values.len(),
            Data::Float(values) => values.len(),
            Data::Bytes(values) => values.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<u64>,
    pub parameters: Map<String, Value>,
    pub data: Data,
}

/// An output a request asks for, with its parameters (`binary_data: true`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestedOutput {
    pub name: String,
    pub parameters: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct InferRequest {
    pub id: Option<String>,
    pub parameters: Map<String, Value>,
    pub inputs: Vec<Tensor>,
    pub outputs: Vec<RequestedOutput>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct InferResponse {
    pub model_name: String,
    pub model_version: Option<String>,
    pub id: Option<String>,
    pub parameters: Map<String, Value>,
    pub outputs: Vec<Tensor>,
}

fn refuse(message: impl Into<String>) -> Error {
    Error::Inference(message.into())
}

/// Splits a body into its JSON header and binary part (`header_length` from
/// [`HEADER_LENGTH`], `None` for a body that is all JSON) and parses the header.
fn split(body: &[u8], header_length: Option<usize>) -> Result<(Map<String, Value>, &[u8])> {
    let (json, binary) = match header_length {
        None => (body, &body[body.len()..]),
        Some(length) if length <= body.len() => body.split_at(length),
        Some(length) => {
            return Err(refuse(format!(
                "{HEADER_LENGTH} is {length} but the body has {} bytes",
                body.len()
            )));
        }
    };
    match serde_json::from_slice(json) {
        Ok(Value::Object(map)) => Ok((map, binary)),
        Ok(_) => Err(refuse("the body must be a JSON object")),
        Err(error) => Err(refuse(format!("the body is not JSON: {error}"))),
    }
}

fn string_field(map: &Map<String, Value>, key: &str, what: &str) -> Result<Option<String>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(value)) => Ok(Some(value.clone())),
        Some(_) => Err(refuse(format!("{what}: `{key}` must be a string"))),
    }
}

fn parameters(map: &Map<String, Value>, what: &str) -> Result<Map<String, Value>> {
    match map.get("parameters") {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(parameters)) => Ok(parameters.clone()),
        Some(_) => Err(refuse(format!("{what}: `parameters` must be an object"))),
    }
}

fn tensors<'a>(map: &'a Map<String, Value>, key: &str, limits: &Limits) -> Result<&'a [Value]> {
    let list = match map.get(key) {
        None => return Ok(&[]),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(refuse(format!("`{key}` must be a list of tensors"))),
    };
    if list.len() > limits.max_tensors {
        return Err(refuse(format!(
            "{} {key}, more than the {} allowed",
            list.len(),
            limits.max_tensors
        )));
    }
    Ok(list)
}

/// One tensor of `inputs` or `outputs`, its data from the JSON or from `binary`.
fn tensor(value: &Value, binary: &mut &[u8], limits: &Limits, role: &str, at: usize) -> Result<Tensor> {
    let Value::Object(map) = value else {
        return Err(refuse(format!("{role} {at} must be an object")));
    };
    let name = string_field(map, "name", &format!("{role} {at}"))?
        .ok_or_else(|| refuse(format!("{role} {at} has no `name`")))?;
    let what = format!("{role} `{name}`");
    let datatype = match string_field(map, "datatype", &what)? {
        None => return Err(refuse(format!("{what} has no `datatype`"))),
        Some(dt) => DataType::named(&dt, &what)?,
    };
    let shape: Vec<u64> = match map.get("shape") {
        Some(Value::Array(dims)) => dims
            .iter()
            .map(|dim| dim.as_u64())
            .collect::<Option<_>>()
            .ok_or_else(|| refuse(format!("{what}: `shape` must be a list of integers ≥ 0")))?,
        _ => return Err(refuse(format!("{what} has no `shape`"))),
    };
    let elements = element_count(&shape, limits, &what)?;
    let parameters = parameters(map, &what)?;
    let data = match (parameters.get(BINARY_DATA_SIZE), map.get("data")) {
        (Some(size), None) => {
            let size = size
                .as_u64()
                .and_then(|size| usize::try_from(size).ok())
                .ok_or_else(|| refuse(format!("{what}: {BINARY_DATA_SIZE} must be an integer ≥ 0")))?;
            let bytes = take(binary, size, &what)?;
            from_binary(datatype, bytes, elements, &what)?
        }
        (Some(_), Some(_)) => {
            return Err(refuse(format!("{what} has both `data` and {BINARY_DATA_SIZE}")));
        }
        (None, Some(data)) => {
            let mut flat = Vec::new();
            flatten(data, &mut flat, elements, &what)?;
            from_json(datatype, &flat, &what)?
        }
        (None, None) => return Err(refuse(format!("{what} has no `data`"))),
    };
    check_count(&data, elements, &shape, &what)?;
    Ok(Tensor {
        name,
        datatype,
        shape,
        parameters,
        data,
    })
}

/// The elements a shape holds, at most [`Limits::max_elements`].
fn element_count(shape: &[u64], limits: &Limits, what: &str) -> Result<u64> {
    shape
        .iter()
        .try_fold(1u64, |product, dim| product.checked_mul(*dim))
        .filter(|count| *count <= limits.max_elements)
        .ok_or_else(|| {
            refuse(format!(
                "{what}: shape {shape:?} has more than {} elements",
                limits.max_elements
            ))
        })
}

fn check_count(data: &Data, elements: u64, shape: &[u64], what: &str) -> Result<()> {
    if data.len() as u64 != elements {
        return Err(refuse(format!(
            "{what}: shape {shape:?} holds {elements} elements but the data has {}",
            data.len()
        )));
    }
    Ok(())
}

// === impl Tensor ===

impl Tensor {
    /// A tensor from its raw contents, laid out as in the binary tensor extension (and the gRPC
    /// protocol's `raw_input_contents`): the row-major elements little-endian, BYTES each as a
    /// 4-byte little-endian length and its bytes. Checked as a parsed body is; a refusal names
    /// the tensor as `role` (`input`, `output`). Its parameters are empty.
    pub fn from_raw(
        name: String,
        datatype: DataType,
        shape: Vec<u64>,
        raw: &[u8],
        role: &str,
        limits: &Limits,
    ) -> Result<Tensor> {
        let what = format!("{role} `{name}`");
        let elements = element_count(&shape, limits, &what)?;
        if let Some(width) = datatype.width()
            && raw.len() as u64 != elements.saturating_mul(width as u64)
        {
            return Err(refuse(format!(
                "{what}: its raw contents are {} bytes, but {elements} {} elements take {}",
                raw.len(),
                datatype.name(),
                elements.saturating_mul(width as u64)
            )));
        }
        let data = from_binary(datatype, raw, elements, &what)?;
        check_count(&data, elements, &shape, &what)?;
        Ok(Tensor {
            name,
            datatype,
            shape,
            parameters: Map::new(),
            data,
        })
    }

    /// A tensor from typed elements (the gRPC protocol's `contents`), checked as a parsed body
    /// is: elements of the datatype's kind, integers inside its range, as many as the shape
    /// holds. Its parameters are empty.
    pub fn from_data(
        name: String,
        datatype: DataType,
        shape: Vec<u64>,
        data: Data,
        role: &str,
        limits: &Limits,
    ) -> Result<Tensor> {
        let what = format!("{role} `{name}`");
        let elements = element_count(&shape, limits, &what)?;
        let kind_fits = match (&data, datatype) {
            (Data::Bool(_), DataType::Bool) | (Data::Bytes(_), DataType::Bytes) => true,
            (Data::Float(_), DataType::Fp16 | DataType::Fp32 | DataType::Fp64) => true,
            (Data::Int(values), _) => match datatype.int_range() {
                Some((low, high)) => {
                    if let Some((at, value)) = values
                        .iter()
                        .enumerate()
                        .find(|(_, value)| !(low..=high).contains(*value))
                    {
                        return Err(refuse(format!(
                            "{what}: element {at} ({value}) is outside {}",
                            datatype.name()
                        )));
                    }
                    true
                }
                None => false,
            },
            _ => false,
        };
        if !kind_fits {
            return Err(refuse(format!("{what}: its elements are not {}", datatype.name())));
        }
        check_count(&data, elements, &shape, &what)?;
        Ok(Tensor {
            name,
            datatype,
            shape,
            parameters: Map::new(),
            data,
        })
    }

    /// The tensor's raw contents, laid out as [`Tensor::from_raw`] reads them.
    pub fn to_raw(&self) -> Vec<u8> {
        to_binary(self)
    }
}

/// The tensors as JSON; the ones `binary` picks (and those [`json_can_hold`] refuses) go to
/// `tail`, the binary part, instead.
fn write_tensors(tensors: &[Tensor], binary: &dyn Fn(&Tensor) -> bool, tail: &mut Vec<u8>) -> Value {
    tensors
        .iter()
        .map(|tensor| {
            let mut map = Map::new();
            map.insert("name".into(), Value::String(tensor.name.clone()));
            map.insert("datatype".into(), Value::String(tensor.datatype.name().into()));
            map.insert("shape".into(), tensor.shape.iter().copied().map(Value::from).collect());
            let mut parameters = tensor.parameters.clone();
            if binary(tensor) || !json_can_hold(&tensor.data) {
                let bytes = to_binary(tensor);
                parameters.insert(BINARY_DATA_SIZE.into(), Value::from(bytes.len() as u64));
                tail.extend_from_slice(&bytes);
            } else {
                parameters.remove(BINARY_DATA_SIZE);
                map.insert("data".into(), to_json(&tensor.data));
            }
            if !parameters.is_empty() {
                map.insert("parameters".into(), Value::Object(parameters));
            }
            Value::Object(map)
        })
        .collect()
}

/// The body: JSON, then the binary part; and the JSON's length when there is a binary part
/// (for [`HEADER_LENGTH`]).
fn body(header: Map<String, Value>, tail: Vec<u8>) -> (Vec<u8>, Option<usize>) {
    let mut out = serde_json::to_vec(&Value::Object(header)).unwrap_or_default();
    if tail.is_empty() {
        return (out, None);
    }
    let length = out.len();
    out.extend_from_slice(&tail);
    (out, Some(length))
}

/// The tensors under `key`, each a `role`, taking their binary data from `binary` in order,
/// which they must use up.
fn all_tensors(
    map: &Map<String, Value>,
    key: &str,
    role: &str,
    mut binary: &[u8],
    limits: &Limits,
) -> Result<Vec<Tensor>> {
    let parsed: Vec<Tensor> = tensors(map, key, limits)?
        .iter()
        .enumerate()
        .map(|(at, value)| tensor(value, &mut binary, limits, role, at))
        .collect::<Result<_>>()?;
    if !binary.is_empty() {
        return Err(refuse(format!("{} bytes after the last binary {role}", binary.len())));
    }
    Ok(parsed)
}

fn insert_common(map: &mut Map<String, Value>, id: &Option<String>, parameters: &Map<String, Value>) {
    if let Some(id) = id {
        map.insert("id".into(), Value::String(id.clone()));
    }
    if !parameters.is_empty() {
        map.insert("parameters".into(), Value::Object(parameters.clone()));
    }
}

impl InferRequest {
    /// Parses a request body (`header_length` from [`HEADER_LENGTH`]).
    pub fn parse(body: &[u8], header_length: Option<usize>, limits: &Limits) -> Result<InferRequest> {
        let (map, binary) = split(body, header_length)?;
        let inputs = all_tensors(&map, "inputs", "input", binary, limits)?;
        if inputs.is_empty() {
            return Err(refuse("the request has no `inputs`"));
        }
        let outputs = tensors(&map, "outputs", limits)?
            .iter()
            .enumerate()
            .map(|(at, value)| {
                let Value::Object(output) = value else {
                    return Err(refuse(format!("output {at} must be an object")));
                };
                let name = string_field(output, "name", &format!("output {at}"))?
                    .ok_or_else(|| refuse(format!("output {at} has no `name`")))?;
                let parameters = parameters(output, &format!("output `{name}`"))?;
                Ok(RequestedOutput { name, parameters })
            })
            .collect::<Result<_>>()?;
        Ok(InferRequest {
            id: string_field(&map, "id", "the request")?,
            parameters: parameters(&map, "the request")?,
            inputs,
            outputs,
        })
    }

    /// The request's body, with the inputs `binary` picks in the binary part.
    pub fn encode(&self, binary: &dyn Fn(&Tensor) -> bool) -> (Vec<u8>, Option<usize>) {
        let mut map = Map::new();
        insert_common(&mut map, &self.id, &self.parameters);
        let mut tail = Vec::new();
        map.insert("inputs".into(), write_tensors(&self.inputs, binary, &mut tail));
        if !self.outputs.is_empty() {
            let outputs = self
                .outputs
                .iter()
                .map(|output| {
                    let mut entry = Map::new();
                    entry.insert("name".into(), Value::String(output.name.clone()));
                    if !output.parameters.is_empty() {
                        entry.insert("parameters".into(), Value::Object(output.parameters.clone()));
                    }
                    Value::Object(entry)
                })
                .collect();
            map.insert("outputs".into(), outputs);
        }
        body(map, tail)
    }

    /// Whether the output `name` is wanted in the binary part: its own `binary_data`, else the
    /// request's `binary_data_output`.
    pub fn wants_binary(&self, name: &str) -> bool {
        let own = self
            .outputs
            .iter()
            .find(|output| output.name == name)
            .and_then(|output| output.parameters.get("binary_data"))
            .and_then(Value::as_bool);
        own.or_else(|| self.parameters.get("binary_data_output").and_then(Value::as_bool))
            .unwrap_or(false)
    }
}

impl InferResponse {
    /// Parses a response body (`header_length` from [`HEADER_LENGTH`]).
    pub fn parse(body: &[u8], header_length: Option<usize>, limits: &Limits) -> Result<InferResponse> {
        let (map, binary) = split(body, header_length)?;
        let outputs = all_tensors(&map, "outputs", "output", binary, limits)?;
        Ok(InferResponse {
            model_name: string_field(&map, "model_name", "the response")?.unwrap_or_default(),
            model_version: string_field(&map, "model_version", "the response")?,
            id: string_field(&map, "id", "the response")?,
            parameters: parameters(&map, "the response")?,
            outputs,
        })
    }

    /// The response's body, with the outputs `binary` picks in the binary part.
    pub fn encode(&self, binary: &dyn Fn(&Tensor) -> bool) -> (Vec<u8>, Option<usize>) {
        let mut map = Map::new();
        map.insert("model_name".into(), Value::String(self.model_name.clone()));
        if let Some(version) = &self.model_version {
            map.insert("model_version".into(), Value::String(version.clone()));
        }
        insert_common(&mut map, &self.id, &self.parameters);
        let mut tail = Vec::new();
        map.insert("outputs".into(), write_tensors(&self.outputs, binary, &mut tail));
        body(map, tail)
    }
}

#[cfg(test)]
mod tests;
