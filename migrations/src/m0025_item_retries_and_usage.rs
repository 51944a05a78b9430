//! Retry rules and per-item usage (issue 29). An item's failed attempts are counted apart from
//! its deliveries, so an attempt lost with its worker (a spot reclaim, a runner's death) is never
//! charged as a failure: `failures` counts this round's failed attempts, `failed_delivery` is the
//! delivery that last counted (an outcome recorded twice counts once). `duration_ms` is the wall
//! time of the item's last attempt, beside its CPU seconds and peak memory.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

const COLUMNS: [&str; 3] = ["failures", "failed_delivery", "duration_ms"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        crate::columns::add_big_integers(manager, "batch_items", &COLUMNS).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        crate::columns::drop(manager, "batch_items", &COLUMNS).await
    }
}
