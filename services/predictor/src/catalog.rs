//! The services a predictor answers for: every live definition in
//! [`BUCKET_SERVICES`](kiln_core::subjects::BUCKET_SERVICES), kept current by a watch, by
//! [`service_key`] (`PROJECT.NAME`: names are unique per project).
//!
//! [`Catalog::open`] reads every definition before the predictor serves, so a predictor that has
//! just started knows each service at its first request. A service the watch has not delivered
//! yet (one made a moment ago) is read from the bucket before it is called unknown, so a client
//! that infers right after creating a service is answered. A key of one token is a definition written before names were per project: it is
//! ignored here, and the controller deletes it.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use async_nats::jetstream::kv::{Operation, Store};
use futures::StreamExt;
use kiln_core::serving::{ServiceSpec, service_key};
use kiln_core::streams::{Nats, NatsError};
use kiln_core::subjects::BUCKET_SERVICES;
use tokio_util::sync::CancellationToken;

/// The known services by key; cheap to clone.
#[derive(Clone)]
pub struct Catalog {
    services: Arc<RwLock<HashMap<String, Arc<ServiceSpec>>>>,
    bucket: Store,
}

impl Catalog {
    /// Opens the bucket and reads every definition in it; [`Catalog::watch`] then keeps the
    /// catalog current.
    pub async fn open(nats: &Nats) -> Result<Catalog, NatsError> {
        let failed = |error: &dyn std::fmt::Display| NatsError::Other(format!("bucket {BUCKET_SERVICES}: {error}"));
        let bucket = nats
            .jetstream
            .get_key_value(BUCKET_SERVICES)
            .await
            .map_err(|error| failed(&error))?;
        let catalog = Catalog {
            services: Default::default(),
            bucket,
        };
        let keys: Vec<String> = catalog
            .bucket
            .keys()
            .await
            .map_err(|error| failed(&error))?
            .filter_map(|key| async move { key.ok().filter(|key| !is_legacy(key)) })
            .collect()
            .await;
        for key in keys {
            if let Some(value) = catalog.bucket.get(&key).await.map_err(|error| failed(&error))? {
                catalog.put(&key, &value);
            }
        }
        Ok(catalog)
    }

    /// Applies every change of the bucket until `shutdown`, watching again after an error.
    pub async fn watch(self, shutdown: CancellationToken) {
        loop {
            let watch = match self.bucket.watch_with_history(">").await {
                Ok(watch) => watch,
                Err(error) => {
                    tracing::warn!(error = %error, "cannot watch the services; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => continue,
                    }
                }
            };
            let mut watch = std::pin::pin!(watch.take_until(shutdown.cancelled()));
            while let Some(entry) = watch.next().await {
                match entry {
                    Ok(entry) => match entry.operation {
                        Operation::Put => self.put(&entry.key, &entry.value),
                        Operation::Delete | Operation::Purge => self.remove(&entry.key),
                    },
                    Err(error) => {
                        tracing::warn!(error = %error, "the services' watch failed; watching again");
                        break;
                    }
                }
            }
            if shutdown.is_cancelled() {
                return;
            }
        }
    }

    fn put(&self, key: &str, value: &[u8]) {
        if is_legacy(key) {
            return;
        }
        match serde_json::from_slice::<ServiceSpec>(value) {
            Ok(spec) => {
                tracing::info!(service = key, revision = spec.revision, "service definition");
                self.services
                    .write()
                    .expect("no writer panics")
                    .insert(key.to_string(), Arc::new(spec));
            }
            Err(error) => tracing::warn!(service = key, error = %error, "unreadable service definition; ignored"),
        }
    }

    fn remove(&self, key: &str) {
        tracing::info!(service = key, "service removed");
        self.services.write().expect("no writer panics").remove(key);
    }

    /// Service `name` of `project`, if there is one.
    pub async fn get(&self, project: &str, name: &str) -> Result<Option<Arc<ServiceSpec>>, NatsError> {
        let key = service_key(project, name);
        if let Some(spec) = self.services.read().expect("no writer panics").get(&key) {
            return Ok(Some(spec.clone()));
        }
        if kiln_core::serving::check_name("name", name).is_err()
            || kiln_core::subjects::validate_token("project", project).is_err()
        {
            return Ok(None);
        }
        let value = self
            .bucket
            .get(&key)
            .await
            .map_err(|error| NatsError::Other(format!("bucket {BUCKET_SERVICES}: {error}")))?;
        Ok(value.and_then(|value| serde_json::from_slice::<ServiceSpec>(&value).ok().map(Arc::new)))
    }

    /// The known services called `name`, of any project.
    pub fn named(&self, name: &str) -> Vec<Arc<ServiceSpec>> {
        self.services
            .read()
            .expect("no writer panics")
            .values()
            .filter(|spec| spec.name == name)
            .cloned()
            .collect()
    }

    /// The bucket itself (the controller writes it).
    pub fn bucket(&self) -> &Store {
        &self.bucket
    }

    /// Every known service, by name (then project).
    pub fn all(&self) -> Vec<Arc<ServiceSpec>> {
        let mut all: Vec<_> = self
            .services
            .read()
            .expect("no writer panics")
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| (&a.name, &a.project).cmp(&(&b.name, &b.project)));
        all
    }

    /// Deletes the definitions written before names were per project (one-token keys): the
    /// controller has written each running service's under its `PROJECT.NAME` key by then.
    pub async fn delete_legacy(&self) -> Result<usize, NatsError> {
        let keys = self
            .bucket
            .keys()
            .await
            .map_err(|error| NatsError::Other(format!("bucket {BUCKET_SERVICES}: {error}")))?;
        let legacy: Vec<String> = keys
            .filter_map(|key| async move { key.ok().filter(|key| is_legacy(key)) })
            .collect()
            .await;
        for key in &legacy {
            self.bucket
                .delete(key)
                .await
                .map_err(|error| NatsError::Other(format!("bucket {BUCKET_SERVICES}: {error}")))?;
        }
        Ok(legacy.len())
    }
}

/// Whether a key of the bucket is a definition written before names were per project.
fn is_legacy(key: &str) -> bool {
    !key.contains('.')
}
