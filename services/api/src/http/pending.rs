//! Logins the browser asks for and a user approves from the CLI (`kiln ui`; the store's side is
//! kiln_core::store::logins). The browser gets a code to show and a nonce in a cookie that only
//! it sends back, to these routes alone; only it can redeem the login once a user approved the
//! code, so a link or code opened by another browser signs nothing in.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{AppendHeaders, IntoResponse, Response};
use kiln_core::store::logins::Redemption;
use tonic::Status;

use super::session::{COOKIE, check_csrf, cookie_value};
use super::transcode::Shape;
use super::{Gateway, status_response};

/// The cookie that holds the nonce of the login a browser asked for.
pub const LOGIN_COOKIE: &str = "kiln_login";

/// Where [`LOGIN_COOKIE`] is sent: the pending login's routes, nowhere else.
const LOGIN_COOKIE_PATH: &str = "/api/v1/login/pending";

/// `POST /api/v1/login/pending`: the browser asks for a login that a user approves from the CLI
/// (`kiln ui`). It gets the code to show, and the nonce in an HttpOnly cookie that only this
/// browser sends back (store/logins.rs).
pub async fn begin(State(gateway): State<std::sync::Arc<Gateway>>, headers: HeaderMap) -> Response {
    if let Err(status) = check_csrf(&headers) {
        return status_response(status);
    }
    let user_agent = headers
        .get(header::USER_AGENT)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    match gateway.store.begin_login(user_agent).await {
        Ok(pending) => {
            let max_age_secs = (pending.expires_at_ms - kiln_core::ids::now_ms() + 999) / 1000;
            let cookie = gateway.cookie(LOGIN_COOKIE, &pending.nonce, LOGIN_COOKIE_PATH, Some(max_age_secs));
            let body = serde_json::json!({ "code": pending.code, "expiresAtMs": pending.expires_at_ms });
            (
                [(header::SET_COOKIE, cookie)],
                super::json_response(body.to_string().into_bytes()),
            )
                .into_response()
        }
        Err(error) => status_response(kiln_core::error::status(error.kind(), &error)),
    }
}

/// `POST /api/v1/login/pending/redeem`: the browser that asked for a login redeems it with its
/// nonce cookie: 202 and `{"state": "waiting"}` until a user approves its code, then its session
/// cookie and the `WhoAmIResponse` of the approving user. Without the cookie (another browser),
/// or once used, expired or disputed, it is refused with a message that says what to do.
pub async fn redeem(State(gateway): State<std::sync::Arc<Gateway>>, headers: HeaderMap) -> Response {
    enum Answer {
        Waiting { expires_at_ms: i64 },
        SignedIn { token: String, who: Vec<u8> },
    }
    let answer = async {
        check_csrf(&headers)?;
        let nonce = cookie_value(&headers, LOGIN_COOKIE).unwrap_or_default();
        let redemption = gateway
            .store
            .redeem_login(&nonce, gateway.session_ms)
            .await
            .map_err(|error| kiln_core::error::status(error.kind(), &error))?;
        let session = match redemption {
            Redemption::Waiting { expires_at_ms } => return Ok(Answer::Waiting { expires_at_ms }),
            Redemption::SignedIn(session) => session,
        };
        let who = gateway
            .transcoder
            .call("NodeService", "WhoAmI", Shape::Unary)?
            .unary(&session.token, b"{}")
            .await?;
        Ok::<_, Status>(Answer::SignedIn {
            token: session.token,
            who,
        })
    };
    match answer.await {
        Ok(Answer::SignedIn { token, who }) => {
            let session = gateway.cookie(COOKIE, &token, "/", Some(gateway.session_ms / 1000));
            let used = gateway.cookie(LOGIN_COOKIE, "", LOGIN_COOKIE_PATH, Some(0));
            (
                AppendHeaders([(header::SET_COOKIE, session), (header::SET_COOKIE, used)]),
                super::json_response(who),
            )
                .into_response()
        }
        Ok(Answer::Waiting { expires_at_ms }) => {
            let body = serde_json::json!({ "state": "waiting", "expiresAtMs": expires_at_ms });
            (
                StatusCode::ACCEPTED,
                super::json_response(body.to_string().into_bytes()),
            )
                .into_response()
        }
        Err(status) => status_response(status),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::Request;
    use kiln_core::auth::{AuthLayer, Principal, parse_token};
    use kiln_core::store::Store;
    use tower::ServiceExt;

    use super::*;
    use crate::http::transcode::{Transcoder, Upstream};
    use crate::http::{Files, router};

    /// The HTTP side on a fresh SQLite store, answering `NodeService` in-process as the api
    /// does; and the admin, who approves logins.
    async fn serve(dir: &std::path::Path) -> (axum::Router, Store, Principal) {
        let store = Store::connect(&kiln_core::testing::sqlite_config(dir)).await.unwrap();
        store.migrate().await.unwrap();
        let admin = store.bootstrap_admin().await.unwrap().unwrap();
        let (id, secret) = parse_token(&admin.token).unwrap();
        let admin = store.verify_token(id, secret).await.unwrap().unwrap();
        let node = tower::ServiceBuilder::new()
            .map_err(|never: std::convert::Infallible| -> Status { match never {} })
            .layer(AuthLayer::new(Arc::new(store.clone())))
            .service(tonic::service::Routes::new(
                kiln_core::whoami::NodeApi::new("api").server(),
            ));
        let gateway = Gateway {
            transcoder: Transcoder::new(HashMap::from([("NodeService".to_string(), Upstream::new(node))])),
            store: store.clone(),
            session_ms: 3_600_000,
            secure: false,
            files: Files::Missing,
        };
        (router(Arc::new(gateway)), store, admin)
    }

    /// A browser: the cookies it was given (by name), sent back with each call.
    #[derive(Default)]
    struct Browser {
        cookies: HashMap<String, String>,
    }

    struct Answer {
        status: StatusCode,
        /// Each Set-Cookie in full.
        set_cookies: Vec<String>,
        body: serde_json::Value,
    }

    impl Browser {
        async fn post(&mut self, app: &axum::Router, path: &str) -> Answer {
            let cookies: Vec<String> = self
                .cookies
                .iter()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            let mut request = Request::post(path)
                .header("host", "127.0.0.1:7079")
                .header("origin", "http://127.0.0.1:7079")
                .header(super::super::session::CSRF_HEADER, "1")
                .header("user-agent", "Firefox/140");
            if !cookies.is_empty() {
                request = request.header("cookie", cookies.join("; "));
            }
            let response = app
                .clone()
                .oneshot(request.body(Body::from("{}")).unwrap())
                .await
                .unwrap();
            let status = response.status();
            let set_cookies: Vec<String> = response
                .headers()
                .get_all(header::SET_COOKIE)
                .iter()
                .map(|value| value.to_str().unwrap().to_string())
                .collect();
            for set in &set_cookies {
                let (name, value) = set.split(';').next().unwrap().split_once('=').unwrap();
                if value.is_empty() {
                    self.cookies.remove(name);
                } else {
                    self.cookies.insert(name.to_string(), value.to_string());
                }
            }
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
            let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            Answer {
                status,
                set_cookies,
                body,
            }
        }

        /// Asks for a login; the code its page shows.
        async fn ask(&mut self, app: &axum::Router) -> String {
            let asked = self.post(app, "/api/v1/login/pending").await;
            assert_eq!(asked.status, StatusCode::OK, "{}", asked.body);
            asked.body["code"].as_str().unwrap().to_string()
        }

        async fn redeem(&mut self, app: &axum::Router) -> Answer {
            self.post(app, "/api/v1/login/pending/redeem").await
        }
    }

    #[tokio::test]
    async fn a_login_approved_for_one_browser_signs_no_other_browser_in() {
        let dir = tempfile::tempdir().unwrap();
        let (app, store, admin) = serve(dir.path()).await;
        let mut asking = Browser::default();
        let code = asking.ask(&app).await;
        assert!(asking.cookies.contains_key(LOGIN_COOKIE));
        assert_eq!(
            asking.redeem(&app).await.status,
            StatusCode::ACCEPTED,
            "waiting for approval"
        );
        store.approve_login(&admin, &code).await.unwrap();

        // The attack: the approved login, redeemed by a browser that did not ask for it (a link
        // passed on, a page opened elsewhere), or by one that asked for a login of its own.
        let mut finder = Browser::default();
        let refused = finder.redeem(&app).await;
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{}", refused.body);
        assert!(refused.set_cookies.is_empty(), "{:?}", refused.set_cookies);
        assert!(
            refused.body["message"]
                .as_str()
                .unwrap()
                .contains("this browser has no login waiting"),
            "{}",
            refused.body
        );
        let mut other = Browser::default();
        other.ask(&app).await;
        let waiting = other.redeem(&app).await;
        assert_eq!(
            (waiting.status, waiting.body["state"].as_str()),
            (StatusCode::ACCEPTED, Some("waiting"))
        );
        assert!(!other.cookies.contains_key(COOKIE));
        // Nor does a link carry anything: the old single-use URL is gone.
        let link = Request::get("/api/v1/login/code?code=kiln_0000000000000000_00")
            .body(Body::empty())
            .unwrap();
        assert_eq!(app.clone().oneshot(link).await.unwrap().status(), StatusCode::NOT_FOUND);

        // The control: the browser that asked gets its session, once.
        let nonce = asking.cookies[LOGIN_COOKIE].clone();
        let signed_in = asking.redeem(&app).await;
        assert_eq!(
            (signed_in.status, signed_in.body["user"].as_str()),
            (StatusCode::OK, Some("admin"))
        );
        let session = signed_in
            .set_cookies
            .iter()
            .find(|set| set.starts_with("kiln_session="))
            .unwrap();
        assert!(
            session.contains("HttpOnly") && session.contains("SameSite=Strict") && session.contains("Max-Age=3600")
        );
        assert!(
            !asking.cookies.contains_key(LOGIN_COOKIE),
            "the nonce cookie is cleared"
        );
        let me = asking.post(&app, "/api/v1/rpc/NodeService/WhoAmI").await;
        assert_eq!((me.status, me.body["user"].as_str()), (StatusCode::OK, Some("admin")));
        let replay = asking.redeem(&app).await;
        assert_eq!(
            replay.status,
            StatusCode::UNAUTHORIZED,
            "its nonce cookie is gone: {}",
            replay.body
        );
        // A copy of the used nonce (kept, or stolen) is refused too.
        let mut thief = Browser::default();
        thief.cookies.insert(LOGIN_COOKIE.into(), nonce);
        let replay = thief.redeem(&app).await;
        assert_eq!(replay.status, StatusCode::PRECONDITION_FAILED, "{}", replay.body);
        assert!(
            replay.body["message"].as_str().unwrap().contains("used already"),
            "{}",
            replay.body
        );
        assert!(!thief.cookies.contains_key(COOKIE));
    }

    #[tokio::test]
    async fn a_login_is_asked_for_with_a_strict_narrow_cookie_and_csrf_proof() {
        let dir = tempfile::tempdir().unwrap();
        let (app, _store, _admin) = serve(dir.path()).await;
        let mut browser = Browser::default();
        let asked = browser.post(&app, "/api/v1/login/pending").await;
        assert_eq!(asked.status, StatusCode::OK);
        let code = asked.body["code"].as_str().unwrap();
        assert_eq!((code.len(), &code[4..5]), (9, "-"), "{code}");
        let [nonce] = asked.set_cookies.as_slice() else {
            panic!("one cookie: {:?}", asked.set_cookies)
        };
        for attribute in [
            "HttpOnly",
            "SameSite=Strict",
            "Path=/api/v1/login/pending",
            "Max-Age=300",
        ] {
            assert!(nonce.contains(attribute), "{nonce} lacks {attribute}");
        }
        // Another site's page can neither ask for a login nor redeem one.
        let nonce = &browser.cookies[LOGIN_COOKIE];
        for path in ["/api/v1/login/pending", "/api/v1/login/pending/redeem"] {
            let request = Request::post(path)
                .header("host", "127.0.0.1:7079")
                .header("cookie", format!("{LOGIN_COOKIE}={nonce}"))
                .body(Body::from("{}"))
                .unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            assert_eq!(
                response.status(),
                StatusCode::FORBIDDEN,
                "{path} without the CSRF header"
            );
        }
    }
}
