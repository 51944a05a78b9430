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

/// A browser's cookies, as the UI's login page uses them: it asks for a login (the api sets its
/// nonce cookie) and redeems it once approved.
#[derive(Default)]
pub struct Browser {
    pub cookies: Vec<(String, String)>,
}

impl Browser {
    pub fn post(&mut self, up: &Up, path: &str) -> Response {
        let mut request = client()
            .post(format!("{}{path}", up.ui_url()))
            .header("x-kiln-csrf", "1")
            .header("user-agent", "kiln-test-browser")
            .body("{}");
        if !self.cookies.is_empty() {
            let cookies: Vec<String> = self
                .cookies
                .iter()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            request = request.header("cookie", cookies.join("; "));
        }
        let response = request.send().unwrap();
        for set in response.headers().get_all("set-cookie") {
            let pair = set.to_str().unwrap().split(';').next().unwrap();
            let (name, value) = pair.split_once('=').unwrap();
            self.cookies.retain(|(kept, _)| kept != name);
            if !value.is_empty() {
                self.cookies.push((name.to_string(), value.to_string()));
            }
        }
        response
    }

    /// Asks for a login; the code the page shows.
    pub fn ask(&mut self, up: &Up) -> String {
        let (status, body) = json_of(self.post(up, "/api/v1/login/pending"));
        assert_eq!(status, StatusCode::OK, "{body}");
        body["code"].as_str().unwrap().to_string()
    }

    pub fn redeem(&mut self, up: &Up) -> (StatusCode, Value) {
        json_of(self.post(up, "/api/v1/login/pending/redeem"))
    }

    pub fn cookie(&self, name: &str) -> Option<String> {
        self.cookies
            .iter()
            .find(|(kept, _)| kept == name)
            .map(|(_, value)| value.clone())
    }

    /// The browser's session, as the HTTP API's tests send it.
    pub fn session(&self) -> Auth {
        Auth::Cookie(format!(
            "kiln_session={}",
            self.cookie("kiln_session").unwrap_or_default()
        ))
    }
}
