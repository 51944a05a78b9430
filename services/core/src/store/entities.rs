//! sea-orm entities of the metadata tables (schema in `kiln-migrations`).

pub mod user {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "users")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub name: String,
        pub is_admin: bool,
        pub created_at_ms: i64,
        pub disabled: bool,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod api_token {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "api_tokens")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub user_id: String,
        pub secret_sha256: String,
        pub name: String,
        pub scope: String,
        pub revoked: bool,
        pub created_at_ms: i64,
        pub expires_at_ms: Option<i64>,
        pub last_used_at_ms: Option<i64>,
        /// The project the token is narrowed to; empty for none.
        pub project: String,
        /// The role it is narrowed to there; empty for none.
        pub role: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod job {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "jobs")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub owner_id: String,
        pub project: String,
        pub name: String,
        pub command_json: String,
        pub env_json: String,
        pub cpu_millis: i64,
        pub memory_bytes: i64,
        pub code_digest: String,
        pub state: String,
        pub version: i64,
        pub published_version: i64,
        pub attempt: i32,
        pub pool: String,
        pub runner_id: String,
        pub instance_id: String,
        pub exit_code: Option<i32>,
        pub reason: String,
        pub stop_requested: bool,
        pub created_at_ms: i64,
        pub updated_at_ms: i64,
        pub started_at_ms: Option<i64>,
        pub finished_at_ms: Option<i64>,
        pub image: String,
        pub gpus: i32,
        pub max_runtime_secs: i64,
        pub datasets_json: String,
        /// The batch a worker job serves; empty for other jobs.
        pub batch_id: String,
        /// The value of the job's priority class (higher runs first), and its name.
        pub priority: i32,
        pub priority_class: String,
        /// `auto`, `spot` or `on-demand`: where the job may run.
        pub market_policy: String,
        /// The market of the current or last attempt; empty before the first placement.
        pub market: String,
        pub preemptions: i32,
        /// Where the outputs of the attempt before a preemption are (`KILN_RESUME_FROM`).
        pub resume_from: String,
        /// Cost of the attempts so far, and what on-demand would have cost, in millionths.
        pub cost_micros: i64,
        pub on_demand_cost_micros: i64,
        /// The client's idempotency key of the submit, unique per owner; NULL for none.
        pub submit_key: Option<String>,
        /// The canonical hash of the submitted spec ([`crate::store::NewJob::spec_hash`]), so a
        /// key reused for another spec is refused; empty for jobs submitted without a key.
        pub submit_hash: String,
        /// The one pool the job may run on; empty for any pool that fits.
        pub requested_pool: String,
        /// Names of the project secrets the job gets as environment variables (JSON list).
        pub secrets_json: String,
        /// The run's config (a flat `kiln_core::runs::RunConfig` as JSON); `{}` for none.
        pub config_json: String,
        /// The run's summary values (`kiln.summary`), as `config_json`.
        pub summary_json: String,
        /// The sweep this job is a trial of; empty for other jobs.
        pub sweep_id: String,
        pub service_id: String,
        /// GPU-milliseconds of the ended attempts: GPUs times each attempt's run time, as its
        /// runner measured it (the running attempt's is not in it yet).
        pub gpu_ms: i64,
        /// When the running attempt's outputs were last synced to object storage (0 for never),
        /// and the bytes they held then.
        pub outputs_synced_at_ms: i64,
        pub outputs_synced_bytes: i64,
        pub disk_bytes: i64,
        pub shm_bytes: i64,
        pub nodes: i32,
        pub gang_master: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod run_artifact {
    use sea_orm::entity::prelude::*;

    /// One file a run saved (`kiln.save`): the blob holding it is `digest`.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "run_artifacts")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub job_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub name: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub path: String,
        pub digest: String,
        pub size: i64,
        pub created_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod artifact {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "artifacts")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub digest: String,
        pub size: i64,
        pub created_by: String,
        pub created_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod artifact_project {
    use sea_orm::entity::prelude::*;

    /// A project a blob belongs to: it uploaded the blob, or a record of it names the blob.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "artifact_projects")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub digest: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub project: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod dataset {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    /// A dataset: a name, unique in its project, for one archive.
    #[sea_orm(table_name = "project_datasets")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub project: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub name: String,
        pub digest: String,
        pub size: i64,
        pub created_by: String,
        pub created_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod project {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "projects")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub name: String,
        pub created_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod job_node {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "job_nodes")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub job_id: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub attempt: i32,
        #[sea_orm(primary_key, auto_increment = false)]
        pub rank: i32,
        pub runner_id: String,
        pub state: String,
        pub exit_code: Option<i32>,
        pub reason: String,
        pub heartbeat_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod project_member {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "project_members")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub project: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub user_id: String,
        pub role: String,
        pub created_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod secret {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "secrets")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub project: String,
        #[sea_orm(primary_key, auto_increment = false)]
        pub name: String,
        /// Nonce and ciphertext; never the value in clear.
        pub sealed: Vec<u8>,
        pub created_at_ms: i64,
        pub updated_at_ms: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod quota {
    use sea_orm::entity::prelude::*;

    /// Limits of a scope (`global`, `project:<name>`, `user:<name>`); `None` is no limit. A
    /// project's or user's fair-share weight lives here too (`None` is weight 1).
    #[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
    #[sea_orm(table_name = "quotas")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub scope: String,
        pub cpu_millis: Option<i64>,
        pub memory_bytes: Option<i64>,
        pub gpus: Option<i64>,
        pub running_jobs: Option<i64>,
        pub queued_jobs: Option<i64>,
        pub updated_at_ms: i64,
        pub weight: Option<f64>,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod pending_login {
    use sea_orm::entity::prelude::*;

    /// A web UI login a browser asked for (store/logins.rs): pending until a user approves its
    /// code, then redeemed once by the browser holding the nonce.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "pending_logins")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: String,
        pub nonce_sha256: String,
        pub code_sha256: String,
        pub state: String,
        pub user_agent: String,
        pub created_at_ms: i64,
        pub expires_at_ms: i64,
        /// The approving user; empty until approved.
        pub user_id: String,
        /// The project and role the approving token was narrowed to; empty for none.
        pub project: String,
        pub role: String,
        /// The session token the redemption issued; empty until redeemed.
        pub session_token_id: String,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

pub mod login_approval_failure {
    use sea_orm::entity::prelude::*;

    /// How many codes a user approved wrongly since `window_started_at_ms`.
    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "login_approval_failures")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub user_id: String,
        pub window_started_at_ms: i64,
        pub failures: i32,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}
