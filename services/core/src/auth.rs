//! Bearer-token authentication.
//!
//! A token reads `kiln_<id>_<secret>`. The database keeps the id and the SHA-256 of the secret,
//! never the secret. Servers wrap their routes in [`AuthLayer`], which checks the
//! `authorization: Bearer …` header of every call (the health service excepted) and hands the
//! [`Principal`] to the handler through the request extensions; clients add the header with
//! [`BearerInterceptor`].

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rand::RngCore;
use sha2::{Digest, Sha256};
use tonic::body::Body;
use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

/// Who is calling, as established by the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub user_id: String,
    pub user_name: String,
    pub is_admin: bool,
    pub scope: Scope,
}

/// What a token may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Everything its user may do.
    User,
    /// Only write the logs and metrics of one job (the token a job runs with).
    Job(String),
}

impl Scope {
    pub fn as_db(&self) -> String {
        match self {
            Scope::User => "user".into(),
            Scope::Job(job_id) => format!("job:{job_id}"),
        }
    }

    pub fn from_db(text: &str) -> Scope {
        match text.strip_prefix("job:") {
            Some(job_id) => Scope::Job(job_id.to_string()),
            None => Scope::User,
        }
    }
}

/// A newly issued token: the text handed to its owner once, and what the database keeps.
#[derive(Clone)]
pub struct IssuedToken {
    pub id: String,
    pub secret_sha256: String,
    pub token: String,
}

/// Issues a fresh random token.
pub fn issue_token() -> IssuedToken {
    let mut rng = rand::rng();
    let mut id = [0u8; 8];
    let mut secret = [0u8; 32];
    rng.fill_bytes(&mut id);
    rng.fill_bytes(&mut secret);
    let id = hex::encode(id);
    let secret = hex::encode(secret);
    IssuedToken {
        token: format!("kiln_{id}_{secret}"),
        secret_sha256: hash_secret(&secret),
        id,
    }
}

/// Splits a token into its id and secret.
pub fn parse_token(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix("kiln_")?;
    let (id, secret) = rest.split_once('_')?;
    let well_formed =
        id.len() == 16 && secret.len() == 64 && id.bytes().chain(secret.bytes()).all(|b| b.is_ascii_hexdigit());
    well_formed.then_some((id, secret))
}

pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Compares two strings in time independent of where they differ.
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// TokenVerifier looks a token up; the store implements it.
#[async_trait::async_trait]
pub trait TokenVerifier: Send + Sync + 'static {
    /// Returns the principal of a valid token, `None` for an unknown, revoked or wrong one, and
    /// an error when the lookup itself failed.
    async fn verify(&self, token_id: &str, secret: &str) -> Result<Option<Principal>, String>;
}

/// Returns the principal the auth layer established for this call.
pub fn principal<T>(request: &Request<T>) -> Result<Principal, Status> {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("missing credentials"))
}

/// Requires a user token (not a job-scoped one).
pub fn user_principal<T>(request: &Request<T>) -> Result<Principal, Status> {
    let principal = principal(request)?;
    match principal.scope {
        Scope::User => Ok(principal),
        Scope::Job(_) => Err(Status::permission_denied(
            "a job token may only write its own job's logs and metrics",
        )),
    }
}

// === impl AuthLayer ===

/// AuthLayer authenticates every gRPC call before it reaches a service.
#[derive(Clone)]
pub struct AuthLayer {
    verifier: Arc<dyn TokenVerifier>,
}

impl AuthLayer {
    pub fn new(verifier: Arc<dyn TokenVerifier>) -> Self {
        AuthLayer { verifier }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            verifier: self.verifier.clone(),
        }
    }
}

/// The service [`AuthLayer`] wraps around the routes.
#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    verifier: Arc<dyn TokenVerifier>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S> tower::Service<http::Request<Body>> for AuthService<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // The clone that was polled ready is the one that must serve the call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let verifier = self.verifier.clone();
        Box::pin(async move {
            if request.uri().path().starts_with("/grpc.health.v1.Health/") {
                return inner.call(request).await;
            }
            match authenticate(verifier.as_ref(), request.headers()).await {
                Ok(principal) => {
                    request.extensions_mut().insert(principal);
                    inner.call(request).await
                }
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}

async fn authenticate(verifier: &dyn TokenVerifier, headers: &http::HeaderMap) -> Result<Principal, Status> {
    let header = headers
        .get(http::header::AUTHORIZATION)
        .ok_or_else(|| Status::unauthenticated("missing bearer token: pass `authorization: Bearer <token>` (the CLI reads KILN_TOKEN or ~/.kiln/credentials.toml)"))?;
    let value = header
        .to_str()
        .map_err(|_| Status::unauthenticated("authorization header is not valid text"))?;
    let token = value
        .strip_prefix("Bearer ")
        .ok_or_else(|| Status::unauthenticated("authorization header must read `Bearer <token>`"))?;
    let (id, secret) = parse_token(token.trim()).ok_or_else(|| Status::unauthenticated("invalid token"))?;
    match verifier.verify(id, secret).await {
        Ok(Some(principal)) => Ok(principal),
        Ok(None) => Err(Status::unauthenticated("invalid token")),
        Err(message) => {
            tracing::error!(error = %message, "token lookup failed");
            Err(Status::unavailable("cannot check the token right now; retry"))
        }
    }
}

// === impl BearerInterceptor ===

/// BearerInterceptor adds the token to every call of a client.
#[derive(Clone)]
pub struct BearerInterceptor {
    header: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl BearerInterceptor {
    pub fn new(token: &str) -> Self {
        BearerInterceptor {
            header: format!("Bearer {token}").parse().ok(),
        }
    }
}

impl tonic::service::Interceptor for BearerInterceptor {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(header) = &self.header {
            request.metadata_mut().insert("authorization", header.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_tokens_parse_and_hash() {
        let issued = issue_token();
        let (id, secret) = parse_token(&issued.token).unwrap();
        assert_eq!(id, issued.id);
        assert!(constant_time_eq(&hash_secret(secret), &issued.secret_sha256));
        assert!(!issued.secret_sha256.contains(secret));
    }

    #[test]
    fn malformed_tokens_are_rejected() {
        for bad in ["", "kiln_", "kiln_abc_def", "bearer", "kiln_zzzzzzzzzzzzzzzz_00"] {
            assert!(parse_token(bad).is_none(), "{bad}");
        }
        assert!(!constant_time_eq("abc", "abd"));
        assert!(!constant_time_eq("abc", "ab"));
    }

    #[test]
    fn scopes_round_trip() {
        for scope in [Scope::User, Scope::Job("j1".into())] {
            assert_eq!(Scope::from_db(&scope.as_db()), scope);
        }
    }
}
