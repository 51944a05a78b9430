//! The model registry (issue 15): models (names unique in the instance, each of one project),
//! their immutable versions numbered 1, 2, ... with lineage, the files of each version (by
//! sha256, so a blob a version names is never deleted with a dataset), key=value tags, and
//! aliases unique per model (one row per alias: moving it is one atomic upsert).

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("models")
                    .if_not_exists()
                    .col(string("name").primary_key())
                    .col(string("project"))
                    .col(string("created_by"))
                    .col(big_integer("created_at_ms"))
                    // The highest version number given; the next register takes one more.
                    .col(big_integer("latest_version").default(0))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("model_versions")
                    .if_not_exists()
                    .col(string("model"))
                    .col(big_integer("version"))
                    .col(string("digest"))
                    .col(big_integer("size"))
                    .col(string("job_id"))
                    .col(text("description"))
                    .col(text("lineage_json"))
                    .col(string("created_by"))
                    .col(big_integer("created_at_ms"))
                    .primary_key(Index::create().col("model").col("version"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("model_files")
                    .if_not_exists()
                    .col(string("model"))
                    .col(big_integer("version"))
                    .col(string("path"))
                    .col(string("sha256"))
                    .col(big_integer("size"))
                    .primary_key(Index::create().col("model").col("version").col("path"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("model_tags")
                    .if_not_exists()
                    .col(string("model"))
                    .col(big_integer("version"))
                    .col(string("key"))
                    .col(string("value"))
                    .primary_key(Index::create().col("model").col("version").col("key"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("model_aliases")
                    .if_not_exists()
                    .col(string("model"))
                    .col(string("alias"))
                    .col(big_integer("version"))
                    .col(big_integer("updated_at_ms"))
                    .primary_key(Index::create().col("model").col("alias"))
                    .to_owned(),
            )
            .await?;
        let indexes = [
            ("models_by_project", "models", vec!["project", "name"]),
            ("model_versions_by_job", "model_versions", vec!["job_id"]),
            ("model_files_by_sha256", "model_files", vec!["sha256"]),
            // Tag filters (`--tag stage=prod`) of one model's versions.
            (
                "model_tags_by_value",
                "model_tags",
                vec!["model", "key", "value", "version"],
            ),
        ];
        for (name, table, columns) in indexes {
            let mut index = Index::create();
            index.name(name).table(table);
            for column in columns {
                index.col(column);
            }
            manager.create_index(index.to_owned()).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in ["model_aliases", "model_tags", "model_files", "model_versions", "models"] {
            manager.drop_table(Table::drop().table(table).to_owned()).await?;
        }
        Ok(())
    }
}
