use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::binary::{f16_to_f64, f64_to_f16};
use super::*;

fn parse(body: &Value) -> Result<InferRequest> {
    InferRequest::parse(body.to_string().as_bytes(), None, &Limits::default())
}

fn refusal(body: &Value) -> String {
    parse(body).expect_err("refused").to_string()
}

fn tensor(name: &str, datatype: DataType, shape: &[u64], data: Data) -> Tensor {
    Tensor {
        name: name.into(),
        datatype,
        shape: shape.to_vec(),
        parameters: Map::new(),
        data,
    }
}

#[test]
fn the_protocol_s_json_request_parses_flat_or_nested() {
    let request = parse(&json!({
        "id": "42",
        "parameters": {"timeout": 50},
        "inputs": [
            {"name": "input0", "shape": [2, 2], "datatype": "UINT32", "data": [[1, 2], [3, 4]]},
            {"name": "input1", "shape": [3], "datatype": "BOOL", "data": [true, false, true]},
            {"name": "input2", "shape": [1], "datatype": "BYTES", "data": ["hello"]}
        ],
        "outputs": [{"name": "output0", "parameters": {"binary_data": true}}]
    }))
    .unwrap();
    assert_eq!(request.id.as_deref(), Some("42"));
    assert_eq!(request.parameters["timeout"], 50);
    assert_eq!(request.inputs[0].shape, [2, 2]);
    assert_eq!(request.inputs[0].data, Data::Int(vec![1, 2, 3, 4]));
    assert_eq!(request.inputs[1].data, Data::Bool(vec![true, false, true]));
    assert_eq!(request.inputs[2].data, Data::Bytes(vec![b"hello".to_vec()]));
    assert!(request.wants_binary("output0"));
    assert!(!request.wants_binary("output1"));
}

#[test]
fn bad_requests_are_refused_naming_the_tensor_and_what_is_wrong() {
    let input = |fields: Value| json!({"inputs": [fields]});
    let cases = [
        (json!([1]), "must be a JSON object"),
        (json!({"inputs": []}), "no `inputs`"),
        (
            input(json!({"shape": [1], "datatype": "FP32", "data": [1]})),
            "input 0 has no `name`",
        ),
        (
            input(json!({"name": "x", "shape": [1], "datatype": "FP128", "data": [1]})),
            "input `x`: unknown datatype `FP128` (known: BOOL, UINT8",
        ),
        (
            input(json!({"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]})),
            "input `x`: `shape` must be a list of integers ≥ 0",
        ),
        (
            input(json!({"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2]})),
            "input `x`: shape [3] holds 3 elements but the data has 2",
        ),
        (
            input(json!({"name": "x", "shape": [1], "datatype": "FP32", "data": [1, 2]})),
            "input `x`: the data has more elements than its shape",
        ),
        (
            input(json!({"name": "x", "shape": [1], "datatype": "UINT8", "data": [300]})),
            "input `x`: element 0 (300) is outside UINT8",
        ),
        (
            input(json!({"name": "x", "shape": [1], "datatype": "INT32", "data": [1.5]})),
            "input `x`: element 0 is not an integer",
        ),
        (
            input(json!({"name": "x", "shape": [1], "datatype": "BYTES", "data": [1]})),
            "input `x`: element 0 is not a string",
        ),
        (
            input(json!({"name": "x", "shape": [4294967296u64, 4294967296u64], "datatype": "FP32", "data": []})),
            "input `x`: shape [4294967296, 4294967296] has more than",
        ),
        (
            input(json!({"name": "x", "shape": [1], "datatype": "FP32"})),
            "input `x` has no `data`",
        ),
        (
            input(json!({"name": "x", "shape": [1], "datatype": "FP32", "data": [1],
                "parameters": {"binary_data_size": 4}})),
            "input `x` has both `data` and binary_data_size",
        ),
    ];
    for (body, want) in cases {
        let got = refusal(&body);
        assert!(got.contains(want), "{body}: {got:?} does not say {want:?}");
    }
}

#[test]
fn binary_tensors_round_trip_and_their_sizes_are_checked() {
    let request = InferRequest {
        id: Some("7".into()),
        inputs: vec![
            tensor("f32", DataType::Fp32, &[2, 2], Data::Float(vec![1.5, -2.0, 0.25, 8.0])),
            tensor("f16", DataType::Fp16, &[3], Data::Float(vec![1.0, -0.5, 65504.0])),
            tensor("i8", DataType::Int8, &[2], Data::Int(vec![-128, 127])),
            tensor("u64", DataType::Uint64, &[1], Data::Int(vec![u64::MAX.into()])),
            tensor(
                "s",
                DataType::Bytes,
                &[2],
                Data::Bytes(vec![b"ab".to_vec(), Vec::new()]),
            ),
            tensor("b", DataType::Bool, &[2], Data::Bool(vec![true, false])),
        ],
        ..InferRequest::default()
    };
    let (body, header) = request.encode(&|tensor| tensor.name != "b");
    let length = header.expect("a binary part");
    let parsed = InferRequest::parse(&body, Some(length), &Limits::default()).unwrap();
    let sizes: Vec<u64> = parsed
        .inputs
        .iter()
        .map(|input| {
            input
                .parameters
                .get(BINARY_DATA_SIZE)
                .and_then(Value::as_u64)
                .unwrap_or(0)
        })
        .collect();
    assert_eq!(sizes, [16, 6, 2, 8, 4 + 2 + 4, 0]);
    for (got, want) in parsed.inputs.iter().zip(&request.inputs) {
        assert_eq!(
            (&got.name, &got.shape, &got.data),
            (&want.name, &want.shape, &want.data)
        );
    }

    let limits = Limits::default();
    let short = InferRequest::parse(&body[..body.len() - 3], Some(length), &limits).unwrap_err();
    assert!(short.to_string().contains("runs past the end of the body"), "{short}");
    let mut long = body.clone();
    long.extend_from_slice(&[0, 0]);
    let trailing = InferRequest::parse(&long, Some(length), &limits).unwrap_err();
    assert!(
        trailing.to_string().contains("2 bytes after the last binary input"),
        "{trailing}"
    );
    let beyond = InferRequest::parse(&body, Some(body.len() + 1), &limits).unwrap_err();
    assert!(beyond.to_string().contains(HEADER_LENGTH), "{beyond}");

    // A FP32 tensor whose binary size is not 4 bytes an element.
    let header = json!({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32",
        "parameters": {"binary_data_size": 6}}]})
    .to_string();
    let mut odd = header.clone().into_bytes();
    odd.extend_from_slice(&[0; 6]);
    let refused = InferRequest::parse(&odd, Some(header.len()), &limits).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("binary_data_size is 6 bytes, but 2 FP32 elements take 8"),
        "{refused}"
    );
}

#[test]
fn a_response_round_trips_with_its_outputs_in_json_or_binary() {
    let response = InferResponse {
        model_name: "digits".into(),
        model_version: Some("3".into()),
        id: Some("42".into()),
        parameters: Map::from_iter([("kiln.partial".to_string(), Value::Bool(false))]),
        outputs: vec![
            tensor("probs", DataType::Fp64, &[1, 2], Data::Float(vec![0.25, 0.75])),
            tensor("label", DataType::Int64, &[1], Data::Int(vec![-3])),
        ],
    };
    for binary in [false, true] {
        let (body, header) = response.encode(&|tensor| binary && tensor.name == "probs");
        assert_eq!(header.is_some(), binary);
        let parsed = InferResponse::parse(&body, header, &Limits::default()).unwrap();
        assert_eq!(
            (&parsed.model_name, &parsed.model_version, &parsed.id),
            (&response.model_name, &response.model_version, &response.id)
        );
        assert_eq!(parsed.parameters["kiln.partial"], false);
        let data: Vec<&Data> = parsed.outputs.iter().map(|output| &output.data).collect();
        assert_eq!(data, [&response.outputs[0].data, &response.outputs[1].data]);
    }
}

#[test]
fn half_precision_is_ieee_754() {
    for (value, bits) in [
        (1.0, 0x3c00u16),
        (-2.0, 0xc000),
        (65504.0, 0x7bff),
        (2f64.powi(-24), 0x0001),
        (2f64.powi(-14), 0x0400),
        (0.0, 0x0000),
        (f64::INFINITY, 0x7c00),
    ] {
        assert_eq!(f64_to_f16(value), bits, "{value}");
        assert_eq!(f16_to_f64(bits), value, "{bits:#x}");
    }
    // Every finite half survives the trip through f64.
    for bits in 0..=u16::MAX {
        if (bits >> 10) & 0x1f != 0x1f {
            assert_eq!(f64_to_f16(f16_to_f64(bits)), bits, "{bits:#x}");
        }
    }
}

fn data_of(datatype: DataType) -> BoxedStrategy<Data> {
    let len = 0..6usize;
    match datatype {
        DataType::Bool => prop::collection::vec(any::<bool>(), len).prop_map(Data::Bool).boxed(),
        DataType::Bytes => prop::collection::vec(prop::collection::vec(any::<u8>(), 0..5), len)
            .prop_map(Data::Bytes)
            .boxed(),
        DataType::Fp16 => prop::collection::vec(any::<u16>(), len)
            .prop_map(|bits| {
                Data::Float(
                    bits.into_iter()
                        .map(f16_to_f64)
                        .filter(|value| value.is_finite())
                        .collect(),
                )
            })
            .boxed(),
        DataType::Fp32 => prop::collection::vec(-1.0e30f32..1.0e30, len)
            .prop_map(|values| Data::Float(values.into_iter().map(f64::from).collect()))
            .boxed(),
        DataType::Fp64 => prop::collection::vec(
            prop_oneof![-1.0e300f64..1.0e300, Just(f64::INFINITY), Just(f64::NEG_INFINITY)],
            len,
        )
        .prop_map(Data::Float)
        .boxed(),
        integer => {
            let (low, high) = integer.int_range().expect("an integer type");
            prop::collection::vec(low..=high, len).prop_map(Data::Int).boxed()
        }
    }
}

fn a_tensor() -> impl Strategy<Value = Tensor> {
    prop::sample::select(DATA_TYPES.to_vec()).prop_flat_map(|(datatype, _)| {
        ("[a-z]{1,8}", data_of(datatype)).prop_map(move |(name, data)| Tensor {
            shape: vec![data.len() as u64],
            name,
            datatype,
            parameters: Map::new(),
            data,
        })
    })
}

#[test]
fn raw_contents_are_the_binary_extension_s_layout_and_are_checked_alike() {
    let limits = Limits::default();
    let x = Tensor::from_raw(
        "x".into(),
        DataType::Fp32,
        vec![2],
        &[0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0],
        "input",
        &limits,
    )
    .unwrap();
    assert_eq!(x.data, Data::Float(vec![1.0, -2.0]));
    assert_eq!(x.to_raw(), [0, 0, 0x80, 0x3f, 0, 0, 0, 0xc0]);
    let words = Tensor::from_raw(
        "w".into(),
        DataType::Bytes,
        vec![2],
        b"\x02\0\0\0hi\0\0\0\0",
        "input",
        &limits,
    )
    .unwrap();
    assert_eq!(words.data, Data::Bytes(vec![b"hi".to_vec(), Vec::new()]));
    assert_eq!(words.to_raw(), b"\x02\0\0\0hi\0\0\0\0");

    let refusal = |datatype, shape: &[u64], raw: &[u8]| {
        Tensor::from_raw("x".into(), datatype, shape.to_vec(), raw, "input", &limits)
            .expect_err("refused")
            .to_string()
    };
    assert_eq!(
        refusal(DataType::Fp32, &[3], &[0; 8]),
        "input `x`: its raw contents are 8 bytes, but 3 FP32 elements take 12"
    );
    assert_eq!(
        refusal(DataType::Bytes, &[3], b"\x01\0\0\0a"),
        "input `x`: shape [3] holds 3 elements but the data has 1"
    );
    assert!(refusal(DataType::Uint8, &[u64::MAX, 2], &[]).starts_with("input `x`: shape"));
}

#[test]
fn typed_contents_must_be_of_the_datatype_s_kind_and_range() {
    let limits = Limits::default();
    let from = |datatype, data| Tensor::from_data("y".into(), datatype, vec![2], data, "output", &limits);
    assert_eq!(
        from(DataType::Int16, Data::Int(vec![-3, 4])).unwrap().data,
        Data::Int(vec![-3, 4])
    );
    assert_eq!(
        from(DataType::Uint8, Data::Int(vec![1, 256])).unwrap_err().to_string(),
        "output `y`: element 1 (256) is outside UINT8"
    );
    assert_eq!(
        from(DataType::Fp32, Data::Int(vec![1, 2])).unwrap_err().to_string(),
        "output `y`: its elements are not FP32"
    );
    assert_eq!(
        from(DataType::Bool, Data::Bool(vec![true])).unwrap_err().to_string(),
        "output `y`: shape [2] holds 2 elements but the data has 1"
    );
    assert_eq!(
        DataType::named("BF16", "input `x`").unwrap_err().to_string(),
        "input `x`: unknown datatype `BF16` (known: BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BYTES)"
    );
}

proptest! {
    #[test]
    fn any_tensor_round_trips_through_its_raw_contents(tensor in a_tensor()) {
        let raw = tensor.to_raw();
        let back = Tensor::from_raw(tensor.name.clone(), tensor.datatype, tensor.shape.clone(), &raw, "input", &Limits::default()).unwrap();
        prop_assert_eq!(back.data, tensor.data);
    }

    #[test]
    fn any_request_round_trips_in_json_and_in_binary(
        inputs in prop::collection::vec(a_tensor(), 1..5),
        picks in prop::collection::vec(any::<bool>(), 5),
    ) {
        let request = InferRequest { inputs, ..InferRequest::default() };
        let names: Vec<String> = request.inputs.iter().map(|input| input.name.clone()).collect();
        let (body, header) = request.encode(&|tensor| {
            names.iter().position(|name| *name == tensor.name).is_some_and(|at| picks[at])
        });
        let parsed = InferRequest::parse(&body, header, &Limits::default()).unwrap();
        prop_assert_eq!(parsed.inputs.len(), request.inputs.len());
        for (got, want) in parsed.inputs.iter().zip(&request.inputs) {
            prop_assert_eq!((&got.name, got.datatype, &got.shape, &got.data), (&want.name, want.datatype, &want.shape, &want.data));
        }
    }

    #[test]
    fn no_body_makes_the_parser_panic(
        body in prop::collection::vec(any::<u8>(), 0..300),
        header in prop::option::of(0usize..320),
    ) {
        let _ = InferRequest::parse(&body, header, &Limits::default());
        let _ = InferResponse::parse(&body, header, &Limits::default());
    }

    #[test]
    fn a_declared_shape_is_never_trusted_beyond_the_limits(dims in prop::collection::vec(any::<u64>(), 0..4)) {
        let body = json!({"inputs": [{"name": "x", "shape": dims, "datatype": "UINT8",
            "parameters": {"binary_data_size": 0}}]}).to_string();
        let limits = Limits { max_elements: 1000, max_tensors: 4 };
        let parsed = InferRequest::parse(body.as_bytes(), Some(body.len()), &limits);
        let product = dims.iter().try_fold(1u64, |p, d| p.checked_mul(*d));
        prop_assert_eq!(parsed.is_ok(), product == Some(0));
    }
}
