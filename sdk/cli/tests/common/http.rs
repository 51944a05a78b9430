//! What the HTTP API's tests share: a client, calls as the web UI makes them, and how a request
//! proves who sends it.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::blocking::{Client, RequestBuilder, Response};
use serde_json::Value;

use super::{Up, last_line};

pub fn client() -> Client {
    Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// A call of the HTTP API, as the UI makes it.
pub fn rpc(up: &Up, auth: &Auth, method: &str, body: Value) -> Response {
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
pub enum Auth {
    Bearer(String),
    Cookie(String),
    Nobody,
}

impl Auth {
    pub fn apply(&self, request: RequestBuilder) -> RequestBuilder {
        match self {
            Auth::Bearer(token) => request.bearer_auth(token),
            Auth::Cookie(cookie) => request.header("cookie", cookie),
            Auth::Nobody => request,
        }
    }
}

pub fn json_of(response: Response) -> (StatusCode, Value) {
    let status = response.status();
    let body = response.text().unwrap();
    (
        status,
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}")),
    )
}

/// The `name=value` of a response's Set-Cookie, and its attributes.
pub fn set_cookie(response: &Response) -> (String, String) {
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

/// Runs `script` as a job with `sh -c` and waits until it SUCCEEDED; its id.
pub fn succeeded_job(up: &Up, script: &str) -> String {
    let job = last_line(&up.kiln(&["run", "--no-code", "--", "sh", "-c", script]));
    up.wait_for_state(&job, "SUCCEEDED");
    job
}
