//! Scheduling (issue 6): a job's priority class, market policy and chosen market, its
//! preemptions, cost, and where a resumed attempt finds its checkpoint; and quotas by scope.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// Columns added to `jobs`, each with a default that fits the jobs already there.
fn job_columns() -> Vec<ColumnDef> {
    vec![
        integer("priority").default(0).to_owned(),
        string("priority_class").default("normal").to_owned(),
        string("market_policy").default("auto").to_owned(),
        string("market").default("").to_owned(),
        integer("preemptions").default(0).to_owned(),
        text("resume_from").default("").to_owned(),
        // Millionths of a currency unit, so sums are exact.
        big_integer("cost_micros").default(0).to_owned(),
        big_integer("on_demand_cost_micros").default(0).to_owned(),
    ]
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite alters one column at a time.
        for mut column in job_columns() {
            manager
                .alter_table(Table::alter().table("jobs").add_column(&mut column).to_owned())
                .await?;
        }
        manager
            .create_table(
                Table::create()
                    .table("quotas")
                    .if_not_exists()
                    .col(string("scope").primary_key())
                    .col(big_integer_null("cpu_millis"))
                    .col(big_integer_null("memory_bytes"))
                    .col(big_integer_null("gpus"))
                    .col(big_integer_null("running_jobs"))
                    .col(big_integer_null("queued_jobs"))
                    .col(big_integer("updated_at_ms"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table("quotas").if_exists().to_owned())
            .await?;
        for column in job_columns() {
            manager
                .alter_table(
                    Table::alter()
                        .table("jobs")
                        .drop_column(column.get_column_name())
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
