//! kiln rents its own machines (issue 27): a launch intent is recorded before the cloud's create
//! call (its id is the call's ClientToken and a tag on every instance), and each instance the
//! cloud answered, or the reconciler found by that tag, is recorded with its lifecycle, so a
//! crash between a call and its record launches nothing twice and leaks nothing. Both tables
//! change only by compare-and-set on `version`. See docs/provisioner.md, section 3.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("launch_intents")
                    .if_not_exists()
                    .col(string("id").primary_key())
                    .col(string("cluster"))
                    .col(string("pool"))
                    // spot | on-demand
                    .col(string("capacity"))
                    .col(integer("count"))
                    .col(integer("min_count"))
                    .col(boolean("single_zone"))
                    // The whole intent sent (JSON): candidates, template, labels.
                    .col(text("request"))
                    // The jobs this group of machines was planned for (JSON): explain only.
                    .col(text("demand").default("[]"))
                    // planned -> calling -> launched | failed; planned -> dropped.
                    .col(string("state"))
                    .col(big_integer("version"))
                    .col(big_integer("created_at_ms"))
                    .col(big_integer("called_at_ms").default(0))
                    .col(big_integer("settled_at_ms").default(0))
                    // Per-offering failures of the answer (JSON).
                    .col(text("failures").default("[]"))
                    // How many times the call was sent (the first, and one reconciliation retry).
                    .col(integer("attempts").default(0))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("launch_intents_by_cluster_state")
                    .table("launch_intents")
                    .col("cluster")
                    .col("state")
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("cloud_instances")
                    .if_not_exists()
                    .col(string("instance_id").primary_key())
                    .col(string("cluster"))
                    .col(string("intent_id"))
                    .col(string("pool"))
                    .col(string("instance_type"))
                    .col(string("zone"))
                    .col(string("capacity"))
                    .col(double("price_per_hour").default(0.0))
                    // booting -> registered -> cordoned -> terminating -> terminated.
                    .col(string("state"))
                    .col(big_integer("version"))
                    .col(big_integer("launched_at_ms"))
                    .col(big_integer("boot_deadline_ms"))
                    // Set when a runner on the instance holds a lease naming it.
                    .col(string("runner_id").default(""))
                    .col(big_integer("registered_at_ms").default(0))
                    // When it was cordoned: released a scheduling pass later if still idle.
                    .col(big_integer("cordoned_at_ms").default(0))
                    .col(big_integer("released_at_ms").default(0))
                    // Why it was released: idle, boot timeout, lease lapsed, interrupted, reaped.
                    .col(string("reason").default(""))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("cloud_instances_by_cluster_state")
                    .table("cloud_instances")
                    .col("cluster")
                    .col("state")
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table("cloud_instances").to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table("launch_intents").to_owned())
            .await
    }
}
