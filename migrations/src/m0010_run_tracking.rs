//! Run tracking (issue 15): a job keeps the config its run was given (`kiln.init(config=...)`,
//! or a sweep's knobs), its summary values (`kiln.summary`) and the sweep it is a trial of; and
//! the files a run saved (`kiln.save`) are recorded by name and path, each naming the
//! content-addressed blob that holds it.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite adds one at a time.
        let added = [
            text("config_json").default("{}").to_owned(),
            text("summary_json").default("{}").to_owned(),
            string("sweep_id").default("").to_owned(),
        ];
        for mut column in added {
            manager
                .alter_table(Table::alter().table("jobs").add_column(&mut column).to_owned())
                .await?;
        }
        manager
            .create_index(
                Index::create()
                    .name("jobs_by_sweep")
                    .table("jobs")
                    .col("sweep_id")
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("run_artifacts")
                    .if_not_exists()
                    .col(string("job_id"))
                    // The name given to `kiln.save` (the file's or directory's name by default).
                    .col(string("name"))
                    // The file's path under the artifact ("" when the artifact is one file).
                    .col(string("path"))
                    .col(string("digest"))
                    .col(big_integer("size"))
                    .col(big_integer("created_at_ms"))
                    .primary_key(Index::create().col("job_id").col("name").col("path"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("run_artifacts_by_digest")
                    .table("run_artifacts")
                    .col("digest")
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table("run_artifacts").to_owned())
            .await?;
        manager
            .drop_index(Index::drop().name("jobs_by_sweep").table("jobs").to_owned())
            .await?;
        for column in ["sweep_id", "summary_json", "config_json"] {
            manager
                .alter_table(Table::alter().table("jobs").drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}
