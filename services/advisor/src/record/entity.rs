//! The sea-orm entities of the sweep tables: `sweeps` and `sweep_events`.

pub mod sweep {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "sweeps")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub owner_id: String,
        pub project: String,
        pub name: String,
        /// The spec as the user wrote it.
        pub spec_yaml: String,
        /// The checked spec ([`crate::spec::SweepSpec`]) as JSON.
        pub spec_json: String,
        pub code_digest: String,
        pub state: String,
        pub reason: String,
        /// The client's idempotency key; empty for none.
        pub submit_key: String,
        /// The model version the best trial became ("NAME:V"); empty before.
        pub registered: String,
        pub created_at_ms: i64,
        pub finished_at_ms: Option<i64>,
        /// Why the sweep was paused (its owner may no longer run jobs); empty when it was not.
        pub paused_reason: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod event {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "sweep_events")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub sweep_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub seq: i64,
        pub dedupe: String,
        pub kind: String,
        pub trial: i32,
        pub body_json: String,
        pub at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
