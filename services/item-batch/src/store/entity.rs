//! The sea-orm entities of the batch tables: `batches`, `batch_items`, `item_attempts` and
//! `batch_counts`.

pub mod batch {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "batches")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub owner_id: String,
        pub project: String,
        pub name: String,
        pub spec_json: String,
        pub state: String,
        pub created_at_ms: i64,
        pub sealed_at_ms: Option<i64>,
        pub finished_at_ms: Option<i64>,
        /// Why the batch stopped asking for workers (see `store::stalls`); empty when it asks.
        pub stalled_reason: String,
        /// Worker failures count among the workers asked for from this time on.
        pub worker_failures_since_ms: i64,
        /// Why the batch was paused (its owner may no longer run jobs; see `store::stalls`);
        /// empty when it was not.
        pub paused_reason: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod item {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
    #[sea_orm(table_name = "batch_items")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub batch_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub item_key: String,
        pub uri: String,
        pub params_json: String,
        pub content_sha256: String,
        pub state: String,
        pub published: bool,
        pub round: i32,
        pub attempts: i32,
        pub last_attempt: i32,
        pub exit_code: Option<i32>,
        pub reason: String,
        pub cpu_seconds: f64,
        pub peak_memory_bytes: i64,
        pub updated_at_ms: i64,
        /// Failed attempts of this round (lost deliveries are not failures).
        pub failures: i64,
        /// The delivery whose failure was counted last.
        pub failed_delivery: i64,
        /// Wall time of the last attempt (`cpu_seconds` and `peak_memory_bytes` are its too).
        pub duration_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod attempt {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "item_attempts")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub batch_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub item_key: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub attempt: i32,
        pub round: i32,
        pub exit_code: Option<i32>,
        pub reason: String,
        pub lines_json: String,
        pub finished_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod count {
    use sea_orm::entity::prelude::*;

    /// How many of a batch's items are in a state, changed in the transactions that move them.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "batch_counts")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub batch_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub state: String,
        pub n: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
