//! kiln's cloud interface (docs/provisioner.md, section 2).
//!
//! The provisioner asks a [`Cloud`] for machines by [`LaunchIntent`]s, lists and terminates
//! them by tags, and reads the [`Offering`]s of a pool with their prices. The trait names no
//! AWS concept: templates, zones, capacity types and tags exist on every cloud, and the table
//! in the design notes maps each call onto EC2, GCE and the simulated cloud.
//!
//! - [`ec2`]: EC2 through a hand-rolled Query API client ([`ec2::Ec2Cloud`], section 10);
//! - [`sim`]: the in-process simulated cloud ([`sim::SimCloud`]) for tests and `kiln up`;
//! - `requirements`: which catalogue types a pool's [`Requirements`] admit (both clouds);
//! - `timefmt`: the ISO 8601 UTC times of the EC2 API.

pub mod ec2;
mod error;
mod pool;
mod requirements;
pub mod sim;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod timefmt;
mod types;

use std::time::Duration;

use futures::stream::BoxStream;

pub use error::CloudError;
pub use pool::{PoolDisk, PoolSpec};
pub use types::{
    CapacityType, CloudInstance, InstanceId, InstanceState, IntentId, Interruption, LaunchIntent, Launched,
    NoticeAction, Offering, OfferingFailure, OfferingKey, PriceSource, Requirements, RootVolume, Shape, TAG_CLUSTER,
    TAG_INTENT, TAG_POOL, TagSelector, TemplateRef, Unavailable,
};

/// One cloud: EC2, the simulated cloud, (designed) GCE.
#[async_trait::async_trait]
pub trait Cloud: Send + Sync + 'static {
    /// The cloud's name in config and metrics (`ec2`, `sim`).
    fn name(&self) -> &'static str;

    /// The create call for one intent: idempotent by `intent.id` where the cloud supports it.
    /// `Err(CloudError::Ambiguous)` when the call was sent and no answer came back.
    async fn create(&self, intent: &LaunchIntent) -> Result<Launched, CloudError>;

    /// One instance, or `None` when the cloud does not know it (any more).
    async fn get(&self, id: &InstanceId) -> Result<Option<CloudInstance>, CloudError>;

    /// Every instance carrying the selector's tags (paginated inside).
    async fn list(&self, selector: &TagSelector) -> Result<Vec<CloudInstance>, CloudError>;

    /// Idempotent: an unknown or already-terminated instance counts as terminated.
    async fn terminate(&self, ids: &[InstanceId]) -> Result<(), CloudError>;

    /// The pool's offerings with current prices; availability is the provisioner's (its cache).
    async fn offerings(&self, pool: &PoolSpec) -> Result<Vec<Offering>, CloudError>;

    /// Cloud-side interruption events (EC2: EventBridge → SQS, optional; sim: its notices).
    /// The instance-side path (the runner's metadata poller) is the primary one.
    fn interruptions(&self) -> Option<BoxStream<'static, Interruption>> {
        None
    }
}

/// How long an offering that failed stays unavailable (Karpenter's `UnavailableOfferingsTTL`).
pub const UNAVAILABLE_TTL: Duration = Duration::from_secs(180);
