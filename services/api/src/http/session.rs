//! Who calls over HTTP: the session cookie (set by a login with a token, or by a login the
//! browser asked for and a user approved with `kiln ui`), else a bearer header; and the checks
//! that keep another site's pages from making a signed-in browser call (CSRF).

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kiln_core::auth::parse_token;
use kiln_core::store::logins::SESSION_TOKEN_PREFIX;
use tonic::Status;

use super::transcode::Shape;
use super::{Gateway, status_response};

/// The cookie that holds a browser's token.
pub const COOKIE: &str = "kiln_session";

/// The header every write must carry: a cross-site form cannot set it, and no CORS lets a
/// cross-site script set it either.
pub const CSRF_HEADER: &str = "x-kiln-csrf";

/// The value of the cookie `name`, when the request has a non-empty one.
pub(super) fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(found, _)| *found == name)
        .map(|(_, value)| value.to_string())
        .filter(|value| !value.is_empty())
}

/// The caller's token: the session cookie, else `Authorization: Bearer`.
pub fn token(headers: &HeaderMap) -> Result<String, Status> {
    if let Some(token) = cookie_value(headers, COOKIE) {
        return Ok(token);
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(|token| token.trim().to_string())
        .ok_or_else(|| {
            Status::unauthenticated("not signed in: log in at /login, or pass `Authorization: Bearer <token>`")
        })
}

/// Refuses a write another site could have sent: it must carry [`CSRF_HEADER`], and its
/// `Origin`, when the browser sends one, must be this server.
pub fn check_csrf(headers: &HeaderMap) -> Result<(), Status> {
    if headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()) != Some("1") {
        return Err(Status::permission_denied(format!(
            "a write must carry the header `{CSRF_HEADER}: 1`"
        )));
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let authority = origin
        .to_str()
        .ok()
        .and_then(|origin| origin.split_once("://"))
        .map(|(_, authority)| authority);
    match (authority, host) {
        (Some(authority), Some(host)) if authority.eq_ignore_ascii_case(host) => Ok(()),
        _ => Err(Status::permission_denied("a write from another origin is refused")),
    }
}

/// `POST /api/v1/login` with `{"token": "..."}`: checks the token and keeps it in the cookie.
pub async fn login(
    State(gateway): State<std::sync::Arc<Gateway>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    #[derive(serde::Deserialize)]
    struct Login {
        token: String,
    }
    let signed_in = async {
        check_csrf(&headers)?;
        let login: Login = serde_json::from_slice(&body)
            .map_err(|error| Status::invalid_argument(format!("expected {{\"token\": \"...\"}}: {error}")))?;
        let token = login.token.trim().to_string();
        let who = gateway
            .transcoder
            .call("NodeService", "WhoAmI", Shape::Unary)?
            .unary(&token, b"{}")
            .await?;
        Ok::<_, Status>((token, who))
    };
    match signed_in.await {
        Ok((token, who)) => {
            let cookie = gateway.cookie(COOKIE, &token, "/", None);
            ([(header::SET_COOKIE, cookie)], super::json_response(who)).into_response()
        }
        Err(status) => status_response(status),
    }
}

/// `POST /api/v1/logout`: clears the cookie, and revokes the token when a `kiln ui` login made it.
pub async fn logout(State(gateway): State<std::sync::Arc<Gateway>>, headers: HeaderMap) -> Response {
    if let Err(status) = check_csrf(&headers) {
        return status_response(status);
    }
    if let Ok(token) = token(&headers)
        && let Some((id, secret)) = parse_token(&token)
        && let Ok(Some(principal)) = gateway.store.verify_token(id, secret).await
        && principal.token_name.starts_with(SESSION_TOKEN_PREFIX)
        && let Err(error) = gateway.store.revoke_token(id).await
    {
        tracing::warn!(error = %error, "cannot revoke a session token at logout");
    }
    let cleared = format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    (
        StatusCode::NO_CONTENT,
        [(
            header::SET_COOKIE,
            HeaderValue::from_str(&cleared).expect("a plain cookie"),
        )],
    )
        .into_response()
}

impl Gateway {
    /// The cookie `name` that keeps `value` for `path`: HttpOnly, SameSite=Strict, Secure over
    /// HTTPS; for the browser's session, or `max_age_secs`.
    pub(super) fn cookie(&self, name: &str, value: &str, path: &str, max_age_secs: Option<i64>) -> HeaderValue {
        let mut cookie = format!("{name}={value}; HttpOnly; SameSite=Strict; Path={path}");
        if let Some(secs) = max_age_secs {
            cookie.push_str(&format!("; Max-Age={secs}"));
        }
        if self.secure {
            cookie.push_str("; Secure");
        }
        HeaderValue::from_str(&cookie).expect("a token or nonce is printable ASCII")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn the_cookie_wins_over_the_bearer_header() {
        let both = headers(&[
            ("cookie", "a=b; kiln_session=kiln_x_y"),
            ("authorization", "Bearer kiln_z"),
        ]);
        assert_eq!(token(&both).unwrap(), "kiln_x_y");
        assert_eq!(
            token(&headers(&[("authorization", "Bearer kiln_z")])).unwrap(),
            "kiln_z"
        );
        assert_eq!(token(&headers(&[])).unwrap_err().code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn writes_need_the_header_and_this_origin() {
        let host = ("host", "127.0.0.1:7079");
        assert!(check_csrf(&headers(&[host, (CSRF_HEADER, "1")])).is_ok());
        assert!(
            check_csrf(&headers(&[
                host,
                (CSRF_HEADER, "1"),
                ("origin", "http://127.0.0.1:7079")
            ]))
            .is_ok()
        );
        for refused in [
            headers(&[host]),
            headers(&[host, (CSRF_HEADER, "0")]),
            headers(&[host, (CSRF_HEADER, "1"), ("origin", "http://evil.example")]),
            headers(&[host, (CSRF_HEADER, "1"), ("origin", "null")]),
        ] {
            assert_eq!(check_csrf(&refused).unwrap_err().code(), tonic::Code::PermissionDenied);
        }
    }
}
