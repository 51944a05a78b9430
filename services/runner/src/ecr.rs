//! Pulls from Amazon ECR with the instance's role (`[ecr]`): for the registries the config
//! names, a job whose project has no credentials of its own for that registry pulls with an
//! authorization token from ECR's `GetAuthorizationToken`, signed with the credentials of
//! `object_store`'s AWS chain (environment keys, web identity, the instance role through the
//! metadata service at `[imds] endpoint`). The pool's operator grants those registries to every
//! job of the pool by naming them; a project's own `kiln secret set --registry` still wins.
//!
//! A token is kept until five minutes before it expires (ECR's last 12 hours), so a runner asks
//! ECR once per registry account and half-day, not once per pull.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use http::header::CONTENT_TYPE;
use kiln_core::secrets::RegistryCredentials;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, AwsAuthorizer, AwsCredentialProvider};
use object_store::client::{HttpRequest, HttpRequestBody};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::error::{Error, Result};

/// `[ecr]`: the registries pulled through the instance role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct EcrConfig {
    /// Registry hosts as images name them (`123456789012.dkr.ecr.eu-west-1.amazonaws.com`):
    /// every job of this runner may pull their images with the instance role. Empty: none.
    pub registries: Vec<String>,
    /// The ECR API; empty: `https://api.ecr.<region>.amazonaws.com`.
    pub endpoint: String,
    /// The region of the ECR API; empty: the one in the registry's host.
    pub region: String,
}

impl EcrConfig {
    pub fn validate(&self, problems: &mut Vec<String>) {
        for registry in &self.registries {
            if kiln_core::secrets::registry_secret_name(registry).is_err() {
                problems.push(format!("ecr.registries: {registry:?} is not a registry host"));
            } else if self.region.is_empty() && region_of(registry).is_none() {
                problems.push(format!(
                    "ecr.registries: {registry:?} is not ACCOUNT.dkr.ecr.REGION.amazonaws.com: set ecr.region"
                ));
            }
        }
    }
}

/// The region in an ECR registry's host (`ACCOUNT.dkr.ecr.REGION.amazonaws.com[.cn]`).
fn region_of(registry: &str) -> Option<&str> {
    let parts: Vec<&str> = registry.split('.').collect();
    match parts.as_slice() {
        [_, "dkr", "ecr", region, "amazonaws", "com", ..] => Some(region),
        _ => None,
    }
}

impl EcrConfig {
    /// The region of `registry`'s ECR API: `region`, else the registry host's.
    fn region_of<'a>(&'a self, registry: &'a str) -> &'a str {
        match self.region.as_str() {
            "" => region_of(registry).unwrap_or("us-east-1"),
            region => region,
        }
    }
}

/// A token and when to ask again.
struct Token {
    credentials: RegistryCredentials,
    renew_at: std::time::SystemTime,
}

/// ECR's tokens for this runner's registries.
pub struct Ecr {
    config: EcrConfig,
    http: reqwest::Client,
    credentials: AwsCredentialProvider,
    tokens: Mutex<HashMap<String, Token>>,
}

impl Ecr {
    /// `None` when the config names no registry. `imds_endpoint`: the instance's metadata
    /// service, where the role's credentials are read.
    pub fn new(config: &EcrConfig, imds_endpoint: &str) -> Result<Option<Arc<Ecr>>> {
        if config.registries.is_empty() {
            return Ok(None);
        }
        let region = config.region_of(&config.registries[0]);
        let store = AmazonS3Builder::from_env()
            .with_region(region)
            .with_bucket_name("unused")
            .with_config(AmazonS3ConfigKey::MetadataEndpoint, imds_endpoint)
            .build()
            .map_err(|e| Error::Ecr(format!("cannot set up aws credentials: {e}")))?;
        kiln_core::tls::install_default_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| Error::Ecr(format!("cannot build its http client: {e}")))?;
        Ok(Some(Arc::new(Ecr {
            config: config.clone(),
            http,
            credentials: store.credentials().clone(),
            tokens: Mutex::new(HashMap::new()),
        })))
    }

    /// Whether images of `registry` are pulled through the instance role.
    pub fn covers(&self, registry: &str) -> bool {
        self.config.registries.iter().any(|r| r == registry)
    }

    /// The user and password a pull from `registry` gives the engine.
    pub async fn credentials(&self, registry: &str) -> Result<RegistryCredentials> {
        let mut tokens = self.tokens.lock().await;
        if let Some(token) = tokens.get(registry)
            && token.renew_at > std::time::SystemTime::now()
        {
            return Ok(token.credentials.clone());
        }
        let token = self.ask(registry).await.map_err(|why| Error::ImageRefused {
            image: registry.to_string(),
            why: format!("this runner's instance role got no ECR token for {registry}: {why}"),
        })?;
        let credentials = token.credentials.clone();
        tokens.insert(registry.to_string(), token);
        Ok(credentials)
    }

    /// One `GetAuthorizationToken` for `registry`'s account.
    async fn ask(&self, registry: &str) -> std::result::Result<Token, String> {
        let region = self.config.region_of(registry);
        let endpoint = match self.config.endpoint.as_str() {
            "" => format!("https://api.ecr.{region}.amazonaws.com/"),
            endpoint => endpoint.to_string(),
        };
        let account = registry
            .split('.')
            .next()
            .filter(|a| a.len() == 12 && a.bytes().all(|b| b.is_ascii_digit()));
        let body = match account {
            Some(account) => serde_json::json!({"registryIds": [account]}),
            None => serde_json::json!({}),
        }
        .to_string();
        let credential = self
            .credentials
            .get_credential()
            .await
            .map_err(|e| format!("cannot load the instance role's credentials: {e}"))?;
        let mut request: HttpRequest = http::Request::builder()
            .method(http::Method::POST)
            .uri(&endpoint)
            .header(CONTENT_TYPE, "application/x-amz-json-1.1")
            .header(
                "x-amz-target",
                "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken",
            )
            .body(HttpRequestBody::from(body.clone()))
            .map_err(|e| format!("bad ECR endpoint {endpoint}: {e}"))?;
        AwsAuthorizer::new(&credential, "ecr", region)
            .try_authorize(&mut request, None)
            .map_err(|e| format!("cannot sign the call: {e}"))?;
        let response = self
            .http
            .post(&endpoint)
            .headers(request.headers().clone())
            .body(body)
            .send()
            .await
            .map_err(|e| format!("{endpoint}: {}", kiln_formats::error::with_sources(&e)))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| format!("{endpoint}: {e}"))?;
        if !status.is_success() {
            return Err(format!(
                "ECR answered {status}: {}",
                text.chars().take(300).collect::<String>()
            ));
        }
        token_of(&text, std::time::SystemTime::now())
    }
}

/// The first authorization of a `GetAuthorizationToken` answer, kept until five minutes before
/// it expires (not at all when that is past or unsaid).
fn token_of(answer: &str, now: std::time::SystemTime) -> std::result::Result<Token, String> {
    let answer: serde_json::Value =
        serde_json::from_str(answer).map_err(|e| format!("ECR's answer does not read: {e}"))?;
    let data = &answer["authorizationData"][0];
    let encoded = data["authorizationToken"]
        .as_str()
        .ok_or("ECR's answer has no authorizationToken")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or("ECR's token is not base64 of USER:PASSWORD")?;
    let (username, password) = decoded.split_once(':').ok_or("ECR's token is not USER:PASSWORD")?;
    let expires = data["expiresAt"]
        .as_f64()
        .map(|secs| std::time::UNIX_EPOCH + Duration::from_secs_f64(secs.max(0.0)));
    let renew_at = expires
        .and_then(|at| at.checked_sub(Duration::from_secs(300)))
        .unwrap_or(now);
    Ok(Token {
        credentials: RegistryCredentials {
            username: username.to_string(),
            password: password.to_string(),
        },
        renew_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registry_host_names_its_region_and_others_need_one() {
        assert_eq!(
            region_of("123456789012.dkr.ecr.eu-west-1.amazonaws.com"),
            Some("eu-west-1")
        );
        assert_eq!(
            region_of("123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn"),
            Some("cn-north-1")
        );
        assert_eq!(region_of("127.0.0.1:5000"), None);
        let mut problems = Vec::new();
        EcrConfig {
            registries: vec!["127.0.0.1:5000".into(), "Not A Host".into()],
            ..Default::default()
        }
        .validate(&mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("set ecr.region"), "{problems:?}");
    }

    #[test]
    fn a_token_is_kept_until_five_minutes_before_it_expires() {
        let token = base64::engine::general_purpose::STANDARD.encode("AWS:secret-pass");
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let answer = serde_json::json!({"authorizationData": [{
            "authorizationToken": token, "expiresAt": 1_000_000.0 + 12.0 * 3600.0,
            "proxyEndpoint": "https://123456789012.dkr.ecr.us-east-1.amazonaws.com"}]});
        let kept = token_of(&answer.to_string(), now).unwrap();
        assert_eq!(
            (kept.credentials.username.as_str(), kept.credentials.password.as_str()),
            ("AWS", "secret-pass")
        );
        assert_eq!(kept.renew_at, now + Duration::from_secs(12 * 3600 - 300));
        // Expired already (moto's tokens are of 2015): not kept.
        let answer = serde_json::json!({"authorizationData": [{"authorizationToken": token, "expiresAt": 1.4e9}]});
        assert!(
            token_of(&answer.to_string(), std::time::SystemTime::now())
                .unwrap()
                .renew_at
                < std::time::SystemTime::now()
        );
        assert!(token_of("{}", now).is_err());
    }
}
