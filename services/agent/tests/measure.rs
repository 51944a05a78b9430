//! `kiln-agent --measure-into FILE -- COMMAND`: ends as its command ended and writes what the
//! command's process tree used, nothing of its own or its parent's.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use kiln_agent::measure::Usage;

const AGENT: &str = env!("CARGO_BIN_EXE_kiln-agent");

fn measured(command: &[&str]) -> (std::process::ExitStatus, Option<Usage>) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("usage");
    let status = Command::new(AGENT)
        .arg("--measure-into")
        .arg(&file)
        .arg("--")
        .args(command)
        .status()
        .unwrap();
    (status, Usage::read(&file))
}

#[test]
fn a_commands_tree_is_measured_and_its_ending_passed_on() {
    // 0.5 s of CPU in a grandchild holding 64 MiB: the tree's, not the shell's alone.
    let burn = "import time\nblock = b'x' * (64 << 20)\nwhile time.process_time() < 0.5:\n    pass\n";
    let (status, usage) = measured(&["sh", "-c", &format!("python3 -c \"{burn}\"; exit 3")]);
    assert_eq!(status.code(), Some(3));
    let usage = usage.expect("a usage file");
    assert!((0.4..0.7).contains(&usage.cpu_seconds), "{usage:?}");
    let mib = usage.peak_memory_bytes >> 20;
    assert!((64..90).contains(&mib), "{usage:?}");

    let (killed, usage) = measured(&["sh", "-c", "kill -TERM $$"]);
    assert_eq!(killed.signal(), Some(15), "ends by the command's signal");
    assert!(usage.is_some());

    let (missing, usage) = measured(&["/no/such/program"]);
    assert_eq!((missing.code(), usage), (Some(127), None));

    let usage_error = Command::new(AGENT).arg("--measure-into").status().unwrap();
    assert_eq!(usage_error.code(), Some(64));
}
