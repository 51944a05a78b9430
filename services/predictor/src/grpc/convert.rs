//! The Open Inference Protocol's gRPC messages and kiln_formats' tensors, both ways: requests
//! checked as a REST body is (inputs raw or typed), responses always raw.

use std::collections::HashMap;

use kiln_formats::oip::{Data, DataType, InferRequest, InferResponse, Limits, RequestedOutput, Tensor};
use kiln_proto::inference as pb;
use kiln_proto::inference::infer_parameter::ParameterChoice;
use serde_json::{Map, Value};

use crate::{Error, Result};

/// A datatype as a ModelConfig names it.
pub(super) fn config_type(datatype: &str) -> pb::DataType {
    match DataType::parse(datatype) {
        Some(DataType::Bool) => pb::DataType::TypeBool,
        Some(DataType::Uint8) => pb::DataType::TypeUint8,
        Some(DataType::Uint16) => pb::DataType::TypeUint16,
        Some(DataType::Uint32) => pb::DataType::TypeUint32,
        Some(DataType::Uint64) => pb::DataType::TypeUint64,
        Some(DataType::Int8) => pb::DataType::TypeInt8,
        Some(DataType::Int16) => pb::DataType::TypeInt16,
        Some(DataType::Int32) => pb::DataType::TypeInt32,
        Some(DataType::Int64) => pb::DataType::TypeInt64,
        Some(DataType::Fp16) => pb::DataType::TypeFp16,
        Some(DataType::Fp32) => pb::DataType::TypeFp32,
        Some(DataType::Fp64) => pb::DataType::TypeFp64,
        Some(DataType::Bytes) => pb::DataType::TypeString,
        None => pb::DataType::TypeInvalid,
    }
}

fn invalid(error: kiln_formats::Error) -> Error {
    Error::InvalidArgument(error.to_string())
}

/// The request a [`pb::ModelInferRequest`] makes, checked as a REST body is.
pub fn infer_request(message: pb::ModelInferRequest, limits: &Limits) -> Result<InferRequest> {
    let pb::ModelInferRequest {
        id,
        parameters,
        inputs,
        outputs,
        raw_input_contents,
        ..
    } = message;
    if inputs.is_empty() {
        return Err(Error::InvalidArgument("the request has no inputs".into()));
    }
    for (count, role) in [(inputs.len(), "inputs"), (outputs.len(), "outputs")] {
        if count > limits.max_tensors {
            return Err(Error::InvalidArgument(format!(
                "{count} {role}, more than the {} allowed",
                limits.max_tensors
            )));
        }
    }
    if !raw_input_contents.is_empty() && raw_input_contents.len() != inputs.len() {
        return Err(Error::InvalidArgument(format!(
            "raw_input_contents has {} buffers for {} inputs: give one per input, in their order, or none",
            raw_input_contents.len(),
            inputs.len()
        )));
    }
    let mut raw = raw_input_contents.into_iter();
    let inputs = inputs
        .into_iter()
        .map(|input| {
            let what = format!("input `{}`", input.name);
            let datatype = DataType::named(&input.datatype, &what).map_err(invalid)?;
            let shape = input
                .shape
                .iter()
                .map(|dim| u64::try_from(*dim))
                .collect::<Result<Vec<u64>, _>>()
                .map_err(|_| Error::InvalidArgument(format!("{what}: shape {:?} must be integers ≥ 0", input.shape)))?;
            let contents = input
                .contents
                .filter(|contents| *contents != pb::InferTensorContents::default());
            let mut tensor = match (raw.next(), contents) {
                (Some(_), Some(_)) => {
                    return Err(Error::InvalidArgument(format!(
                        "{what} has contents, but the request has raw_input_contents: give one or the other"
                    )));
                }
                (Some(bytes), None) => Tensor::from_raw(input.name, datatype, shape, &bytes, "input", limits),
                (None, Some(contents)) => {
                    let data = typed(datatype, contents, &what)?;
                    Tensor::from_data(input.name, datatype, shape, data, "input", limits)
                }
                // No contents at all: only a tensor with no elements has none.
                (None, None) if shape.contains(&0) => {
                    Tensor::from_raw(input.name, datatype, shape, &[], "input", limits)
                }
                (None, None) => {
                    return Err(Error::InvalidArgument(format!(
                        "{what} has no contents, and the request no raw_input_contents"
                    )));
                }
            }
            .map_err(invalid)?;
            tensor.parameters = parameters_in(input.parameters, &what)?;
            Ok(tensor)
        })
        .collect::<Result<Vec<_>>>()?;
    let outputs = outputs
        .into_iter()
        .map(|output| {
            let what = format!("output `{}`", output.name);
            Ok(RequestedOutput {
                parameters: parameters_in(output.parameters, &what)?,
                name: output.name,
            })
        })
        .collect::<Result<_>>()?;
    Ok(InferRequest {
        id: Some(id).filter(|id| !id.is_empty()),
        parameters: parameters_in(parameters, "the request")?,
        inputs,
        outputs,
    })
}

/// The elements of typed contents, from the field of `datatype`.
fn typed(datatype: DataType, contents: pb::InferTensorContents, what: &str) -> Result<Data> {
    let given = contents.bool_contents.len()
        + contents.int_contents.len()
        + contents.int64_contents.len()
        + contents.uint_contents.len()
        + contents.uint64_contents.len()
        + contents.fp32_contents.len()
        + contents.fp64_contents.len()
        + contents.bytes_contents.len();
    let (field, data) = match datatype {
        DataType::Bool => ("bool_contents", Data::Bool(contents.bool_contents)),
        DataType::Int8 | DataType::Int16 | DataType::Int32 => (
            "int_contents",
            Data::Int(contents.int_contents.into_iter().map(i128::from).collect()),
        ),
        DataType::Int64 => (
            "int64_contents",
            Data::Int(contents.int64_contents.into_iter().map(i128::from).collect()),
        ),
        DataType::Uint8 | DataType::Uint16 | DataType::Uint32 => (
            "uint_contents",
            Data::Int(contents.uint_contents.into_iter().map(i128::from).collect()),
        ),
        DataType::Uint64 => (
            "uint64_contents",
            Data::Int(contents.uint64_contents.into_iter().map(i128::from).collect()),
        ),
        DataType::Fp32 => (
            "fp32_contents",
            Data::Float(contents.fp32_contents.into_iter().map(f64::from).collect()),
        ),
        DataType::Fp64 => ("fp64_contents", Data::Float(contents.fp64_contents)),
        DataType::Bytes => ("bytes_contents", Data::Bytes(contents.bytes_contents)),
        DataType::Fp16 => {
            return Err(Error::InvalidArgument(format!(
                "{what} is FP16, which has no typed contents: send it in raw_input_contents"
            )));
        }
    };
    if data.len() != given {
        return Err(Error::InvalidArgument(format!(
            "{what} is {}: its elements belong in contents.{field}",
            datatype.name()
        )));
    }
    Ok(data)
}

/// Parameters as the REST API's JSON values.
fn parameters_in(parameters: HashMap<String, pb::InferParameter>, what: &str) -> Result<Map<String, Value>> {
    parameters
        .into_iter()
        .map(|(name, parameter)| {
            let value = match parameter.parameter_choice {
                Some(ParameterChoice::BoolParam(value)) => Value::Bool(value),
                Some(ParameterChoice::Int64Param(value)) => Value::from(value),
                Some(ParameterChoice::Uint64Param(value)) => Value::from(value),
                Some(ParameterChoice::StringParam(value)) => Value::String(value),
                Some(ParameterChoice::DoubleParam(value)) => {
                    serde_json::Number::from_f64(value).map(Value::Number).ok_or_else(|| {
                        Error::InvalidArgument(format!("{what}: parameter `{name}` is {value}, not a finite number"))
                    })?
                }
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "{what}: parameter `{name}` has no value"
                    )));
                }
            };
            Ok((name, value))
        })
        .collect()
}

/// JSON parameters as the protocol's: numbers as int64, uint64 or double, other values than
/// booleans and strings as their JSON text.
fn parameters_out(parameters: &Map<String, Value>) -> HashMap<String, pb::InferParameter> {
    parameters
        .iter()
        .map(|(name, value)| {
            let choice = match value {
                Value::Bool(value) => ParameterChoice::BoolParam(*value),
                Value::String(value) => ParameterChoice::StringParam(value.clone()),
                Value::Number(number) => match (number.as_i64(), number.as_u64()) {
                    (Some(int), _) => ParameterChoice::Int64Param(int),
                    (None, Some(uint)) => ParameterChoice::Uint64Param(uint),
                    _ => ParameterChoice::DoubleParam(number.as_f64().unwrap_or(f64::NAN)),
                },
                other => ParameterChoice::StringParam(other.to_string()),
            };
            (
                name.clone(),
                pb::InferParameter {
                    parameter_choice: Some(choice),
                },
            )
        })
        .collect()
}

/// The message of a response, every output in `raw_output_contents` (as Triton answers).
pub fn infer_response(response: InferResponse) -> pb::ModelInferResponse {
    let mut raw_output_contents = Vec::with_capacity(response.outputs.len());
    let outputs = response
        .outputs
        .into_iter()
        .map(|tensor| {
            raw_output_contents.push(tensor.to_raw());
            let mut parameters = tensor.parameters.clone();
            parameters.remove(kiln_formats::oip::BINARY_DATA_SIZE);
            pb::model_infer_response::InferOutputTensor {
                datatype: tensor.datatype.name().into(),
                shape: tensor
                    .shape
                    .iter()
                    .map(|dim| i64::try_from(*dim).unwrap_or(i64::MAX))
                    .collect(),
                parameters: parameters_out(&parameters),
                contents: None,
                name: tensor.name,
            }
        })
        .collect();
    pb::ModelInferResponse {
        model_name: response.model_name,
        model_version: response.model_version.unwrap_or_default(),
        id: response.id.unwrap_or_default(),
        parameters: parameters_out(&response.parameters),
        outputs,
        raw_output_contents,
    }
}

#[cfg(test)]
mod tests;
