//! The best trial of a finished sweep into the model registry (`register:` in the spec), through
//! the same [`Registry::register`] as `kiln model register`, acting for the sweep's owner.
//!
//! Exactly once across crashes: the version is tagged `sweep=<id>` in the registry's own
//! transaction, so a leader that died between that commit and the record's `registered` event
//! finds the version by its tag instead of registering a second one.

use std::collections::BTreeMap;

use kiln_core::ErrorKind;
use kiln_core::models::{RegisterRequest, Registry};
use kiln_core::store::{ModelKey, VersionFilter};

use crate::Shared;
use crate::error::{Error, Result};
use crate::state::SweepView;

/// The tag naming the sweep a version came from, and the one naming its trial.
pub const SWEEP_TAG: &str = "sweep";
pub const TRIAL_TAG: &str = "trial";

/// What became of the best trial.
#[derive(Debug, Clone, PartialEq)]
pub enum Registration {
    /// Registered as this version, `NAME:V`.
    Registered(String),
    /// Not registered, for a reason that another try would not change (said in the sweep's
    /// reason): no trial has a value, the trial wrote no files.
    Refused(String),
}

/// Registers the sweep's best trial as a version of the spec's `register.model`, a model of the
/// sweep's project (its trials' project).
pub async fn best_trial(shared: &Shared, view: &SweepView) -> Result<Registration> {
    let Some(register) = &view.spec().register else {
        return Ok(Registration::Refused("the spec names no model".into()));
    };
    let sweep_id = &view.record.id;
    let tagged = VersionFilter {
        tags: BTreeMap::from([(SWEEP_TAG.to_string(), sweep_id.clone())]),
        limit: 1,
        ..Default::default()
    };
    if let Some(done) = shared
        .store
        .list_model_versions(&ModelKey::new(&view.record.project, &register.model), &tagged)
        .await?
        .first()
    {
        return Ok(Registration::Registered(format!("{}:{}", done.model, done.version)));
    }
    let Some((trial, job_id)) = view.best().and_then(|trial| Some((trial, trial.job_id.clone()?))) else {
        return Ok(Registration::Refused(
            "no trial reported a value of the objective".into(),
        ));
    };
    let job = shared.store.job(&job_id).await?;
    let owner = shared.store.user_by_id(&view.record.owner_id).await?;
    let request = RegisterRequest {
        model: register.model.clone(),
        job,
        path: String::new(),
        description: format!(
            "the best trial ({}) of sweep {} ({})",
            trial.index,
            sweep_id,
            view.spec().name
        ),
        tags: BTreeMap::from([
            (SWEEP_TAG.to_string(), sweep_id.clone()),
            (TRIAL_TAG.to_string(), trial.index.to_string()),
        ]),
        alias: register.alias.clone().unwrap_or_default(),
        registered_by: owner
            .map(|user| user.name)
            .unwrap_or_else(|| view.record.owner_id.clone()),
    };
    let registry = Registry::new(shared.store.clone(), shared.objects.clone(), shared.nats.clone());
    match registry.register(request).await {
        Ok(version) => Ok(Registration::Registered(format!(
            "{}:{}",
            version.record.model, version.record.version
        ))),
        Err(error) => match error.kind() {
            ErrorKind::InvalidArgument | ErrorKind::FailedPrecondition | ErrorKind::AlreadyExists => {
                tracing::warn!(%sweep_id, %job_id, error = %error, "the best trial cannot be registered");
                Ok(Registration::Refused(error.to_string()))
            }
            _ => Err(Error::Internal(format!("registering the best trial {job_id}: {error}"))),
        },
    }
}
