//! Fair-share weights (issue 6): a project's or a user's weight, kept with the scope's quota
//! (as Slurm keeps an association's fair-share next to its limits). NULL is weight 1.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("quotas")
                    .add_column(double_null("weight"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(Table::alter().table("quotas").drop_column("weight").to_owned())
            .await
    }
}
