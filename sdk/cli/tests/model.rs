//! `kiln model` end to end on `kiln up`: register a job's outputs, list, search by tag, alias,
//! tag, show, and `get` files byte-identical to the job's outputs.

use std::path::Path;

use crate::common;

use common::{Up, text};

fn ok(up: &Up, args: &[&str]) -> String {
    let output = up.kiln(args);
    assert!(output.status.success(), "kiln {args:?}: {}", text(&output.stderr));
    text(&output.stdout)
}

fn json(up: &Up, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(up, args)).unwrap()
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn a_registered_model_is_listed_aliased_tagged_and_downloaded_intact() {
    let up = Up::start();
    let script = r#"mkdir -p "$KILN_OUTPUTS/m/sub"; head -c 100000 /dev/urandom > "$KILN_OUTPUTS/m/w.bin"; echo hi > "$KILN_OUTPUTS/m/sub/notes.txt""#;
    let run = up.kiln(&["run", "-f", "--", "sh", "-c", script]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    let stderr = text(&run.stderr);
    let job = stderr
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();

    let from = format!("{job}:m");
    let registered = ok(
        &up,
        &[
            "model",
            "register",
            "net",
            "--from",
            &from,
            "--tag",
            "stage=dev",
            "--alias",
            "candidate",
        ],
    );
    assert_eq!(registered.trim(), "net:1");
    let again = ok(&up, &["model", "register", "net", "--from", &from]);
    assert_eq!(again.trim(), "net:2");

    let models = json(&up, &["model", "ls", "-o", "json"]);
    assert_eq!(models[0]["name"], "net");
    assert_eq!(models[0]["latest_version"], 2);
    assert_eq!(models[0]["aliases"]["candidate"], 1);
    let tagged = json(&up, &["model", "versions", "net", "--tag", "stage=dev", "-o", "json"]);
    assert_eq!(tagged.as_array().unwrap().len(), 1);
    assert_eq!(tagged[0]["version"], 1);
    assert!(ok(&up, &["model", "versions", "net"]).contains("candidate"));

    assert_eq!(
        ok(&up, &["model", "alias", "net", "2", "production"]).trim(),
        "net@production -> net:2"
    );
    ok(&up, &["model", "alias", "net", "1", "production"]);
    assert_eq!(
        ok(&up, &["model", "tag", "net:1", "owner=ada", "stage="]).trim(),
        "net:1 owner=ada"
    );
    let shown = json(&up, &["model", "show", "net@production", "-o", "json"]);
    assert_eq!(shown["version"], 1);
    assert_eq!(shown["lineage"]["job_id"], job.as_str());
    assert_eq!(shown["lineage"]["source_path"], "m");
    assert_eq!(shown["tags"]["owner"], "ada");
    let aliases: Vec<&str> = shown["aliases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(aliases, ["candidate", "production"]);
    assert!(ok(&up, &["model", "show", "net:2"]).contains(&format!("job:         {job}")));

    // The downloaded version is the job's outputs, byte for byte.
    let outputs = tempfile::tempdir().unwrap();
    ok(
        &up,
        &[
            "artifacts",
            "get",
            &job,
            "m",
            "--dest",
            outputs.path().to_str().unwrap(),
        ],
    );
    let model = tempfile::tempdir().unwrap();
    let got = up.kiln(&[
        "model",
        "get",
        "net@production",
        "--dest",
        model.path().to_str().unwrap(),
    ]);
    assert!(got.status.success(), "{}", text(&got.stderr));
    assert!(
        text(&got.stderr).contains("every sha256 checked"),
        "{}",
        text(&got.stderr)
    );
    for path in ["w.bin", "sub/notes.txt"] {
        assert_eq!(
            read(&model.path().join(path)),
            read(&outputs.path().join("m").join(path)),
            "{path}"
        );
    }

    let missing = up.kiln(&["model", "show", "nope"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing.stderr).contains("model nope not found"),
        "{}",
        text(&missing.stderr)
    );
    let unaliased = up.kiln(&["model", "get", "net@staging", "--dest", model.path().to_str().unwrap()]);
    assert!(
        text(&unaliased.stderr).contains("has no alias staging"),
        "{}",
        text(&unaliased.stderr)
    );
    assert_eq!(
        up.kiln(&["model", "show", "net:x"]).status.code(),
        Some(2),
        "clap refuses a bad version"
    );
    assert!(ok(&up, &["model", "unalias", "net", "candidate"]).contains("pointed at net:1"));
}
