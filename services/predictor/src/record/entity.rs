//! The sea-orm entities of the service tables: `project_services` (names unique per project,
//! since m0019) and `service_revisions`.

pub mod service {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "project_services")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub name: String,
        pub project: String,
        pub owner_id: String,
        pub state: String,
        /// The revision the predictors answer with.
        pub revision: i64,
        /// The newest revision; ahead of `revision` while the service rolls to it.
        pub latest_revision: i64,
        /// Workers per member when `scaling_json` is empty (and its `min_replicas` otherwise).
        pub replicas: i32,
        pub reason: String,
        pub created_at_ms: i64,
        pub updated_at_ms: i64,
        /// [`kiln_core::serving::Scaling`] as JSON; empty: `replicas` fixed.
        pub scaling_json: String,
        /// The percent of requests the latest revision answers while it is ahead (100: a roll).
        pub traffic: i32,
        /// The latest revision gets copies of the requests instead, its answers only compared.
        pub shadow: bool,
        /// Why the service was paused (its owner may no longer run jobs); empty when it was not.
        pub paused_reason: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod revision {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "service_revisions")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub service_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub revision: i64,
        /// The revision ([`crate::revision::Revision`]) as JSON.
        pub spec_json: String,
        pub created_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
