//! An inference request body as a predictor receives it (the first two bytes choose the JSON
//! header's length, as `Inference-Header-Content-Length` would): no panic, no allocation beyond
//! the limits, and a request that parses encodes to a body that parses to the same tensors.

#![no_main]

use kiln_formats::oip::{InferRequest, Limits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_elements: 1 << 16,
        max_tensors: 64,
    };
    let (header, body) = match data {
        [a, b, rest @ ..] if a & 1 == 1 => (Some(usize::from(u16::from_le_bytes([*a, *b]) >> 1)), rest),
        _ => (None, data),
    };
    let Ok(request) = InferRequest::parse(body, header, &limits) else {
        return;
    };
    for binary in [false, true] {
        let (encoded, length) = request.encode(&|_| binary);
        let again = InferRequest::parse(&encoded, length, &limits).expect("an encoded request parses");
        assert_eq!(again.inputs.len(), request.inputs.len());
        for (got, want) in again.inputs.iter().zip(&request.inputs) {
            assert_eq!(
                (&got.name, got.datatype, &got.shape),
                (&want.name, want.datatype, &want.shape)
            );
        }
    }
});
