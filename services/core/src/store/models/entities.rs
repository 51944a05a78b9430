//! sea-orm entities of the registry's tables (schema in `kiln-migrations` m0011_models, keyed
//! by (project, model) in the `project_*` tables of m0019_project_scoped_models).

pub mod model {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "project_models")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub project: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub name: String,
        pub created_by: String,
        pub created_at_ms: i64,
        pub latest_version: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod model_version {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "project_model_versions")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub project: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub model: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub version: i64,
        pub digest: String,
        pub size: i64,
        pub job_id: String,
        pub description: String,
        pub lineage_json: String,
        pub created_by: String,
        pub created_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod model_file {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "project_model_files")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub project: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub model: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub version: i64,
        #[sea_orm(primary_key, auto_increment = false)]
        pub path: String,
        pub sha256: String,
        pub size: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod model_tag {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "project_model_tags")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub project: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub model: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub version: i64,
        #[sea_orm(primary_key, auto_increment = false)]
        pub key: String,
        pub value: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod model_alias {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "project_model_aliases")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub project: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub model: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub alias: String,
        pub version: i64,
        pub updated_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
