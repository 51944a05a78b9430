use std::collections::HashMap;

use kiln_formats::oip::{Data, DataType, InferResponse, Limits, Tensor};
use kiln_proto::inference as pb;
use kiln_proto::inference::infer_parameter::ParameterChoice;
use kiln_proto::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use serde_json::{Value, json};

use super::{infer_request, infer_response};

fn parameter(choice: ParameterChoice) -> pb::InferParameter {
    pb::InferParameter {
        parameter_choice: Some(choice),
    }
}

fn input(name: &str, datatype: &str, shape: &[i64], contents: Option<pb::InferTensorContents>) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: shape.to_vec(),
        parameters: HashMap::new(),
        contents,
    }
}

fn refusal(message: pb::ModelInferRequest) -> String {
    infer_request(message, &Limits::default())
        .expect_err("refused")
        .to_string()
}

#[test]
fn raw_inputs_are_read_in_order_with_the_parameters() {
    let message = pb::ModelInferRequest {
        model_name: "scale".into(),
        id: "r-1".into(),
        parameters: HashMap::from([
            ("timeout".to_string(), parameter(ParameterChoice::Int64Param(5_000))),
            ("tag".to_string(), parameter(ParameterChoice::StringParam("a".into()))),
            ("top".to_string(), parameter(ParameterChoice::Uint64Param(u64::MAX))),
            ("t".to_string(), parameter(ParameterChoice::DoubleParam(0.5))),
            ("b".to_string(), parameter(ParameterChoice::BoolParam(true))),
        ]),
        inputs: vec![input("x", "FP64", &[2], None), input("w", "BYTES", &[1], None)],
        outputs: vec![InferRequestedOutputTensor {
            name: "y".into(),
            parameters: HashMap::new(),
        }],
        raw_input_contents: vec![
            [0.5f64.to_le_bytes(), (-4.0f64).to_le_bytes()].concat(),
            b"\x02\0\0\0hi".to_vec(),
        ],
        ..Default::default()
    };
    let request = infer_request(message, &Limits::default()).unwrap();
    assert_eq!(request.id.as_deref(), Some("r-1"));
    assert_eq!(
        Value::Object(request.parameters),
        json!({"timeout": 5000, "tag": "a", "top": u64::MAX, "t": 0.5, "b": true})
    );
    assert_eq!(request.inputs[0].data, Data::Float(vec![0.5, -4.0]));
    assert_eq!(request.inputs[1].data, Data::Bytes(vec![b"hi".to_vec()]));
    assert_eq!(request.outputs[0].name, "y");
}

#[test]
fn typed_contents_are_read_from_the_datatype_s_field() {
    let message = pb::ModelInferRequest {
        inputs: vec![
            input(
                "x",
                "FP32",
                &[1, 2],
                Some(pb::InferTensorContents {
                    fp32_contents: vec![1.5, 2.0],
                    ..Default::default()
                }),
            ),
            input(
                "n",
                "UINT16",
                &[1],
                Some(pb::InferTensorContents {
                    uint_contents: vec![7],
                    ..Default::default()
                }),
            ),
        ],
        ..Default::default()
    };
    let request = infer_request(message, &Limits::default()).unwrap();
    assert_eq!(request.id, None);
    assert_eq!(request.inputs[0].shape, [1, 2]);
    assert_eq!(request.inputs[0].data, Data::Float(vec![1.5, 2.0]));
    assert_eq!(request.inputs[1].data, Data::Int(vec![7]));
}

#[test]
fn bad_requests_are_refused_naming_the_tensor() {
    let raw = |inputs: Vec<InferInputTensor>, raw: Vec<Vec<u8>>| pb::ModelInferRequest {
        inputs,
        raw_input_contents: raw,
        ..Default::default()
    };
    let fp32 = |values: Vec<f32>| {
        Some(pb::InferTensorContents {
            fp32_contents: values,
            ..Default::default()
        })
    };
    let cases = [
        (raw(Vec::new(), Vec::new()), "the request has no inputs".to_string()),
        (
            raw(vec![input("x", "FP32", &[3], None)], vec![vec![0; 8]]),
            "input `x`: its raw contents are 8 bytes, but 3 FP32 elements take 12".into(),
        ),
        (
            raw(
                vec![input("x", "FP32", &[1], None), input("z", "FP32", &[1], None)],
                vec![vec![0; 4]],
            ),
            "raw_input_contents has 1 buffers for 2 inputs: give one per input, in their order, or none".into(),
        ),
        (
            raw(vec![input("x", "FP128", &[1], None)], vec![vec![0; 4]]),
            "input `x`: unknown datatype `FP128` (known: BOOL,".into(),
        ),
        (
            raw(vec![input("x", "FP32", &[-1], None)], vec![vec![0; 4]]),
            "input `x`: shape [-1] must be integers ≥ 0".into(),
        ),
        (
            raw(vec![input("x", "FP32", &[1], None)], Vec::new()),
            "input `x` has no contents, and the request no raw_input_contents".into(),
        ),
        (
            raw(vec![input("x", "FP32", &[1], fp32(vec![1.0]))], vec![vec![0; 4]]),
            "input `x` has contents, but the request has raw_input_contents: give one or the other".into(),
        ),
        (
            raw(vec![input("x", "FP32", &[2], fp32(vec![1.0]))], Vec::new()),
            "input `x`: shape [2] holds 2 elements but the data has 1".into(),
        ),
        (
            raw(
                vec![input(
                    "x",
                    "FP64",
                    &[1],
                    Some(pb::InferTensorContents {
                        fp32_contents: vec![1.0],
                        ..Default::default()
                    }),
                )],
                Vec::new(),
            ),
            "input `x` is FP64: its elements belong in contents.fp64_contents".into(),
        ),
        (
            raw(
                vec![input(
                    "x",
                    "INT8",
                    &[1],
                    Some(pb::InferTensorContents {
                        int_contents: vec![200],
                        ..Default::default()
                    }),
                )],
                Vec::new(),
            ),
            "input `x`: element 0 (200) is outside INT8".into(),
        ),
        (
            raw(vec![input("x", "FP16", &[1], fp32(vec![1.0]))], Vec::new()),
            "input `x` is FP16, which has no typed contents: send it in raw_input_contents".into(),
        ),
    ];
    for (message, want) in cases {
        let got = refusal(message);
        assert!(got.starts_with(&want), "{got}\n  wanted: {want}");
    }
    let mut no_value = raw(vec![input("x", "FP32", &[1], None)], vec![vec![0; 4]]);
    no_value
        .parameters
        .insert("p".into(), pb::InferParameter { parameter_choice: None });
    assert_eq!(refusal(no_value), "the request: parameter `p` has no value");
}

#[test]
fn responses_go_raw_with_their_parameters() {
    let response = InferResponse {
        model_name: "scale".into(),
        model_version: Some("3".into()),
        id: None,
        parameters: json!({"kiln.members_used": 2, "kiln.partial": false, "kiln.missing": "a,b", "x": [1]})
            .as_object()
            .unwrap()
            .clone(),
        outputs: vec![Tensor {
            name: "y".into(),
            datatype: DataType::Int32,
            shape: vec![2],
            parameters: json!({"binary_data_size": 8}).as_object().unwrap().clone(),
            data: Data::Int(vec![-1, 2]),
        }],
    };
    let message = infer_response(response);
    assert_eq!(
        (
            message.model_name.as_str(),
            message.model_version.as_str(),
            message.id.as_str()
        ),
        ("scale", "3", "")
    );
    let choice = |name: &str| message.parameters[name].parameter_choice.clone();
    assert_eq!(choice("kiln.members_used"), Some(ParameterChoice::Int64Param(2)));
    assert_eq!(choice("kiln.partial"), Some(ParameterChoice::BoolParam(false)));
    assert_eq!(choice("kiln.missing"), Some(ParameterChoice::StringParam("a,b".into())));
    assert_eq!(choice("x"), Some(ParameterChoice::StringParam("[1]".into())));
    let output = &message.outputs[0];
    assert_eq!(
        (output.name.as_str(), output.datatype.as_str(), output.shape.as_slice()),
        ("y", "INT32", &[2][..])
    );
    assert!(output.parameters.is_empty(), "binary_data_size is the REST API's");
    assert_eq!(output.contents, None);
    assert_eq!(
        message.raw_output_contents,
        vec![[(-1i32).to_le_bytes(), 2i32.to_le_bytes()].concat()]
    );
}
