//! Adding and dropping columns of a table one statement each (SQLite alters one column at a
//! time), for migrations that only add columns.

use sea_orm_migration::{prelude::*, schema::*};

/// Adds `columns` to `table` as big integers defaulting to 0.
pub async fn add_big_integers(manager: &SchemaManager<'_>, table: &str, columns: &[&'static str]) -> Result<(), DbErr> {
    for column in columns {
        manager
            .alter_table(
                Table::alter()
                    .table(String::from(table))
                    .add_column(big_integer(*column).default(0).to_owned())
                    .to_owned(),
            )
            .await?;
    }
    Ok(())
}

/// Drops `columns` of `table`.
pub async fn drop(manager: &SchemaManager<'_>, table: &str, columns: &[&'static str]) -> Result<(), DbErr> {
    for column in columns {
        manager
            .alter_table(
                Table::alter()
                    .table(String::from(table))
                    .drop_column(*column)
                    .to_owned(),
            )
            .await?;
    }
    Ok(())
}
