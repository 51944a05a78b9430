//! The sweep records and the advisor's append-only record of each sweep, in the metadata
//! database (sea-orm; SQLite or Postgres).
//!
//! A sweep's events are numbered by `seq` (the leader appends them in order) and named by
//! `dedupe` (`suggest:3`, `observe:3:27`, `stop:3`, `end:3`, `registered`), which is
//! unique per sweep: an event recorded twice, by a leader that crashed before it knew it had
//! recorded it or by two leaders at once, is refused by the database. A new leader reads the
//! events back ([`crate::state::SweepView`]) and carries on from them, so no trial is suggested
//! twice and none is lost.

use kiln_core::authz::Visible;
use kiln_core::feed::Changes;
use kiln_core::ids::now_ms;
use kiln_core::runs::RunConfig;
use sea_orm::sea_query::OnConflict;
use sea_orm::{ActiveValue::Set, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

mod entity;

pub use entity::{event, sweep};
pub use sweep::Model as SweepRecord;

/// Sweep states as stored.
pub const RUNNING: &str = "running";
/// Asked to stop: the leader stops its live trials, then marks it `stopped`.
pub const STOPPING: &str = "stopping";
pub const STOPPED: &str = "stopped";
pub const FINISHED: &str = "finished";
pub const FAILED: &str = "failed";

/// Most live sweeps the leader tends at once.
const LIVE_LIMIT: u64 = 10_000;

/// The states the leader tends.
pub const LIVE: [&str; 2] = [RUNNING, STOPPING];

/// One entry of a sweep's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Event {
    /// Trial `trial`: its knobs and its job. The job is submitted first, with an idempotency
    /// key naming the sweep and the trial and the knobs in its record; the knobs recorded here
    /// are the job's, so a leader that died between the two adopts the job the first one made
    /// (and its knobs) instead of suggesting anew.
    Suggest { config: RunConfig, job_id: String },
    /// The objective's value at a step (with the resource it stands for), as the trial logged it.
    Observe { step: i64, resource: f64, value: f64 },
    /// The advisor stopped the trial early (or with the sweep).
    Stop { job_id: String, rung: f64, reason: String },
    /// The trial's job ended: its state and last objective value.
    End {
        state: String,
        value: Option<f64>,
        preemptions: i32,
        gpu_hours: f64,
    },
    /// The best trial became this model version.
    Registered { version: String },
}

impl Event {
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Suggest { .. } => "suggest",
            Event::Observe { .. } => "observe",
            Event::Stop { .. } => "stop",
            Event::End { .. } => "end",
            Event::Registered { .. } => "registered",
        }
    }

    /// What makes this event unique in its sweep.
    pub fn dedupe(&self, trial: i32) -> String {
        match self {
            Event::Observe { step, .. } => format!("observe:{trial}:{step}"),
            Event::Registered { .. } => "registered".into(),
            other => format!("{}:{trial}", other.kind()),
        }
    }
}

/// Trial number of the events about the sweep as a whole.
pub const SWEEP_EVENT: i32 = -1;

/// A recorded event.
#[derive(Debug, Clone, PartialEq)]
pub struct Recorded {
    pub seq: i64,
    pub trial: i32,
    pub event: Event,
    pub at_ms: i64,
}

/// The sweeps of the visible projects.
fn of_projects(visible: &Visible) -> sea_orm::Select<sweep::Entity> {
    let query = sweep::Entity::find();
    match visible {
        Visible::Only(projects) => query.filter(sweep::Column::Project.is_in(projects.clone())),
        Visible::All => query,
    }
}

/// SweepStore reads and writes the sweep tables.
#[derive(Clone)]
pub struct SweepStore {
    db: DatabaseConnection,
    /// Whom each committed change of a sweep is told (WatchSweeps).
    changes: Changes,
}

impl SweepStore {
    pub fn new(store: &kiln_core::store::Store) -> SweepStore {
        SweepStore {
            db: store.connection().clone(),
            changes: Changes::default(),
        }
    }

    /// Tells `changes` the sweeps each write changed.
    pub fn telling(self, changes: Changes) -> SweepStore {
        SweepStore { changes, ..self }
    }

    /// Tells the watchers of sweeps that `sweep_id` changed (its trials' jobs did).
    pub fn touch(&self, sweep_id: &str) {
        self.changes.touch(sweep_id);
    }

    pub async fn insert_sweep(&self, record: SweepRecord) -> Result<()> {
        let sweep_id = record.id.clone();
        sweep::Entity::insert(sweep::ActiveModel::from(record))
            .exec_without_returning(&self.db)
            .await?;
        self.touch(&sweep_id);
        Ok(())
    }

    /// The sweep after an update that changed `rows` of it; `None` when it changed none.
    async fn updated(&self, sweep_id: &str, rows: u64) -> Result<Option<SweepRecord>> {
        if rows == 0 {
            return Ok(None);
        }
        self.touch(sweep_id);
        Ok(Some(self.sweep(sweep_id).await?))
    }

    pub async fn sweep(&self, sweep_id: &str) -> Result<SweepRecord> {
        sweep::Entity::find_by_id(sweep_id)
            .one(&self.db)
            .await?
            .ok_or_else(|| Error::SweepNotFound {
                sweep_id: sweep_id.to_string(),
            })
    }

    pub async fn sweep_by_submit_key(&self, owner_id: &str, submit_key: &str) -> Result<Option<SweepRecord>> {
        Ok(sweep::Entity::find()
            .filter(sweep::Column::OwnerId.eq(owner_id))
            .filter(sweep::Column::SubmitKey.eq(submit_key))
            .one(&self.db)
            .await?)
    }

    /// Sweeps of the visible projects, newest first; only live ones unless `all`.
    pub async fn list_sweeps(&self, visible: &Visible, all: bool, limit: u64) -> Result<Vec<SweepRecord>> {
        let mut query = of_projects(visible);
        if !all {
            query = query.filter(sweep::Column::State.is_in(LIVE));
        }
        Ok(query
            .order_by_desc(sweep::Column::CreatedAtMs)
            .limit(limit)
            .all(&self.db)
            .await?)
    }

    /// Those of `sweep_ids` in the visible projects, whatever their state, newest first.
    pub async fn changed_sweeps(&self, sweep_ids: &[String], visible: &Visible) -> Result<Vec<SweepRecord>> {
        let mut changed = Vec::with_capacity(sweep_ids.len());
        for chunk in sweep_ids.chunks(500) {
            let query = of_projects(visible).filter(sweep::Column::Id.is_in(chunk.iter().cloned()));
            changed.extend(query.order_by_desc(sweep::Column::CreatedAtMs).all(&self.db).await?);
        }
        Ok(changed)
    }

    /// The sweeps the leader tends.
    pub async fn live_sweeps(&self) -> Result<Vec<SweepRecord>> {
        self.list_sweeps(&Visible::All, false, LIVE_LIMIT).await
    }

    /// Moves a sweep from one of `from` to `to`; `None` when it was in none of them.
    pub async fn set_state(
        &self,
        sweep_id: &str,
        from: &[&str],
        to: &str,
        reason: &str,
    ) -> Result<Option<SweepRecord>> {
        let finished = [STOPPED, FINISHED, FAILED].contains(&to).then(now_ms);
        let updated = sweep::Entity::update_many()
            .set(sweep::ActiveModel {
                state: Set(to.to_string()),
                reason: Set(reason.to_string()),
                finished_at_ms: Set(finished),
                ..Default::default()
            })
            .filter(sweep::Column::Id.eq(sweep_id))
            .filter(sweep::Column::State.is_in(from.iter().copied()))
            .exec(&self.db)
            .await?;
        self.updated(sweep_id, updated.rows_affected).await
    }

    /// Pauses a running sweep because its owner may no longer run jobs: it stops as by
    /// `StopSweep`, with `reason` as its reason and paused reason. `None` when it was not running.
    pub async fn pause(&self, sweep_id: &str, reason: &str) -> Result<Option<SweepRecord>> {
        let updated = sweep::Entity::update_many()
            .set(sweep::ActiveModel {
                state: Set(STOPPING.to_string()),
                reason: Set(reason.to_string()),
                paused_reason: Set(reason.to_string()),
                ..Default::default()
            })
            .filter(sweep::Column::Id.eq(sweep_id))
            .filter(sweep::Column::State.eq(RUNNING))
            .exec(&self.db)
            .await?;
        self.updated(sweep_id, updated.rows_affected).await
    }

    /// Lets a stopping or stopped sweep run again and lifts its pause; `None` when it was in
    /// neither state.
    pub async fn resume(&self, sweep_id: &str) -> Result<Option<SweepRecord>> {
        let updated = sweep::Entity::update_many()
            .set(sweep::ActiveModel {
                state: Set(RUNNING.to_string()),
                reason: Set(String::new()),
                paused_reason: Set(String::new()),
                finished_at_ms: Set(None),
                ..Default::default()
            })
            .filter(sweep::Column::Id.eq(sweep_id))
            .filter(sweep::Column::State.is_in([STOPPING, STOPPED]))
            .exec(&self.db)
            .await?;
        self.updated(sweep_id, updated.rows_affected).await
    }

    pub async fn set_registered(&self, sweep_id: &str, version: &str) -> Result<()> {
        sweep::Entity::update_many()
            .set(sweep::ActiveModel {
                registered: Set(version.to_string()),
                ..Default::default()
            })
            .filter(sweep::Column::Id.eq(sweep_id))
            .exec(&self.db)
            .await?;
        self.touch(sweep_id);
        Ok(())
    }

    /// A sweep's events in order.
    pub async fn events(&self, sweep_id: &str) -> Result<Vec<Recorded>> {
        self.events_after(sweep_id, -1).await
    }

    /// A sweep's events after `seq`, in order.
    pub async fn events_after(&self, sweep_id: &str, seq: i64) -> Result<Vec<Recorded>> {
        event::Entity::find()
            .filter(event::Column::SweepId.eq(sweep_id))
            .filter(event::Column::Seq.gt(seq))
            .order_by_asc(event::Column::Seq)
            .all(&self.db)
            .await?
            .into_iter()
            .map(recorded)
            .collect()
    }

    /// The stop events of a sweep (what ShouldStop reads).
    pub async fn stops(&self, sweep_id: &str) -> Result<Vec<Recorded>> {
        event::Entity::find()
            .filter(event::Column::SweepId.eq(sweep_id))
            .filter(event::Column::Kind.eq("stop"))
            .all(&self.db)
            .await?
            .into_iter()
            .map(recorded)
            .collect()
    }

    /// Appends events numbered from `first_seq`; an event already recorded (same dedupe) is
    /// skipped. Returns how many were new.
    pub async fn append(&self, sweep_id: &str, first_seq: i64, events: &[(i32, Event)]) -> Result<u64> {
        if events.is_empty() {
            return Ok(0);
        }
        let at_ms = now_ms();
        let rows = events
            .iter()
            .zip(first_seq..)
            .map(|((trial, event), seq)| {
                Ok(event::ActiveModel {
                    sweep_id: Set(sweep_id.to_string()),
                    seq: Set(seq),
                    dedupe: Set(event.dedupe(*trial)),
                    kind: Set(event.kind().to_string()),
                    trial: Set(*trial),
                    body_json: Set(serde_json::to_string(event).map_err(|error| Error::Internal(error.to_string()))?),
                    at_ms: Set(at_ms),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let inserted = event::Entity::insert_many(rows)
            .on_conflict(
                OnConflict::columns([event::Column::SweepId, event::Column::Dedupe])
                    .do_nothing()
                    .to_owned(),
            )
            .exec_without_returning(&self.db)
            .await?;
        if inserted > 0 {
            self.touch(sweep_id);
        }
        Ok(inserted)
    }

    /// The highest seq of a sweep's events (-1 when it has none).
    pub async fn last_seq(&self, sweep_id: &str) -> Result<i64> {
        let last = event::Entity::find()
            .filter(event::Column::SweepId.eq(sweep_id))
            .order_by_desc(event::Column::Seq)
            .one(&self.db)
            .await?;
        Ok(last.map_or(-1, |event| event.seq))
    }
}

fn recorded(row: event::Model) -> Result<Recorded> {
    let event = serde_json::from_str(&row.body_json)
        .map_err(|error| Error::Internal(format!("sweep {} event {}: {error}", row.sweep_id, row.seq)))?;
    Ok(Recorded {
        seq: row.seq,
        trial: row.trial,
        event,
        at_ms: row.at_ms,
    })
}
