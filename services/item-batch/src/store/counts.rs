//! A batch's items counted by state (`batch_counts`): changed by the transactions that add and
//! move items, in the same transaction, so a read of them is exact; read by every status poll
//! and every scaler pass in one index probe, where counting the rows scanned the whole batch on
//! Postgres (see migration m0026).

use std::collections::BTreeMap;

use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QuerySelect};

use super::{BatchStore, DEAD, FAILED, PENDING, SUCCEEDED, Tally, count};
use crate::error::Result;

/// What a transaction changed in the counts, by batch and state; written by [`Counts::write`]
/// before the transaction commits.
#[derive(Debug, Default)]
pub(super) struct Counts(BTreeMap<(String, &'static str), i64>);

impl Counts {
    /// `n` items of `batch_id` added (pending).
    pub(super) fn added(&mut self, batch_id: &str, n: u64) {
        self.change(batch_id, PENDING, signed(n));
    }

    /// `n` items of `batch_id` moved from `from` to `to`.
    pub(super) fn moved(&mut self, batch_id: &str, from: &'static str, to: &'static str, n: u64) {
        if from != to {
            self.change(batch_id, from, -signed(n));
            self.change(batch_id, to, signed(n));
        }
    }

    fn change(&mut self, batch_id: &str, state: &'static str, n: i64) {
        if n != 0 {
            *self.0.entry((batch_id.to_string(), state)).or_default() += n;
        }
    }

    /// Adds the changes to the stored counts, in one statement whose rows go in (batch, state)
    /// order: transactions that change the same counts lock them in the same order.
    pub(super) async fn write(self, db: &impl ConnectionTrait) -> Result<()> {
        let rows: Vec<count::ActiveModel> = self
            .0
            .into_iter()
            .filter(|(_, n)| *n != 0)
            .map(|((batch_id, state), n)| count::ActiveModel {
                batch_id: Set(batch_id),
                state: Set(state.to_string()),
                n: Set(n),
            })
            .collect();
        if rows.is_empty() {
            return Ok(());
        }
        count::Entity::insert_many(rows)
            .on_conflict(
                OnConflict::columns([count::Column::BatchId, count::Column::State])
                    .value(count::Column::N, Expr::cust("batch_counts.n + excluded.n"))
                    .to_owned(),
            )
            .exec_without_returning(db)
            .await?;
        Ok(())
    }
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl BatchStore {
    /// A batch's items counted by state: exact, and one index probe however big the batch.
    pub async fn tally(&self, batch_id: &str) -> Result<Tally> {
        let rows: Vec<(String, i64)> = count::Entity::find()
            .select_only()
            .column(count::Column::State)
            .column(count::Column::N)
            .filter(count::Column::BatchId.eq(batch_id))
            .into_tuple()
            .all(&self.db)
            .await?;
        let mut tally = Tally::default();
        for (state, n) in rows {
            let n = u64::try_from(n).unwrap_or(0);
            tally.total += n;
            match state.as_str() {
                PENDING => tally.pending += n,
                SUCCEEDED => tally.succeeded += n,
                FAILED => tally.failed += n,
                DEAD => tally.dead += n,
                _ => {}
            }
        }
        Ok(tally)
    }
}
