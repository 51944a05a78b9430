//! Why a job waits, in data for the caller and in plain sentences for `kiln explain`.

use std::fmt;

use super::model::{MarketPolicy, Order, QuotaResource, QuotaScope, Resources};

/// Why a pending job was not placed by a pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Wait {
    /// Starting it would take a scope over a running quota. It does not hold up other jobs.
    Quota {
        scope: QuotaScope,
        resource: QuotaResource,
        limit: i64,
        /// What the scope's running jobs, and the jobs this pass placed, hold.
        used: i64,
        asked: i64,
    },
    /// No live runner of a pool could hold it even when empty (among pools offering spot, when
    /// it insists on spot), however much its pool has over all its runners: a job runs on one
    /// runner. It does not hold up other jobs, and is placed once a runner large enough reports.
    /// `pool` is the one it asked for, if any.
    NoPoolFits {
        asked: Resources,
        market: MarketPolicy,
        pool: String,
    },
    /// Every runner that could hold it lacks room now. `pools` lists what runners (the ones it
    /// lacks least on) have free for it; `reserved_on` names the runner whose room is held for
    /// it as it frees up.
    NoCapacity {
        pools: Vec<(String, Resources)>,
        reserved_on: Option<String>,
    },
    /// No live runner can hold it, but machines `pools` can launch could (their largest
    /// offering holds it): it is the provisioner's demand, and starts once such a runner
    /// registers. Quotas passed.
    Provisioning { pools: Vec<String> },
    /// It would fit on `pool`, but that room is held for `for_job`, a job ahead of it.
    Reserved { pool: String, for_job: String },
    /// It preempts `victims` (of lower priority, or for fair share) on `pool`, whose room is held
    /// for it, and starts once they stop.
    WaitingForPreemption { pool: String, victims: Vec<String> },
    /// A gang job whose `nodes` all start together: only `fit` of them have room now. The rest
    /// are the provisioner's demand on `pools` (those whose machines hold a node), launched
    /// together.
    Gang { nodes: u32, fit: u32, pools: Vec<String> },
}

impl Wait {
    /// Tells whether the job competes for capacity (and so counts as ahead of later jobs).
    pub fn competes(&self) -> bool {
        !matches!(self, Wait::Quota { .. } | Wait::NoPoolFits { .. })
    }
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wait::Quota {
                scope,
                resource,
                limit,
                used,
                asked,
            } => {
                write!(
                    f,
                    "the {resource} quota of {scope} is {}, {} {} in use and the job asks {}",
                    resource.format(*limit),
                    resource.format(*used),
                    if *used == 1 { "is" } else { "are" },
                    resource.format(*asked),
                )?;
                if asked > limit {
                    write!(
                        f,
                        ", more than the quota itself: it cannot start until the quota is raised"
                    )?;
                }
                Ok(())
            }
            Wait::NoPoolFits { asked, market, pool } => {
                let spot = if *market == MarketPolicy::Spot {
                    " offering spot"
                } else {
                    ""
                };
                if pool.is_empty() {
                    write!(
                        f,
                        "no runner of any pool{spot} can hold it even when empty (it asks {asked}; a job runs on one runner, never across several)"
                    )
                } else {
                    write!(
                        f,
                        "it asks for pool {pool}, and no runner of that pool{spot} can hold it even when empty (it asks {asked})"
                    )
                }
            }
            Wait::NoCapacity { pools, reserved_on } => {
                f.write_str("no pool that can hold it has room now (free: ")?;
                for (position, (pool, free)) in pools.iter().enumerate() {
                    if position > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{pool} {free}")?;
                }
                f.write_str(")")?;
                if let Some(pool) = reserved_on {
                    write!(f, "; room on {pool} is held for it as jobs there finish")?;
                }
                Ok(())
            }
            Wait::Provisioning { pools } => write!(
                f,
                "no live runner can hold it; the provisioner launches a machine for it (pool {})",
                pools.join(" or ")
            ),
            Wait::Reserved { pool, for_job } => write!(
                f,
                "it would fit on {pool}, but that room is held for job {for_job}, which is ahead of it and bigger"
            ),
            Wait::WaitingForPreemption { pool, victims } => {
                let jobs = if victims.len() == 1 { "job stops" } else { "jobs stop" };
                write!(
                    f,
                    "it starts on {pool} once {} preempted {jobs} ({})",
                    victims.len(),
                    victims.join(", ")
                )
            }
            Wait::Gang { nodes, fit, .. } => write!(
                f,
                "a gang of {nodes} nodes starts whole or not at all: runners have room for {fit} of them now"
            ),
        }
    }
}

/// The jobs before a job in a pass's order that compete for capacity (placed, or waiting for
/// capacity), by why they come first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ahead {
    pub higher_priority: usize,
    /// Jobs of the same priority from other users first in the fair-share `order`: from
    /// projects or users with a smaller weighted dominant share, or from users further below
    /// their fair share (an older head job on a tie).
    pub fair_share: usize,
    /// Older jobs of the same user in the same project.
    pub same_user: usize,
    /// The order of the pass, which says what `fair_share` counts.
    pub order: Order,
}

impl Ahead {
    pub fn total(&self) -> usize {
        self.higher_priority + self.fair_share + self.same_user
    }
}

impl fmt::Display for Ahead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.total();
        match total {
            0 => return f.write_str("no job is ahead of it"),
            1 => f.write_str("1 job is ahead of it: ")?,
            _ => write!(f, "{total} jobs are ahead of it: ")?,
        }
        let fair_share = match self.order {
            Order::Hierarchical => "of projects or users with a smaller weighted share",
            Order::FairShareRatio => "of users further below their fair share",
        };
        let parts = [
            (self.higher_priority, "of higher priority"),
            (self.fair_share, fair_share),
            (self.same_user, "older of the same user"),
        ];
        let mut first = true;
        for (count, why) in parts {
            if count == 0 {
                continue;
            }
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{count} {why}")?;
        }
        Ok(())
    }
}

/// A job the pass did not place: why, and what is ahead of it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobWait {
    /// Its index in [`Input::pending`](super::Input::pending).
    pub job: usize,
    pub ahead: Ahead,
    pub reason: Wait,
}

/// Reads like `it waits: no pool that can hold it has room now (free: ...); 3 jobs are ahead of it: ...`.
impl fmt::Display for JobWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "it waits: {}", self.reason)?;
        if self.reason.competes() {
            write!(f, "; {}", self.ahead)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: i64 = 1 << 30;

    #[test]
    fn waits_read_as_sentences() {
        let quota = Wait::Quota {
            scope: QuotaScope::User("alice".into()),
            resource: QuotaResource::Gpus,
            limit: 4,
            used: 4,
            asked: 1,
        };
        assert_eq!(
            quota.to_string(),
            "the GPU quota of user:alice is 4 GPUs, 4 GPUs are in use and the job asks 1 GPU"
        );
        let too_big = Wait::Quota {
            scope: QuotaScope::Project("vision".into()),
            resource: QuotaResource::Memory,
            limit: 8 * GIB,
            used: 0,
            asked: 16 * GIB,
        };
        assert!(
            too_big
                .to_string()
                .ends_with("it cannot start until the quota is raised")
        );
        let no_capacity = Wait::NoCapacity {
            pools: vec![
                ("c.large".into(), Resources::new(500, GIB, 0)),
                ("g.xlarge".into(), Resources::ZERO),
            ],
            reserved_on: Some("c.large".into()),
        };
        assert_eq!(
            no_capacity.to_string(),
            "no pool that can hold it has room now (free: c.large 0.5 CPUs, 1 GiB; g.xlarge 0 CPUs, 0 GiB); \
             room on c.large is held for it as jobs there finish"
        );
        let preempting = Wait::WaitingForPreemption {
            pool: "g.xlarge".into(),
            victims: vec!["j1".into(), "j2".into()],
        };
        assert_eq!(
            preempting.to_string(),
            "it starts on g.xlarge once 2 preempted jobs stop (j1, j2)"
        );
    }

    #[test]
    fn ahead_says_why() {
        let wait = JobWait {
            job: 0,
            ahead: Ahead {
                higher_priority: 2,
                fair_share: 0,
                same_user: 1,
                order: Order::Hierarchical,
            },
            reason: Wait::Reserved {
                pool: "p".into(),
                for_job: "big".into(),
            },
        };
        assert_eq!(
            wait.to_string(),
            "it waits: it would fit on p, but that room is held for job big, which is ahead of it and bigger; \
             3 jobs are ahead of it: 2 of higher priority, 1 older of the same user"
        );
        assert_eq!(Ahead::default().to_string(), "no job is ahead of it");
        let by_ratio = Ahead {
            fair_share: 2,
            order: Order::FairShareRatio,
            ..Ahead::default()
        };
        assert_eq!(
            by_ratio.to_string(),
            "2 jobs are ahead of it: 2 of users further below their fair share"
        );
    }
}
