//! The provisioner's records (issue 27, docs/provisioner.md section 3): launch intents, written
//! before the cloud's create call, and the instances the cloud made for them. Both change only
//! by compare-and-set on `version` ([`Store::update_intent`], [`Store::update_instance`]), so the
//! reconciler, the reaper, the boot timeout and the idle scaler never release an instance twice
//! and a new leader picks up exactly where the last one stopped.

use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, IntoActiveModel, QueryFilter, QueryOrder, TransactionTrait};

use super::{Store, StoreResult};

/// Rows of `cloud_instances` (17 columns) in one insert: 8,500 bound variables, under SQLite's
/// 32,766 and Postgres's 65,535.
const INSTANCES_PER_STATEMENT: usize = 500;

pub use entities::cloud_instance::Model as InstanceRecord;
pub use entities::launch_intent::Model as IntentRecord;

/// States of a launch intent.
pub mod intent_state {
    /// Recorded, the call not sent yet.
    pub const PLANNED: &str = "planned";
    /// The call was (or is being) sent; its answer is not recorded.
    pub const CALLING: &str = "calling";
    /// The answer (or the reconciler) recorded at least one instance.
    pub const LAUNCHED: &str = "launched";
    /// The answer recorded no instance.
    pub const FAILED: &str = "failed";
    /// Its demand vanished before the call.
    pub const DROPPED: &str = "dropped";
}

/// States of a cloud instance.
pub mod instance_state {
    /// Made by the cloud; no runner on it holds a lease yet.
    pub const BOOTING: &str = "booting";
    /// A runner on it holds a lease.
    pub const REGISTERED: &str = "registered";
    /// No new placements; about to be released.
    pub const CORDONED: &str = "cordoned";
    /// Terminate sent (or to be sent again).
    pub const TERMINATING: &str = "terminating";
    /// The cloud says it is gone.
    pub const TERMINATED: &str = "terminated";

    /// The states of an instance kiln still pays for.
    pub const LIVE: [&str; 4] = [BOOTING, REGISTERED, CORDONED, TERMINATING];
}

impl Store {
    /// Records a new intent (state [`intent_state::PLANNED`], version 1).
    pub async fn insert_intent(&self, intent: IntentRecord) -> StoreResult<()> {
        entities::launch_intent::Entity::insert(intent.into_active_model())
            .exec_without_returning(&self.db)
            .await?;
        Ok(())
    }

    /// Replaces the intent with `next` if it is still at `next.version - 1`; false if another
    /// writer moved it first.
    pub async fn update_intent(&self, next: &IntentRecord) -> StoreResult<bool> {
        use entities::launch_intent::{Column, Entity};
        let result = Entity::update_many()
            .set(next.clone().into_active_model().reset_all())
            .filter(Column::Id.eq(next.id.as_str()))
            .filter(Column::Version.eq(next.version - 1))
            .exec(&self.db)
            .await?;
        Ok(result.rows_affected == 1)
    }

    pub async fn intent(&self, id: &str) -> StoreResult<Option<IntentRecord>> {
        Ok(entities::launch_intent::Entity::find_by_id(id).one(&self.db).await?)
    }

    /// The cluster's intents in any of `states`, oldest first.
    pub async fn intents(&self, cluster: &str, states: &[&str]) -> StoreResult<Vec<IntentRecord>> {
        use entities::launch_intent::{Column, Entity};
        Ok(Entity::find()
            .filter(Column::Cluster.eq(cluster))
            .filter(Column::State.is_in(states.iter().copied()))
            .order_by_asc(Column::CreatedAtMs)
            .all(&self.db)
            .await?)
    }

    /// Records instances, all or none; one already recorded (adopted twice, answered after it
    /// was adopted) is left as it is. Returns how many were new.
    pub async fn insert_instances(&self, instances: Vec<InstanceRecord>) -> StoreResult<u64> {
        use entities::cloud_instance::{Column, Entity};
        if instances.is_empty() {
            return Ok(0);
        }
        // One statement binds every column of every row, and SQLite takes at most 32,766
        // variables (Postgres 65,535): a create call answered with 2,000 instances must be
        // written in several statements, in one transaction.
        let txn = self.db.begin().await?;
        let mut inserted = 0;
        let mut rows = instances.into_iter().peekable();
        while rows.peek().is_some() {
            let chunk: Vec<_> = rows
                .by_ref()
                .take(INSTANCES_PER_STATEMENT)
                .map(IntoActiveModel::into_active_model)
                .collect();
            let result = Entity::insert_many(chunk)
                .on_conflict(OnConflict::column(Column::InstanceId).do_nothing().to_owned())
                .exec_without_returning(&txn)
                .await;
            inserted += match result {
                Ok(count) => count,
                // sea-orm reports "nothing inserted" as an error when every row conflicted.
                Err(sea_orm::DbErr::RecordNotInserted) => 0,
                Err(error) => return Err(error.into()),
            };
        }
        txn.commit().await?;
        Ok(inserted)
    }

    /// Replaces the instance with `next` if it is still at `next.version - 1`.
    pub async fn update_instance(&self, next: &InstanceRecord) -> StoreResult<bool> {
        use entities::cloud_instance::{Column, Entity};
        let result = Entity::update_many()
            .set(next.clone().into_active_model().reset_all())
            .filter(Column::InstanceId.eq(next.instance_id.as_str()))
            .filter(Column::Version.eq(next.version - 1))
            .exec(&self.db)
            .await?;
        Ok(result.rows_affected == 1)
    }

    /// The runners of instances the provisioner is releasing (cordoned or terminating), of any
    /// cluster: the scheduler places nothing on them.
    pub async fn released_runners(&self) -> StoreResult<std::collections::HashSet<String>> {
        use entities::cloud_instance::{Column, Entity};
        Ok(Entity::find()
            .filter(Column::State.is_in([instance_state::CORDONED, instance_state::TERMINATING]))
            .filter(Column::RunnerId.ne(""))
            .all(&self.db)
            .await?
            .into_iter()
            .map(|record| record.runner_id)
            .collect())
    }

    /// The cluster's instances in any of `states`, oldest first.
    pub async fn instances(&self, cluster: &str, states: &[&str]) -> StoreResult<Vec<InstanceRecord>> {
        use entities::cloud_instance::{Column, Entity};
        Ok(Entity::find()
            .filter(Column::Cluster.eq(cluster))
            .filter(Column::State.is_in(states.iter().copied()))
            .order_by_asc(Column::LaunchedAtMs)
            .all(&self.db)
            .await?)
    }
}

pub mod entities {
    pub mod launch_intent {
        use sea_orm::entity::prelude::*;

        /// One create call, recorded before it is sent (docs/provisioner.md section 3).
        #[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
        #[sea_orm(table_name = "launch_intents")]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub id: String,
            pub cluster: String,
            pub pool: String,
            pub capacity: String,
            pub count: i32,
            pub min_count: i32,
            pub single_zone: bool,
            /// The whole intent sent, as JSON.
            pub request: String,
            /// The jobs it was planned for, as JSON.
            pub demand: String,
            pub state: String,
            pub version: i64,
            pub created_at_ms: i64,
            pub called_at_ms: i64,
            pub settled_at_ms: i64,
            /// Per-offering failures of the answer, as JSON.
            pub failures: String,
            pub attempts: i32,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }

    pub mod cloud_instance {
        use sea_orm::entity::prelude::*;

        /// One instance a launch intent made.
        #[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
        #[sea_orm(table_name = "cloud_instances")]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub instance_id: String,
            pub cluster: String,
            pub intent_id: String,
            pub pool: String,
            pub instance_type: String,
            pub zone: String,
            pub capacity: String,
            pub price_per_hour: f64,
            pub state: String,
            pub version: i64,
            pub launched_at_ms: i64,
            pub boot_deadline_ms: i64,
            pub runner_id: String,
            pub registered_at_ms: i64,
            pub cordoned_at_ms: i64,
            pub released_at_ms: i64,
            pub reason: String,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }
}
