//! Opening the blob store `objects.url` names: a local directory or an S3 bucket (AWS or any
//! S3-compatible server), checked by `validate` and completed from the `AWS_*` variables.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt};

use crate::config::{ObjectStoreConfig, Secret};

/// Where `objects.url` points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectLocation {
    /// A local directory (relative paths are relative to the working directory).
    Local(PathBuf),
    /// An S3 bucket, with every object under `prefix` (empty for the bucket's root).
    S3 { bucket: String, prefix: String },
}

const URL_FORMS: &str = "file:///<absolute path>, a plain path, or s3://<bucket>[/<prefix>]";

impl ObjectStoreConfig {
    /// A local directory as the object store.
    pub fn local(dir: impl AsRef<Path>) -> Self {
        ObjectStoreConfig {
            url: dir.as_ref().display().to_string(),
            endpoint: String::new(),
            region: String::new(),
            access_key_id: String::new(),
            secret_access_key: Secret::default(),
            allow_http: false,
        }
    }

    /// Parses `url`: `file:///abs/path` or a plain path, or `s3://bucket[/prefix]`.
    pub fn location(&self) -> Result<ObjectLocation, String> {
        let url = self.url.trim();
        if url.is_empty() {
            return Err(format!("objects.url is empty: give {URL_FORMS}"));
        }
        let Some((scheme, rest)) = url.split_once("://") else {
            return Ok(ObjectLocation::Local(PathBuf::from(url)));
        };
        match scheme {
            "file" if rest.starts_with('/') => Ok(ObjectLocation::Local(PathBuf::from(rest))),
            "file" => Err(format!(
                "objects.url {url:?} is not an absolute file URL: write file:///<absolute path>, or a plain path"
            )),
            "s3" => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                check_bucket(bucket).map_err(|why| format!("objects.url {url:?}: {why}"))?;
                let prefix = prefix.trim_matches('/');
                if prefix.split('/').any(|part| part == "." || part == "..") {
                    return Err(format!("objects.url {url:?}: the prefix may not hold . or .. parts"));
                }
                Ok(ObjectLocation::S3 {
                    bucket: bucket.to_string(),
                    prefix: prefix.to_string(),
                })
            }
            _ => Err(format!(
                "objects.url {url:?} has the scheme {scheme:?}: give {URL_FORMS}"
            )),
        }
    }

    /// The local directory of a `file://` or plain-path store; `None` for S3.
    pub fn local_dir(&self) -> Option<PathBuf> {
        match self.location() {
            Ok(ObjectLocation::Local(dir)) => Some(dir),
            _ => None,
        }
    }

    /// Fills the S3 settings left empty from the usual AWS variables (`AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION` or `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL_S3` or
    /// `AWS_ENDPOINT_URL`); a local store takes nothing from them.
    pub fn apply_env(&mut self, env: &HashMap<String, String>) {
        if !matches!(self.location(), Ok(ObjectLocation::S3 { .. })) {
            return;
        }
        let first = |names: &[&str]| {
            names
                .iter()
                .find_map(|name| env.get(*name).filter(|value| !value.is_empty()).cloned())
        };
        if self.endpoint.is_empty() {
            self.endpoint = first(&["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"]).unwrap_or_default();
        }
        if self.region.is_empty() {
            self.region = first(&["AWS_REGION", "AWS_DEFAULT_REGION"]).unwrap_or_default();
        }
        if self.access_key_id.is_empty() {
            self.access_key_id = first(&["AWS_ACCESS_KEY_ID"]).unwrap_or_default();
        }
        if self.secret_access_key.expose().is_empty() {
            self.secret_access_key = Secret::new(first(&["AWS_SECRET_ACCESS_KEY"]).unwrap_or_default());
        }
    }

    /// Reports every problem of the `objects` section.
    pub fn validate(&self, problems: &mut Vec<String>) {
        let location = match self.location() {
            Ok(location) => location,
            Err(problem) => {
                problems.push(problem);
                return;
            }
        };
        if let ObjectLocation::Local(_) = location {
            let s3_settings = [
                ("endpoint", !self.endpoint.is_empty()),
                ("access-key-id", !self.access_key_id.is_empty()),
                ("secret-access-key", !self.secret_access_key.expose().is_empty()),
            ];
            for (name, set) in s3_settings {
                if set {
                    problems.push(format!(
                        "objects.{name} is set but objects.url {:?} is a local directory",
                        self.url
                    ));
                }
            }
            return;
        }
        if !self.endpoint.is_empty() {
            if self.endpoint.starts_with("http://") {
                if !self.allow_http {
                    problems.push(format!(
                        "objects.endpoint {:?} is plain http: set objects.allow-http = true to allow it",
                        self.endpoint
                    ));
                }
            } else if !self.endpoint.starts_with("https://") {
                problems.push(format!(
                    "objects.endpoint {:?} must start with http:// or https://",
                    self.endpoint
                ));
            }
        }
        match (
            self.access_key_id.is_empty(),
            self.secret_access_key.expose().is_empty(),
        ) {
            (false, true) => problems.push(
                "objects.access-key-id is set without objects.secret-access-key (or AWS_SECRET_ACCESS_KEY)".into(),
            ),
            (true, false) => problems
                .push("objects.secret-access-key is set without objects.access-key-id (or AWS_ACCESS_KEY_ID)".into()),
            _ => {}
        }
    }
}

/// Checks an S3 bucket name: 3 to 63 lowercase letters, digits, dots and hyphens.
fn check_bucket(bucket: &str) -> Result<(), String> {
    let allowed = bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
    let ends_ok = bucket
        .bytes()
        .next()
        .zip(bucket.bytes().last())
        .is_some_and(|(first, last)| first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric());
    if (3..=63).contains(&bucket.len()) && allowed && ends_ok {
        Ok(())
    } else {
        Err(format!(
            "the bucket {bucket:?} must be 3 to 63 lowercase letters, digits, dots and hyphens"
        ))
    }
}

/// Opens the object store: creates a local store's directory; builds an S3 client (no
/// request is made yet). A request may take as long as its body needs, but no read of it may
/// stall for more than a minute, so large objects stream at any speed.
pub fn open(config: &ObjectStoreConfig) -> Result<Arc<dyn ObjectStore>, object_store::Error> {
    let location = config.location().map_err(|problem| object_store::Error::Generic {
        store: "config",
        source: problem.into(),
    })?;
    match location {
        ObjectLocation::Local(dir) => {
            std::fs::create_dir_all(&dir).map_err(|source| object_store::Error::Generic {
                store: "local",
                source: Box::new(source),
            })?;
            Ok(Arc::new(LocalFileSystem::new_with_prefix(&dir)?))
        }
        ObjectLocation::S3 { bucket, prefix } => {
            let options = ClientOptions::new()
                .with_allow_http(config.allow_http)
                .with_timeout_disabled()
                .with_connect_timeout(Duration::from_secs(5))
                .with_read_timeout(Duration::from_secs(60));
            let mut builder = AmazonS3Builder::new()
                .with_bucket_name(bucket)
                .with_region(if config.region.is_empty() {
                    "us-east-1"
                } else {
                    &config.region
                })
                .with_client_options(options);
            if !config.endpoint.is_empty() {
                builder = builder.with_endpoint(&config.endpoint);
            }
            if !config.access_key_id.is_empty() {
                builder = builder
                    .with_access_key_id(&config.access_key_id)
                    .with_secret_access_key(config.secret_access_key.expose());
            }
            let s3 = builder.build()?;
            if prefix.is_empty() {
                Ok(Arc::new(s3))
            } else {
                Ok(Arc::new(PrefixStore::new(s3, prefix.as_str())))
            }
        }
    }
}

/// Opens the object store and makes one request of it (a `HEAD` of an object that need not
/// exist), so that a wrong endpoint, bucket or key fails the service's start, not its first job.
pub async fn connect(config: &ObjectStoreConfig) -> Result<Arc<dyn ObjectStore>, object_store::Error> {
    let objects = open(config)?;
    match objects
        .head(&object_store::path::Path::from("kiln-connect-probe"))
        .await
    {
        Ok(_) | Err(object_store::Error::NotFound { .. }) => Ok(objects),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(url: &str) -> ObjectStoreConfig {
        ObjectStoreConfig {
            url: url.into(),
            ..ObjectStoreConfig::default()
        }
    }

    #[test]
    fn urls_name_a_directory_or_a_bucket() {
        assert_eq!(
            ObjectStoreConfig::default().location(),
            Ok(ObjectLocation::Local("./data/objects".into()))
        );
        assert_eq!(
            s3("file:///var/kiln/objects").location(),
            Ok(ObjectLocation::Local("/var/kiln/objects".into()))
        );
        assert_eq!(
            s3("s3://kiln-blobs/prod/objects/").location(),
            Ok(ObjectLocation::S3 {
                bucket: "kiln-blobs".into(),
                prefix: "prod/objects".into()
            })
        );
        assert_eq!(
            s3("s3://kiln-blobs").location(),
            Ok(ObjectLocation::S3 {
                bucket: "kiln-blobs".into(),
                prefix: String::new()
            })
        );
        for bad in [
            "",
            "file://relative/dir",
            "gs://bucket",
            "s3://",
            "s3://Bad_Bucket/x",
            "s3://b/../x",
        ] {
            let mut problems = Vec::new();
            s3(bad).validate(&mut problems);
            assert_eq!(problems.len(), 1, "{bad:?}: {problems:?}");
            assert!(problems[0].starts_with("objects.url"), "{problems:?}");
        }
    }

    #[test]
    fn aws_variables_fill_what_is_empty() {
        let env: HashMap<String, String> = [
            ("AWS_ACCESS_KEY_ID", "from-env"),
            ("AWS_SECRET_ACCESS_KEY", "env-secret"),
            ("AWS_REGION", "eu-west-1"),
            ("AWS_ENDPOINT_URL", "https://s3.example.com"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut config = ObjectStoreConfig {
            access_key_id: "from-config".into(),
            ..s3("s3://bucket/prefix")
        };
        config.apply_env(&env);
        assert_eq!(config.access_key_id, "from-config");
        assert_eq!(config.secret_access_key.expose(), "env-secret");
        assert_eq!(config.region, "eu-west-1");
        assert_eq!(config.endpoint, "https://s3.example.com");
        let shown = format!("{config:?}");
        assert!(!shown.contains("env-secret"), "{shown}");

        let mut local = ObjectStoreConfig::default();
        local.apply_env(&env);
        assert_eq!(local, ObjectStoreConfig::default());
    }

    #[test]
    fn every_s3_problem_is_reported() {
        let mut problems = Vec::new();
        ObjectStoreConfig {
            endpoint: "http://127.0.0.1:9000".into(),
            access_key_id: "key".into(),
            ..s3("s3://bucket")
        }
        .validate(&mut problems);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].contains("allow-http"), "{problems:?}");
        assert!(problems[1].contains("secret-access-key"), "{problems:?}");

        let mut problems = Vec::new();
        ObjectStoreConfig {
            endpoint: "http://127.0.0.1:9000".into(),
            ..ObjectStoreConfig::local("/tmp/objects")
        }
        .validate(&mut problems);
        assert_eq!(problems.len(), 1, "{problems:?}");
    }
}
