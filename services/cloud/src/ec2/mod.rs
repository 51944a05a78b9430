//! EC2 behind the [`Cloud`] trait: a hand-rolled client of the Query API (version 2016-11-15)
//! for the eight actions kiln calls (docs/provisioner.md, section 10).
//!
//! - `client`: signed form POSTs (SigV4 by `object_store`), AWS's error document, retries;
//! - `params` and `xml`: the request bodies and the answers' serde structs;
//! - `codes`: what an error code means (a [`CloudError`], or an offering's [`crate::Unavailable`]);
//! - `fleet`, `instances`, `offerings`: the trait's calls; `prices`: the on-demand table.
//!
//! One [`Ec2Cloud`] serves one region (the provisioner makes one per region its pools name).

mod client;
mod codes;
mod fleet;
mod instances;
mod offerings;
mod params;
mod prices;
mod xml;

use std::sync::Mutex;

use object_store::StaticCredentialProvider;
use object_store::aws::{AmazonS3Builder, AwsCredential, AwsCredentialProvider};
use serde::{Deserialize, Serialize};
use tracing::warn;

pub use codes::quota_bucket;
pub use prices::OnDemandTable;

use self::client::{CallError, QueryClient, Resend};
use self::offerings::OfferingCache;
use crate::{Cloud, CloudError, CloudInstance, InstanceId, LaunchIntent, Launched, Offering, PoolSpec, TagSelector};

/// `[ec2]` of the provisioner's config: the region, an endpoint override, and the client's
/// timings (tests shorten them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct Ec2Config {
    pub region: String,
    /// `https://ec2.<region>.amazonaws.com/` unless set (moto, the fault proxy, a VPC endpoint).
    pub endpoint: Option<String>,
    pub connect_timeout_ms: u64,
    /// The whole call, answer included: past it a sent call is ambiguous.
    pub request_timeout_ms: u64,
    /// Full-jitter backoff of throttled and unavailable calls: base, cap, attempts in all.
    pub retry_base_ms: u64,
    pub retry_cap_ms: u64,
    pub max_attempts: u32,
    /// `MaxResults` of `DescribeInstances` (5..=1000).
    pub page_size: u32,
    pub types_ttl_secs: u64,
    pub offerings_ttl_secs: u64,
    pub spot_prices_ttl_secs: u64,
}

impl Default for Ec2Config {
    fn default() -> Ec2Config {
        Ec2Config {
            region: "us-east-1".to_owned(),
            endpoint: None,
            connect_timeout_ms: 5_000,
            request_timeout_ms: 30_000,
            retry_base_ms: 1_000,
            retry_cap_ms: 30_000,
            max_attempts: 3,
            page_size: 1000,
            types_ttl_secs: 24 * 3600,
            offerings_ttl_secs: 300,
            spot_prices_ttl_secs: 300,
        }
    }
}

impl Ec2Config {
    /// The URL calls are POSTed to.
    pub fn endpoint_url(&self) -> String {
        match &self.endpoint {
            Some(endpoint) => endpoint.clone(),
            None if self.region.starts_with("cn-") => format!("https://ec2.{}.amazonaws.com.cn/", self.region),
            None => format!("https://ec2.{}.amazonaws.com/", self.region),
        }
    }

    /// Every problem of the section, each naming its key.
    pub fn validate(&self, problems: &mut Vec<String>) {
        if self.region.is_empty() {
            problems.push("ec2.region: required".into());
        }
        if let Some(endpoint) = &self.endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            problems.push(format!(
                "ec2.endpoint: must start with http:// or https://, got {endpoint:?}"
            ));
        }
        if self.max_attempts == 0 {
            problems.push("ec2.max-attempts: must be at least 1".into());
        }
        if !(5..=1000).contains(&self.page_size) {
            problems.push(format!(
                "ec2.page-size: must be within 5..=1000, got {}",
                self.page_size
            ));
        }
    }
}

/// EC2 in one region.
pub struct Ec2Cloud {
    config: Ec2Config,
    client: QueryClient,
    cache: Mutex<OfferingCache>,
}

impl Ec2Cloud {
    /// Credentials from `object_store`'s AWS chain: environment keys (and session token), web
    /// identity, ECS/EKS container credentials, the instance role through IMDSv2 (refreshed
    /// before expiry). No profile files: export keys on a laptop.
    pub fn from_env(config: Ec2Config) -> Result<Ec2Cloud, CloudError> {
        let store = AmazonS3Builder::from_env()
            .with_region(&config.region)
            .with_bucket_name("unused")
            .build()
            .map_err(|e| CloudError::Invalid(format!("cannot set up aws credentials: {e}")))?;
        let credentials = store.credentials().clone();
        Ec2Cloud::with_credentials(config, credentials)
    }

    /// Fixed keys (tests, and callers with their own source).
    pub fn with_static_credentials(
        config: Ec2Config,
        key_id: &str,
        secret_key: &str,
        token: Option<String>,
    ) -> Result<Ec2Cloud, CloudError> {
        let credential = AwsCredential {
            key_id: key_id.to_owned(),
            secret_key: secret_key.to_owned(),
            token,
        };
        Ec2Cloud::with_credentials(config, std::sync::Arc::new(StaticCredentialProvider::new(credential)))
    }

    pub fn with_credentials(config: Ec2Config, credentials: AwsCredentialProvider) -> Result<Ec2Cloud, CloudError> {
        let mut problems = Vec::new();
        config.validate(&mut problems);
        if !problems.is_empty() {
            return Err(CloudError::Invalid(problems.join("; ")));
        }
        let client = QueryClient::new(&config, credentials)?;
        Ok(Ec2Cloud {
            config,
            client,
            cache: Mutex::new(OfferingCache::default()),
        })
    }

    pub fn config(&self) -> &Ec2Config {
        &self.config
    }

    pub fn endpoint(&self) -> &str {
        self.client.endpoint()
    }
}

#[async_trait::async_trait]
impl Cloud for Ec2Cloud {
    fn name(&self) -> &'static str {
        "ec2"
    }

    async fn create(&self, intent: &LaunchIntent) -> Result<Launched, CloudError> {
        let params = fleet::params(intent)?;
        let launched = match self.client.call(&params, Resend::Never).await {
            Ok(body) => {
                // The fleet exists when EC2 answered 200: an unreadable answer is ambiguous.
                let answer = xml::parse("CreateFleet", &body).map_err(|e| CloudError::Ambiguous(e.to_string()))?;
                fleet::launched(intent, answer)?
            }
            Err(CallError::Api { code, message, .. }) if codes::is_capacity(&code) => {
                fleet::all_failed(intent, &code, &message)
            }
            Err(error) => return Err(error.into_cloud()),
        };
        let count = launched.instances.len() as u32;
        if !fleet::minimum_sent(intent) && count > 0 && count < intent.min_count {
            // AWS holds a minimum only within one zone or one type; elsewhere kiln does.
            warn!(intent = %intent.id, count, min_count = intent.min_count, "fewer instances than the intent's minimum: terminating them");
            let ids: Vec<InstanceId> = launched.instances.iter().map(|i| i.id.clone()).collect();
            instances::terminate(&self.client, &ids).await?;
            return Ok(Launched {
                instances: Vec::new(),
                failures: launched.failures,
            });
        }
        Ok(launched)
    }

    async fn get(&self, id: &InstanceId) -> Result<Option<CloudInstance>, CloudError> {
        instances::get(&self.client, id).await
    }

    async fn list(&self, selector: &TagSelector) -> Result<Vec<CloudInstance>, CloudError> {
        instances::list(&self.client, selector, self.config.page_size).await
    }

    async fn terminate(&self, ids: &[InstanceId]) -> Result<(), CloudError> {
        instances::terminate(&self.client, ids).await
    }

    async fn offerings(&self, pool: &PoolSpec) -> Result<Vec<Offering>, CloudError> {
        offerings::offerings(&self.client, &self.config, &self.cache, pool).await
    }
}

#[cfg(feature = "test-util")]
impl Ec2Cloud {
    /// Creates a launch template with an image (test setup through the signed client); its id.
    pub async fn create_launch_template(&self, name: &str, image_id: &str) -> Result<String, CloudError> {
        self.create_launch_template_with(name, image_id, None).await
    }

    /// Creates a launch template with an image and user data (base64, as EC2 takes it).
    pub async fn create_launch_template_with(
        &self,
        name: &str,
        image_id: &str,
        user_data_base64: Option<&str>,
    ) -> Result<String, CloudError> {
        let mut params = params::Params::new("CreateLaunchTemplate");
        params
            .set("LaunchTemplateName", name)
            .set("LaunchTemplateData.ImageId", image_id);
        if let Some(user_data) = user_data_base64 {
            params.set("LaunchTemplateData.UserData", user_data);
        }
        let body = self.client.call(&params, Resend::Never).await?;
        let answer: xml::CreateLaunchTemplateResponse = xml::parse("CreateLaunchTemplate", &body)?;
        Ok(answer.launch_template.launch_template_id)
    }

    /// An instance's user data as EC2 keeps it (base64), empty when it has none.
    pub async fn user_data(&self, instance: &InstanceId) -> Result<String, CloudError> {
        let mut params = params::Params::new("DescribeInstanceAttribute");
        params.set("InstanceId", &instance.0).set("Attribute", "userData");
        let body = self.client.call(&params, Resend::Safe).await?;
        let answer: xml::DescribeInstanceAttributeResponse = xml::parse("DescribeInstanceAttribute", &body)?;
        Ok(answer.user_data.value)
    }

    /// Every subnet of the account's region, as (subnet, zone), sorted by zone.
    pub async fn subnets(&self) -> Result<Vec<(String, String)>, CloudError> {
        let params = params::Params::new("DescribeSubnets");
        let body = self.client.call(&params, Resend::Safe).await?;
        let answer: xml::DescribeSubnetsResponse = xml::parse("DescribeSubnets", &body)?;
        let mut out: Vec<(String, String)> = answer
            .subnet_set
            .items
            .into_iter()
            .map(|s| (s.subnet_id, s.availability_zone))
            .collect();
        out.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
        Ok(out)
    }
}
