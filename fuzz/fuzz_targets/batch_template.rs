//! A batch's per-item command (one argument per line): validated, and rendered when valid.
//! No panic; a refusal names the command.

#![no_main]

use kiln_formats::template::{self, Values};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let command: Vec<String> = text.split('\n').map(str::to_string).collect();
    match template::validate(&command) {
        Ok(()) => {
            let values = Values {
                uri: "s3://bucket/{uri}",
                output: "/out/{{",
                item: "}",
                attempt: u32::MAX,
            };
            assert_eq!(template::render(&command, values).len(), command.len());
        }
        Err(error) => assert!(error.to_string().contains("command"), "{error}"),
    }
});
