//! The web UI's HTTP API (docs/http-api.md) against a real `kiln up`: signing in by token and by
//! `kiln ui` (a login the browser asks for and the CLI approves), CSRF refusals, calls and errors transcoded from gRPC, and roles.
//! (Streams, bands, files and downloads: `http_streams.rs`.)

use reqwest::StatusCode;
use serde_json::json;

use crate::common;

use common::http::{Auth, Browser, client, json_of, rpc, set_cookie};
use common::{Up, last_line, text};

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

/// `kiln ui`'s login goes to the browser that asked for it. Without that binding (the single-use
/// URL of before), whoever opened the link first was signed in: a leaked link signed in its
/// finder, and a link sent by someone else signed the victim's browser in to their account.
#[test]
fn kiln_ui_signs_in_only_the_browser_that_asked() {
    let up = Up::start();
    let printed = up.kiln(&["ui", "--print-url"]);
    let url = last_line(&printed);
    // The attack, with a link: opening it (in any browser) signs nothing in.
    let opened = client().get(&url).send().unwrap();
    assert!(
        !opened
            .headers()
            .get_all("set-cookie")
            .iter()
            .any(|set| set.to_str().unwrap().starts_with("kiln_session=")),
        "the link {url} signed in whoever opened it"
    );
    assert_eq!(url, format!("{}/login?via=cli", up.ui_url()));
    assert!(
        text(&printed.stderr).contains("kiln ui --approve CODE"),
        "{}",
        text(&printed.stderr)
    );

    let mut asking = Browser::default();
    let code = asking.ask(&up);
    let nonce = asking.cookie("kiln_login").expect("the nonce cookie");
    assert_eq!(asking.redeem(&up).0, StatusCode::ACCEPTED, "not approved yet");
    let approved = up.kiln(&["ui", "--approve", &code.to_lowercase()]);
    assert!(approved.status.success(), "{}", text(&approved.stderr));
    assert!(
        text(&approved.stderr).contains("kiln-test-browser"),
        "{}",
        text(&approved.stderr)
    );

    // The attack, with the approved code: another browser (no nonce cookie) is refused, and
    // the nonce is no bearer token.
    let (status, body) = Browser::default().redeem(&up);
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthenticated"))
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("this browser has no login waiting"),
        "{body}"
    );
    let (status, _) = json_of(rpc(&up, &Auth::Bearer(nonce.clone()), "NodeService/WhoAmI", json!({})));
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a nonce is no bearer token");

    // The control: the browser that asked is signed in, once.
    let (status, me) = asking.redeem(&up);
    assert_eq!((status, me["user"].as_str()), (StatusCode::OK, Some("admin")), "{me}");
    assert!(asking.cookie("kiln_login").is_none(), "the nonce cookie is cleared");
    let session = asking.session();
    let (status, me) = json_of(rpc(&up, &session, "NodeService/WhoAmI", json!({})));
    assert_eq!((status, me["user"].as_str()), (StatusCode::OK, Some("admin")));
    assert!(me["tokenName"].as_str().unwrap().starts_with("ui-session-"), "{me}");
    let mut replaying = Browser {
        cookies: vec![("kiln_login".into(), nonce)],
    };
    let (status, body) = replaying.redeem(&up);
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{body}");
    assert!(body["message"].as_str().unwrap().contains("used already"), "{body}");

    // Logging out revokes the session the login made.
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
fn wrong_replayed_and_disputed_approvals_are_refused_with_what_to_do() {
    let up = Up::start();
    let eve = last_line(&up.kiln(&["user", "create", "eve"]));
    let as_eve = |args: &[&str]| up.kiln_env(args, &[("KILN_TOKEN", eve.as_str())]);
    let refusal = |output: std::process::Output| {
        assert!(!output.status.success(), "approved");
        text(&output.stderr)
    };

    let mut asking = Browser::default();
    let code = asking.ask(&up);
    assert!(refusal(up.kiln(&["ui", "--approve", "hello"])).contains("is not a login code"));
    assert!(up.kiln(&["ui", "--approve", &code]).status.success());
    assert!(refusal(up.kiln(&["ui", "--approve", &code])).contains("is approved already"));
    assert_eq!(asking.redeem(&up).0, StatusCode::OK);
    // Someone else's approval of the same code (a guess, a look at the screen) cancels it: the
    // session it made is revoked, so no one is signed in as the wrong user.
    assert!(refusal(as_eve(&["ui", "--approve", &code])).contains("approved by another user"));
    let (status, _) = json_of(rpc(&up, &asking.session(), "NodeService/WhoAmI", json!({})));
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Guessing: wrong codes run out, and then even the right one is refused.
    let mut asking = Browser::default();
    let code = asking.ask(&up);
    let guesses = [
        "BBBB-BBBB",
        "CCCC-CCCC",
        "DDDD-DDDD",
        "FFFF-FFFF",
        "GGGG-GGGG",
        "HHHH-HHHH",
    ];
    for guess in guesses.iter().filter(|guess| **guess != code).take(5) {
        assert!(refusal(as_eve(&["ui", "--approve", guess])).contains("no login is waiting for code"));
    }
    assert!(refusal(as_eve(&["ui", "--approve", &code])).contains("too many wrong login codes"));
    let (status, body) = asking.redeem(&up);
    assert_eq!(
        (status, body["state"].as_str()),
        (StatusCode::ACCEPTED, Some("waiting"))
    );
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
