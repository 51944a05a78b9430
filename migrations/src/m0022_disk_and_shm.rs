//! Disk and shared memory (issue 28): a job's own disk (`--disk`, a size-limited volume on its
//! runner, counted in placement) and its `/dev/shm` size (`--shm`); 0 for neither.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const COLUMNS: [&str; 2] = ["disk_bytes", "shm_bytes"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        crate::columns::add_big_integers(manager, "jobs", &COLUMNS).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        crate::columns::drop(manager, "jobs", &COLUMNS).await
    }
}
