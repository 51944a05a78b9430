//! The web UI's HTTP API (docs/http-api.md) against a real `kiln up`: signing in by token and by
//! `kiln ui`'s single-use URL, CSRF refusals, calls and errors transcoded from gRPC, logs as
//! server-sent events that resume after `Last-Event-ID`, metric bands, roles, and the UI's files.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::blocking::{Client, RequestBuilder, Response};
use serde_json::{Value, json};

mod common;

use common::{Up, text};

fn client() -> Client {
    Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// A call of the HTTP API, as the UI makes it.
fn rpc(up: &Up, auth: &Auth, method: &str, body: Value) -> Response {
    auth.apply(
        client()
            .post(format!("{}/api/v1/rpc/{method}", up.ui_url()))
            .header("x-kiln-csrf", "1")
            .json(&body),
    )
    .send()
    .unwrap()
}

/// How a request proves who sends it.
enum Auth {
    Bearer(String),
    Cookie(String),
    Nobody,
}

impl Auth {
    fn apply(&self, request: RequestBuilder) -> RequestBuilder {
        match self {
            Auth::Bearer(token) => request.bearer_auth(token),
            Auth::Cookie(cookie) => request.header("cookie", cookie),
            Auth::Nobody => request,
        }
    }
}

fn json_of(response: Response) -> (StatusCode, Value) {
    let status = response.status();
    let body = response.text().unwrap();
    (
        status,
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}")),
    )
}

/// The `name=value` of a response's Set-Cookie, and its attributes.
fn set_cookie(response: &Response) -> (String, String) {
    let header = response
        .headers()
        .get("set-cookie")
        .expect("a Set-Cookie")
        .to_str()
        .unwrap()
        .to_string();
    let (pair, attributes) = header.split_once(';').unwrap();
    (pair.to_string(), attributes.to_string())
}

fn last_line(output: &std::process::Output) -> String {
    assert!(output.status.success(), "{}", text(&output.stderr));
    text(&output.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
fn a_token_login_sets_a_strict_http_only_cookie_and_writes_need_csrf_proof() {
    let up = Up::start();
    let url = format!("{}/api/v1/login", up.ui_url());
    let refused = client()
        .post(&url)
        .header("x-kiln-csrf", "1")
        .json(&json!({"token": "kiln_0000000000000000_00"}))
        .send()
        .unwrap();
    let (status, body) = json_of(refused);
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthenticated"))
    );

    let signed_in = client()
        .post(&url)
        .header("x-kiln-csrf", "1")
        .json(&json!({"token": up.admin_token()}))
        .send()
        .unwrap();
    assert_eq!(signed_in.status(), StatusCode::OK);
    let (cookie, attributes) = set_cookie(&signed_in);
    assert!(cookie.starts_with("kiln_session=kiln_"), "{cookie}");
    assert!(
        attributes.contains("HttpOnly") && attributes.contains("SameSite=Strict"),
        "{attributes}"
    );
    assert_eq!(json_of(signed_in).1["user"], "admin");
    let session = Auth::Cookie(cookie);
    let (status, me) = json_of(rpc(&up, &session, "NodeService/WhoAmI", json!({})));
    assert_eq!((status, me["admin"].as_bool()), (StatusCode::OK, Some(true)));

    // A write without the header, or from another origin, is refused whoever sends it.
    let bare = session
        .apply(client().post(format!("{}/api/v1/rpc/JobService/ListJobs", up.ui_url())))
        .body("{}")
        .send()
        .unwrap();
    assert_eq!(bare.status(), StatusCode::FORBIDDEN);
    let foreign = session
        .apply(client().post(format!("{}/api/v1/rpc/JobService/ListJobs", up.ui_url())))
        .header("x-kiln-csrf", "1")
        .header("origin", "http://evil.example")
        .body("{}")
        .send()
        .unwrap();
    assert_eq!(foreign.status(), StatusCode::FORBIDDEN);
    let (status, body) = json_of(rpc(&up, &Auth::Nobody, "JobService/ListJobs", json!({})));
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthenticated"))
    );

    // Logging out clears the cookie; the admin's own token lives on.
    let out = session
        .apply(client().post(format!("{}/api/v1/logout", up.ui_url())))
        .header("x-kiln-csrf", "1")
        .send()
        .unwrap();
    assert_eq!(out.status(), StatusCode::NO_CONTENT);
    assert!(set_cookie(&out).1.contains("Max-Age=0"));
    let (status, _) = json_of(rpc(&up, &session, "NodeService/WhoAmI", json!({})));
    assert_eq!(status, StatusCode::OK, "a token typed in is not revoked by logging out");
}

#[test]
fn kiln_ui_prints_a_login_url_that_signs_in_once() {
    let up = Up::start();
    let url = last_line(&up.kiln(&["ui", "--print-url"]));
    assert!(
        url.starts_with(&format!("{}/api/v1/login/code?code=kiln_", up.ui_url())),
        "{url}"
    );
    let code = url.split("code=").nth(1).unwrap().to_string();
    let (status, body) = json_of(rpc(&up, &Auth::Bearer(code), "NodeService/WhoAmI", json!({})));
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthenticated")),
        "a login code is no bearer token"
    );

    let first = client().get(&url).send().unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let (cookie, attributes) = set_cookie(&first);
    assert!(
        attributes.contains("HttpOnly") && attributes.contains("Max-Age=43200"),
        "{attributes}"
    );
    assert!(first.text().unwrap().contains("url=/\""), "it moves on to the UI");
    let session = Auth::Cookie(cookie.clone());
    let (status, me) = json_of(rpc(&up, &session, "NodeService/WhoAmI", json!({})));
    assert_eq!((status, me["user"].as_str()), (StatusCode::OK, Some("admin")));
    assert!(me["tokenName"].as_str().unwrap().starts_with("ui-session-"), "{me}");

    let again = client().get(&url).send().unwrap();
    assert!(again.headers().get("set-cookie").is_none(), "used once");
    assert!(again.text().unwrap().contains("/login?error="));

    // Logging out revokes the session the code made.
    let out = session
        .apply(client().post(format!("{}/api/v1/logout", up.ui_url())))
        .header("x-kiln-csrf", "1")
        .send()
        .unwrap();
    assert_eq!(out.status(), StatusCode::NO_CONTENT);
    let (status, _) = json_of(rpc(&up, &session, "NodeService/WhoAmI", json!({})));
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[test]
fn calls_and_their_errors_are_the_grpc_services_own_in_json() {
    let up = Up::start();
    let admin = Auth::Bearer(up.admin_token());
    let job = last_line(&up.kiln(&["run", "--no-code", "--name", "hello", "--", "sh", "-c", "echo hi"]));
    up.wait_for_state(&job, "SUCCEEDED");
    let (status, listed) = json_of(rpc(&up, &admin, "JobService/ListJobs", json!({"all": true})));
    assert_eq!(status, StatusCode::OK);
    let listed = &listed["jobs"][0];
    assert_eq!(
        (listed["id"].as_str(), listed["state"].as_str()),
        (Some(job.as_str()), Some("JOB_STATE_SUCCEEDED"))
    );
    assert!(listed["createdAtMs"].is_u64(), "64-bit integers are numbers: {listed}");
    assert_eq!(listed["spec"]["name"], "hello");

    let cases = [
        (
            "JobService/GetJob",
            json!({"jobId": "01a22826-4a16-7345-8170-000000000000"}),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            "JobService/GetJob",
            json!({"jobId": "x"}),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "JobService/ListJobs",
            json!({"bogus": 1}),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        ("JobService/Nothing", json!({}), StatusCode::NOT_FOUND, "not_found"),
        (
            "ArtifactService/UploadArtifact",
            json!({}),
            StatusCode::NOT_IMPLEMENTED,
            "unimplemented",
        ),
        (
            "LogService/GetLogs",
            json!({"jobId": job}),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            "UserService/CreateUser",
            json!({"name": "Not A Name!"}),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
    ];
    for (method, body, want_status, want_code) in cases {
        let (status, answer) = json_of(rpc(&up, &admin, method, body.clone()));
        assert_eq!(
            (status, answer["code"].as_str()),
            (want_status, Some(want_code)),
            "{method} {body}: {answer}"
        );
        assert!(!answer["message"].as_str().unwrap().is_empty());
    }
}

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
    let job = last_line(&up.kiln(&[
        "run",
        "--no-code",
        "--",
        "sh",
        "-c",
        "for i in 1 2 3 4 5; do echo line $i; done",
    ]));
    up.wait_for_state(&job, "SUCCEEDED");
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
}

#[test]
fn a_viewer_reads_a_project_but_the_api_refuses_their_stop() {
    let up = Up::start();
    let viewer = last_line(&up.kiln(&["user", "create", "vic"]));
    assert!(up.kiln(&["project", "create", "vision"]).status.success());
    assert!(
        up.kiln(&["project", "add-member", "vision", "vic", "--role", "viewer"])
            .status
            .success()
    );
    let job = last_line(&up.kiln(&["run", "--no-code", "--project", "vision", "--", "sleep", "60"]));
    up.wait_for_state(&job, "RUNNING");
    let viewer = Auth::Bearer(viewer);
    let (status, seen) = json_of(rpc(&up, &viewer, "JobService/GetJob", json!({"jobId": job})));
    assert_eq!(
        (status, seen["state"].as_str()),
        (StatusCode::OK, Some("JOB_STATE_RUNNING"))
    );
    let (status, refused) = json_of(rpc(&up, &viewer, "JobService/StopJob", json!({"jobId": job})));
    assert_eq!(
        (status, refused["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("permission_denied")),
        "{refused}"
    );
    assert_eq!(up.status_json(&job)["state"], "RUNNING");
    let (status, _) = json_of(rpc(
        &up,
        &Auth::Bearer(up.admin_token()),
        "JobService/StopJob",
        json!({"jobId": job}),
    ));
    assert_eq!(status, StatusCode::OK);
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
    let job = last_line(&up.kiln(&[
        "run",
        "--no-code",
        "--",
        "sh",
        "-c",
        "echo weights > $KILN_OUTPUTS/model.txt",
    ]));
    up.wait_for_state(&job, "SUCCEEDED");
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
