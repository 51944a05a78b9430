//! Who holds what in a pass: dense ids for projects and (project, user) members, what each
//! holds with its fair-share weight, and shares as totally ordered set keys.

use std::cmp::Ordering;
use std::collections::HashMap;

use crate::policy::model::{Resources, Weights};

/// Orders `f64` shares totally, for set keys.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Share(pub(super) f64);

impl Eq for Share {}

impl PartialOrd for Share {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Share {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// What a project or a (project, user) holds, and its fair-share weight.
#[derive(Debug, Clone, Copy)]
pub(super) struct Holder {
    pub(super) held: Resources,
    pub(super) weight: f64,
}

impl Holder {
    pub(super) fn new(weight: f64) -> Holder {
        Holder {
            held: Resources::ZERO,
            weight,
        }
    }

    pub(super) fn share(&self, total: &Resources) -> Share {
        Share(self.held.dominant_share(total) / self.weight)
    }
}

/// A user inside a project: the unit of fair share and of the per-user queues.
#[derive(Debug, Clone, Copy)]
pub(super) struct Member {
    pub(super) project: usize,
    /// The user, across projects (user quotas count everywhere).
    pub(super) user: usize,
    pub(super) holder: Holder,
}

/// Names to dense ids, built from the jobs.
#[derive(Default)]
pub(super) struct Registry<'a> {
    pub(super) project_ids: HashMap<&'a str, usize>,
    pub(super) user_ids: HashMap<&'a str, usize>,
    pub(super) member_ids: HashMap<(usize, usize), usize>,
    pub(super) projects: Vec<Holder>,
    pub(super) members: Vec<Member>,
}

impl<'a> Registry<'a> {
    pub(super) fn member(&mut self, project: &'a str, user: &'a str, weights: &Weights) -> usize {
        let project_count = self.project_ids.len();
        let project_id = *self.project_ids.entry(project).or_insert(project_count);
        if project_id == self.projects.len() {
            self.projects.push(Holder::new(weights.project(project)));
        }
        let user_count = self.user_ids.len();
        let user_id = *self.user_ids.entry(user).or_insert(user_count);
        if let Some(&member) = self.member_ids.get(&(project_id, user_id)) {
            return member;
        }
        let member = self.members.len();
        self.members.push(Member {
            project: project_id,
            user: user_id,
            holder: Holder::new(weights.user(project, user)),
        });
        self.member_ids.insert((project_id, user_id), member);
        member
    }
}
