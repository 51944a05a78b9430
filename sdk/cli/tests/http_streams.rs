//! The web UI's HTTP API (docs/http-api.md) against a real `kiln up`: logs as server-sent events
//! that resume after `Last-Event-ID`, metric bands, the UI's files, and downloads.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common;

use common::http::{Auth, client, json_of, rpc, succeeded_job};
use common::{Up, last_line, text};

/// The `data:` lines of a finished SSE body and the ids before them.
fn events(body: &str) -> Vec<(Option<String>, String, String)> {
    body.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|line| line.strip_prefix(name).map(|v| v.trim().to_string()))
            };
            (
                field("id:"),
                field("event:").unwrap_or_else(|| "message".into()),
                field("data:").unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn logs_stream_as_server_sent_events_and_resume_after_the_last_event_id() {
    let up = Up::start();
    let admin = Auth::Bearer(up.admin_token());
    let job = succeeded_job(&up, "for i in 1 2 3 4 5; do echo line $i; done");
    let request = serde_json::to_string(&json!({"jobId": job, "follow": true})).unwrap();
    let url = format!("{}/api/v1/stream/LogService/GetLogs", up.ui_url());
    let stream = |last: Option<&str>| {
        let mut call = admin.apply(client().get(&url).query(&[("request", request.as_str())]));
        if let Some(last) = last {
            call = call.header("last-event-id", last);
        }
        let response = call.send().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        events(&response.text().unwrap())
    };
    let all = stream(None);
    let lines: Vec<Value> = all
        .iter()
        .filter(|(_, kind, _)| kind == "message")
        .map(|(_, _, data)| serde_json::from_str(data).unwrap())
        .collect();
    let texts: Vec<&str> = lines.iter().map(|line| line["text"].as_str().unwrap()).collect();
    assert_eq!(texts, ["line 1", "line 2", "line 3", "line 4", "line 5"]);
    for ((id, _, _), line) in all.iter().zip(&lines) {
        assert_eq!(
            id.as_deref(),
            Some(line["seq"].to_string().as_str()),
            "the event id is the line's seq"
        );
    }
    assert_eq!(all.last().unwrap().1, "end", "a finished log ends with an `end` event");

    let third = lines[2]["seq"].to_string();
    let resumed: Vec<String> = stream(Some(&third))
        .into_iter()
        .filter(|(_, kind, _)| kind == "message")
        .map(|(_, _, data)| {
            serde_json::from_str::<Value>(&data).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(resumed, ["line 4", "line 5"]);

    let unknown = admin
        .apply(
            client()
                .get(&url)
                .query(&[("request", r#"{"jobId":"01a22826-4a16-7345-8170-000000000000"}"#)]),
        )
        .send()
        .unwrap();
    assert_eq!(
        json_of(unknown).0,
        StatusCode::NOT_FOUND,
        "a stream that cannot start is an HTTP error"
    );
}

#[test]
fn metrics_come_back_as_bands_a_chart_draws_per_pixel() {
    let up = Up::start();
    let admin = Auth::Bearer(up.admin_token());
    let (status, run) = json_of(rpc(&up, &admin, "JobService/CreateRun", json!({"name": "curve"})));
    assert_eq!(status, StatusCode::OK, "{run}");
    let job = run["id"].as_str().unwrap().to_string();
    // 10,000 points of `loss` = -step, with a spike at 4,321 and NaN at 9,999.
    let steps: Vec<i64> = (0..10_000).collect();
    let values: Vec<Value> = steps
        .iter()
        .map(|&step| match step {
            4321 => json!(1e6),
            9999 => json!("NaN"),
            _ => json!(-(step as f64)),
        })
        .collect();
    let written = rpc(
        &up,
        &admin,
        "LogService/WriteMetrics",
        json!({"jobId": job, "columns": {"keys": ["loss"], "keyIndex": vec![0; steps.len()], "steps": steps, "values": values}}),
    );
    assert_eq!(json_of(written).1["accepted"], 10_000);
    let deadline = Instant::now() + Duration::from_secs(30);
    let series = loop {
        let (status, answer) = json_of(rpc(
            &up,
            &admin,
            "LogService/QueryMetrics",
            json!({"jobIds": [job], "keys": ["loss"], "maxPoints": 100, "bands": true}),
        ));
        assert_eq!(status, StatusCode::OK, "{answer}");
        let series = answer["series"][0].clone();
        if series["totalPoints"] == 10_000 {
            break series;
        }
        assert!(Instant::now() < deadline, "the points never all landed: {answer}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(series["points"], json!([]), "bands instead of points");
    let bands = &series["bands"];
    let buckets = bands["steps"].as_array().unwrap().len();
    assert!((90..=100).contains(&buckets), "{buckets} buckets for 100 pixels");
    let maxs = bands["maxs"].as_array().unwrap();
    assert!(maxs.contains(&json!(1e6)), "the spike survives in its bucket's max");
    assert_eq!(
        bands["lasts"].as_array().unwrap().last(),
        Some(&json!("NaN")),
        "non-finite values are strings"
    );
    assert_eq!(
        bands["mins"].as_array().unwrap().first(),
        Some(&json!(-(bands["steps"][0].as_f64().unwrap())))
    );

    // Zoomed in, the same width gives every point.
    let (_, zoomed) = json_of(rpc(
        &up,
        &admin,
        "LogService/QueryMetrics",
        json!({"jobIds": [job], "keys": ["loss"], "maxPoints": 100, "bands": true, "minStep": 4300, "maxStep": 4349}),
    ));
    let zoomed = &zoomed["series"][0];
    assert_eq!(zoomed["totalPoints"], 50);
    assert_eq!(zoomed["bands"]["steps"].as_array().unwrap().len(), 50);

    // One bucket summarises the whole series: the Runs table's latest and best values.
    let (_, whole) = json_of(rpc(
        &up,
        &admin,
        "LogService/QueryMetrics",
        json!({"jobIds": [job], "maxPoints": 1, "bands": true}),
    ));
    let whole = &whole["series"][0]["bands"];
    assert_eq!(whole["steps"], json!([9999]));
    assert_eq!(whole["mins"], json!([-9998.0]));
    assert_eq!(whole["maxs"], json!([1e6]));
    assert_eq!(whole["lasts"], json!(["NaN"]));
}

#[test]
fn the_ui_is_served_from_its_directory_with_every_other_path_its_index() {
    let ui = tempfile::tempdir().unwrap();
    std::fs::create_dir(ui.path().join("assets")).unwrap();
    std::fs::write(ui.path().join("index.html"), "<!doctype html><title>kiln ui</title>").unwrap();
    std::fs::write(ui.path().join("assets/app.js"), "console.log('kiln')").unwrap();
    let up = Up::start_with(&["--provider", "process", "--ui-dir", ui.path().to_str().unwrap()]);
    let get = |path: &str| client().get(format!("{}{path}", up.ui_url())).send().unwrap();
    let script = get("/assets/app.js");
    assert_eq!(script.headers()["content-type"], "text/javascript");
    assert_eq!(script.text().unwrap(), "console.log('kiln')");
    for route in ["/", "/runs/01a22826-4a16-7345-8170-000000000000", "/compare?ids=a,b"] {
        let page = get(route);
        assert_eq!(page.status(), StatusCode::OK, "{route}");
        let headers = page.headers().clone();
        assert!(
            headers["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("default-src 'self'")
        );
        assert_eq!(
            headers["referrer-policy"], "no-referrer",
            "a login URL never leaks as a referrer"
        );
        assert!(page.text().unwrap().contains("kiln ui"), "{route} is the UI's index");
    }
    let (status, body) = json_of(get("/api/v2/nothing"));
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
}

#[test]
fn a_jobs_output_downloads_as_a_file() {
    let up = Up::start();
    let admin = Auth::Bearer(up.admin_token());
    let job = succeeded_job(&up, "echo weights > $KILN_OUTPUTS/model.txt");
    let download = |method: &str, request: Value| {
        let request = serde_json::to_string(&request).unwrap();
        admin
            .apply(
                client()
                    .get(format!("{}/api/v1/download/{method}", up.ui_url()))
                    .query(&[("request", request.as_str()), ("filename", "model \"x\".txt")]),
            )
            .send()
            .unwrap()
    };
    let file = download("ArtifactService/GetOutput", json!({"jobId": job, "path": "model.txt"}));
    assert_eq!(file.status(), StatusCode::OK);
    assert_eq!(
        file.headers()["content-disposition"],
        "attachment; filename=\"modelx.txt\"",
        "the name is cleaned"
    );
    assert_eq!(file.text().unwrap(), "weights\n");
    let (status, missing) = json_of(download(
        "ArtifactService/GetOutput",
        json!({"jobId": job, "path": "nothing"}),
    ));
    assert_eq!(
        (status, missing["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, _) = json_of(download("LogService/GetLogs", json!({"jobId": job})));
    assert_eq!(status, StatusCode::BAD_REQUEST, "log lines are no file");
}

#[test]
fn a_file_uploaded_from_the_browser_is_a_blob_a_dataset_names_and_a_viewer_uploads_nothing() {
    use sha2::Digest;
    let up = Up::start();
    assert!(up.kiln(&["project", "create", "vision"]).status.success());
    let viewer = last_line(&up.kiln(&["user", "create", "vic"]));
    let member = last_line(&up.kiln(&["user", "create", "mia"]));
    for (user, role) in [("vic", "viewer"), ("mia", "member")] {
        let added = up.kiln(&["project", "add-member", "vision", user, "--role", role]);
        assert!(added.status.success());
    }
    let upload = |auth: &Auth, project: &str, body: Vec<u8>, csrf: bool| {
        let request = client()
            .post(format!("{}/api/v1/upload", up.ui_url()))
            .query(&[("project", project)])
            .header("content-type", "application/octet-stream")
            .body(body);
        let request = if csrf {
            request.header("x-kiln-csrf", "1")
        } else {
            request
        };
        json_of(auth.apply(request).send().unwrap())
    };
    // Several of the chunks the upload is sent in, not a multiple of one.
    let file: Vec<u8> = (0..2_500_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let digest = hex::encode(sha2::Sha256::digest(&file));

    let (status, refused) = upload(&Auth::Bearer(viewer), "vision", file.clone(), true);
    assert_eq!(
        (status, refused["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("permission_denied")),
        "{refused}"
    );
    let (status, refused) = upload(&Auth::Bearer(member.clone()), "vision", file.clone(), false);
    assert_eq!(status, StatusCode::FORBIDDEN, "no CSRF header: {refused}");
    let (status, refused) = upload(&Auth::Bearer(member.clone()), "vision", Vec::new(), true);
    assert_eq!(
        (status, refused["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_argument"))
    );

    let member = Auth::Bearer(member);
    let (status, stored) = upload(&member, "vision", file.clone(), true);
    assert_eq!(status, StatusCode::OK, "{stored}");
    assert_eq!(
        (
            stored["digest"].as_str(),
            stored["size"].as_u64(),
            stored["created"].as_bool()
        ),
        (Some(digest.as_str()), Some(file.len() as u64), Some(true))
    );
    let (_, again) = upload(&member, "vision", file, true);
    assert_eq!(again["created"].as_bool(), Some(false), "stored once: {again}");

    let (status, dataset) = json_of(rpc(
        &up,
        &member,
        "DatasetService/CreateDataset",
        json!({"name": "pics", "digest": digest, "project": "vision"}),
    ));
    assert_eq!(
        (status, dataset["size"].as_u64()),
        (StatusCode::OK, Some(2_500_000)),
        "{dataset}"
    );
    let listed = text(&up.kiln(&["dataset", "ls"]).stdout);
    assert!(listed.contains("pics") && listed.contains(&digest[..12]), "{listed}");
}
