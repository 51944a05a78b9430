//! Bearer-token authentication.
//!
//! A token reads `kiln_<id>_<secret>`. The database keeps the id and the SHA-256 of the secret,
//! never the secret. Servers wrap their routes in [`AuthLayer`], which checks the
//! `authorization: Bearer …` header of every call (the health service excepted) against the
//! store on every call (so a revoked or expired token fails at once on every service), applies
//! the part of the method's [`crate::authz`] rule that needs no object, and hands the handler a
//! [`crate::authz::Caller`] through the request extensions; clients add the header with
//! [`BearerInterceptor`]. The one exception is a data path whose calls are each worth less
//! than a database round trip (the predictor's inferences): it checks through a
//! [`CachedVerifier`], which a revocation reaches within its time to live.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use rand::RngCore;
use sha2::{Digest, Sha256};
use tonic::body::Body;
use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

use crate::authz::{Caller, Denied};

/// Who is calling, as established by the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub user_id: String,
    pub user_name: String,
    /// The instance admin; false for an admin's token narrowed to a project.
    pub is_admin: bool,
    pub scope: Scope,
    pub token_id: String,
    pub token_name: String,
    /// The role the token acts with in each project (one project for a narrowed token).
    pub roles: crate::authz::Roles,
    /// The batch whose worker a job's token belongs to.
    pub job_batch_id: Option<String>,
}

/// What a token may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Everything its user may do.
    User,
    /// Only write the logs and metrics of one job (the token a job runs with).
    Job(String),
    /// Nothing: the single-use login URLs of earlier versions (retired by migration 18, which
    /// revoked those left). None is issued now; one still stored is never accepted.
    Login,
}

impl Scope {
    pub fn as_db(&self) -> String {
        match self {
            Scope::User => "user".into(),
            Scope::Job(job_id) => format!("job:{job_id}"),
            Scope::Login => "login".into(),
        }
    }

    pub fn from_db(text: &str) -> Scope {
        match text.strip_prefix("job:") {
            Some(job_id) => Scope::Job(job_id.to_string()),
            None if text == "login" => Scope::Login,
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

/// What a refused token is told: the same for unknown, wrong, revoked, expired and disabled, so
/// a guesser learns nothing.
pub const INVALID_TOKEN: &str =
    "the token is unknown, revoked or expired: make a new one with `kiln token create` (or ask an admin)";

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
            let path = request.uri().path();
            if path.starts_with("/grpc.health.v1.Health/") {
                return inner.call(request).await;
            }
            match authorize(verifier.as_ref(), path, request.headers()).await {
                Ok(caller) => {
                    request.extensions_mut().insert(caller.principal.clone());
                    request.extensions_mut().insert(caller);
                    inner.call(request).await
                }
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}

/// Authenticates a call and applies the part of its method's rule that needs no object.
async fn authorize(verifier: &dyn TokenVerifier, path: &str, headers: &http::HeaderMap) -> Result<Caller, Status> {
    let principal = authenticate(verifier, headers).await?;
    let Some(rule) = crate::authz::rule(path) else {
        return Err(if kiln_proto::RPC_METHODS.contains(&path) {
            Status::permission_denied(format!("{path} has no access rule"))
        } else {
            Status::unimplemented(format!("no method {path}"))
        });
    };
    crate::authz::precheck(&principal, rule).map_err(|denied| denied_status(&denied))?;
    Ok(Caller { principal, rule })
}

/// The status of a refusal (auth errors are not crate errors: they never reach a handler's).
pub fn denied_status(denied: &Denied) -> Status {
    crate::error::status(denied.kind(), denied)
}

/// Authenticates a call by its `authorization: Bearer <token>` header: the principal, or the
/// status to refuse it with (UNAUTHENTICATED, or UNAVAILABLE when the lookup failed).
pub async fn authenticate(verifier: &dyn TokenVerifier, headers: &http::HeaderMap) -> Result<Principal, Status> {
    let header = headers
        .get(http::header::AUTHORIZATION)
        .ok_or_else(|| Status::unauthenticated("missing bearer token: pass `authorization: Bearer <token>` (the CLI reads KILN_TOKEN or ~/.kiln/credentials.toml)"))?;
    let value = header
        .to_str()
        .map_err(|_| Status::unauthenticated("authorization header is not valid text"))?;
    let token = value
        .strip_prefix("Bearer ")
        .ok_or_else(|| Status::unauthenticated("authorization header must read `Bearer <token>`"))?;
    let (id, secret) = parse_token(token.trim()).ok_or_else(|| Status::unauthenticated(INVALID_TOKEN))?;
    match verifier.verify(id, secret).await {
        Ok(Some(principal)) => Ok(principal),
        Ok(None) => Err(Status::unauthenticated(INVALID_TOKEN)),
        Err(message) => {
            tracing::error!(error = %message, "token lookup failed");
            Err(Status::unavailable("cannot check the token right now; retry"))
        }
    }
}

/// The most principals a [`CachedVerifier`] remembers; a full cache starts over.
const CACHED_TOKENS: usize = 10_000;

/// A [`TokenVerifier`] that remembers, for `ttl`, the principals another one accepted, so a
/// hot path checks a token without a database round trip. A revoked or expired token, a
/// disabled user and a changed role reach it within `ttl`; refusals and failed lookups are
/// never remembered. Entries are keyed by the token's id and the SHA-256 of its secret.
pub struct CachedVerifier {
    inner: Arc<dyn TokenVerifier>,
    ttl: Duration,
    entries: Mutex<HashMap<(String, String), (Instant, Principal)>>,
}

impl CachedVerifier {
    pub fn new(inner: Arc<dyn TokenVerifier>, ttl: Duration) -> CachedVerifier {
        CachedVerifier {
            inner,
            ttl,
            entries: Mutex::default(),
        }
    }
}

#[async_trait::async_trait]
impl TokenVerifier for CachedVerifier {
    async fn verify(&self, token_id: &str, secret: &str) -> Result<Option<Principal>, String> {
        let key = (token_id.to_string(), hash_secret(secret));
        if let Some((at, principal)) = self.entries.lock().expect("token cache lock").get(&key)
            && at.elapsed() < self.ttl
        {
            return Ok(Some(principal.clone()));
        }
        let verified = self.inner.verify(token_id, secret).await?;
        let mut entries = self.entries.lock().expect("token cache lock");
        match &verified {
            Some(principal) if !self.ttl.is_zero() => {
                if entries.len() >= CACHED_TOKENS {
                    entries.clear();
                }
                entries.insert(key, (Instant::now(), principal.clone()));
            }
            _ => {
                entries.remove(&key);
            }
        }
        Ok(verified)
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

    /// Accepts `kiln`'s one secret `right` and counts its lookups.
    #[derive(Default)]
    struct Counting {
        lookups: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl TokenVerifier for Counting {
        async fn verify(&self, token_id: &str, secret: &str) -> Result<Option<Principal>, String> {
            self.lookups.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok((secret == "right").then(|| Principal {
                user_id: "u1".into(),
                user_name: "ada".into(),
                is_admin: false,
                scope: Scope::User,
                token_id: token_id.into(),
                token_name: "t".into(),
                roles: Default::default(),
                job_batch_id: None,
            }))
        }
    }

    #[tokio::test]
    async fn a_cached_verifier_remembers_what_was_accepted_for_its_time_to_live_only() {
        let counting = Arc::new(Counting::default());
        let lookups = || counting.lookups.load(std::sync::atomic::Ordering::SeqCst);
        let cached = CachedVerifier::new(counting.clone(), Duration::from_secs(3600));
        for _ in 0..3 {
            assert_eq!(cached.verify("kiln", "right").await.unwrap().unwrap().user_name, "ada");
        }
        assert_eq!(lookups(), 1, "accepted once, then remembered");
        // A wrong secret for the same id is looked up, every time, and refused.
        for _ in 0..2 {
            assert!(cached.verify("kiln", "wrong").await.unwrap().is_none());
        }
        assert_eq!(lookups(), 3);
        // Without a time to live nothing is remembered.
        let uncached = CachedVerifier::new(counting.clone(), Duration::ZERO);
        uncached.verify("kiln", "right").await.unwrap();
        uncached.verify("kiln", "right").await.unwrap();
        assert_eq!(lookups(), 5);
    }

    #[test]
    fn scopes_round_trip() {
        for scope in [Scope::User, Scope::Job("j1".into())] {
            assert_eq!(Scope::from_db(&scope.as_db()), scope);
        }
    }
}
