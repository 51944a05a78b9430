//! Batches from the `kiln` binary on `kiln up`: a batch run through `kiln batch`, and its items'
//! logs searched with `kiln batch logs --grep` on either log store.

use crate::common;

use common::{Up, text};

/// On a `kiln up` run from a binary with no kiln-agent beside it (the first command's
/// `target/quick/kiln`): process workers run the agent `kiln up` found, as containers do.
#[test]
fn a_batch_from_the_cli() {
    let up = Up::start_alone();
    let created = up.kiln(&[
        "batch",
        "create",
        "--cpu",
        "0.1",
        "--mem",
        "64M",
        "--max-workers",
        "2",
        "--max-attempts",
        "2",
        "--",
        "sh",
        "-c",
        "[ {item} != mem://bad ] || exit 5",
    ]);
    assert!(created.status.success(), "{}", text(&created.stderr));
    let batch = text(&created.stdout).trim().to_string();
    let items = up.project.path().join("items.txt");
    let mut lines: Vec<String> = (0..50).map(|n| format!("mem://{n}")).collect();
    lines.push("mem://bad".into());
    lines.push("# a comment".into());
    std::fs::write(&items, lines.join("\n")).unwrap();
    let added = up.kiln(&["batch", "add", &batch, "--from", items.to_str().unwrap()]);
    assert_eq!(
        text(&added.stdout),
        "added 51, 0 already there; 51 items in the batch\n",
        "{}",
        text(&added.stderr)
    );
    assert!(up.kiln(&["batch", "seal", &batch]).status.success());
    // Bounded, so a batch whose workers never start fails here with kiln up's log (`--watch`
    // alone would wait for ever).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !text(&up.kiln(&["batch", "status", &batch]).stdout).contains("(DONE)") {
        assert!(
            std::time::Instant::now() < deadline,
            "the batch never ended:\n{}",
            up.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let watched = up.kiln(&["batch", "status", &batch, "--watch"]);
    assert_eq!(watched.status.code(), Some(1), "a dead item makes the exit code 1");
    let status = text(&watched.stdout);
    assert!(
        status.contains("(DONE)") && status.contains("51 total: 0 pending, 0 running, 50 succeeded, 0 failed, 1 dead"),
        "{status}"
    );
    let dead = text(&up.kiln(&["batch", "items", &batch, "--state", "dead"]).stdout);
    assert!(dead.contains("mem://bad") && dead.contains(" 5 "), "{dead}");
    let listed = text(&up.kiln(&["batch", "ls", "--all"]).stdout);
    assert!(listed.contains(&batch) && listed.contains("DONE"), "{listed}");
    let late = up.kiln(&["batch", "add", &batch, "--from", items.to_str().unwrap()]);
    assert!(!late.status.success());
    assert!(text(&late.stderr).contains("open batch"), "{}", text(&late.stderr));
    let bad = up.kiln(&["batch", "create", "--", "echo", "{url}"]);
    assert!(
        text(&bad.stderr).contains("unknown placeholder {url}"),
        "{}",
        text(&bad.stderr)
    );
}

/// 10,000 items of which 7 print a marker, searched with `kiln batch logs --grep` on `kiln up`
/// whose log store is `store_flags`.
fn a_batch_is_searched_for_a_marker(store_flags: &[&str]) {
    let mut flags = vec!["--provider", "process"];
    flags.extend_from_slice(store_flags);
    let up = Up::start_with(&flags);
    let created = up.kiln(&[
        "batch",
        "create",
        "--cpu",
        "0.1",
        "--mem",
        "64M",
        "--max-workers",
        "2",
        "--",
        "kiln:echo",
        "saw",
        "{uri}",
    ]);
    assert!(created.status.success(), "{}", text(&created.stderr));
    let batch = text(&created.stdout).trim().to_string();
    let markers = [17, 404, 2500, 5000, 7777, 9001, 9999];
    let uris: Vec<String> = (0..10_000)
        .map(|n| match markers.contains(&n) {
            true => format!("mem://marker-{n}"),
            false => format!("mem://plain-{n}"),
        })
        .collect();
    let items = up.project.path().join("items.txt");
    std::fs::write(&items, uris.join("\n")).unwrap();
    let added = up.kiln(&["batch", "add", &batch, "--from", items.to_str().unwrap()]);
    assert!(added.status.success(), "{}", text(&added.stderr));
    assert!(up.kiln(&["batch", "seal", &batch]).status.success());
    let watched = up.kiln(&["batch", "status", &batch, "--watch"]);
    assert!(
        text(&watched.stdout).contains("10000 succeeded"),
        "{}",
        text(&watched.stdout)
    );

    let found = up.kiln(&["batch", "logs", &batch, "--grep", "marker"]);
    assert!(found.status.success(), "{}", text(&found.stderr));
    let mut expected: Vec<String> = markers
        .iter()
        .map(|n| format!("mem://marker-{n} [attempt 1] saw mem://marker-{n}"))
        .collect();
    expected.sort();
    assert_eq!(
        text(&found.stdout).lines().collect::<Vec<_>>(),
        expected,
        "exactly the seven, by key"
    );
    let dead = up.kiln(&["batch", "logs", &batch, "--grep", "marker", "--state", "dead"]);
    assert_eq!(
        (dead.status.code(), text(&dead.stdout)),
        (Some(1), String::new()),
        "no attempt died"
    );
    let regex = up.kiln(&[
        "batch",
        "logs",
        &batch,
        "--grep",
        "^saw mem://marker-9\\d+$",
        "--regex",
        "--limit",
        "1",
    ]);
    assert_eq!(
        text(&regex.stdout),
        "mem://marker-9001 [attempt 1] saw mem://marker-9001\n",
        "9001 and 9999 match"
    );
    assert!(text(&regex.stderr).contains("raise --limit"), "{}", text(&regex.stderr));
    let bad = up.kiln(&["batch", "logs", &batch, "--grep", "(", "--regex"]);
    assert!(
        text(&bad.stderr).contains("not a valid regular expression"),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn a_batch_is_searched_across_its_items_on_sqlite() {
    a_batch_is_searched_for_a_marker(&[]);
}

#[test]
fn a_batch_is_searched_across_its_items_on_cassandra() {
    let nodes = std::env::var("KILN_TEST_SCYLLA_NODES")
        .expect("KILN_TEST_SCYLLA_NODES is not set: run the tests through scripts/test.sh, which starts Cassandra");
    a_batch_is_searched_for_a_marker(&["--log-store", "scylla", "--scylla-nodes", &nodes]);
}
