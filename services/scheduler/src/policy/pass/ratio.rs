//! The fair-share-ratio order ([`Order::FairShareRatio`]): one order over every user of a
//! priority, across projects, by held dominant share over fair share (as YARN's fair scheduler
//! orders queues by usage over fair share).
//!
//! The fair shares are demand-capped hierarchical DRF: what all users hold is water-filled
//! between projects by weight, then between each project's users by weight, none above its
//! demand (what its running and pending jobs ask). They are computed once per priority and stay
//! put while the walk places jobs, so a placement changes only its user's ratio: one `O(log n)`
//! set update.

use std::collections::BTreeSet;

use super::{Pass, Queue, Share};
#[cfg(doc)]
use crate::policy::Order;

impl Pass<'_> {
    /// Walks the queues of one priority, the user with the smallest (held + placed) / fair
    /// share first, ties to the older head job.
    pub(super) fn merge_by_ratio(&mut self, queues: &mut [Queue<'_>], higher_priority: usize, competing: &mut usize) {
        let fair_shares = self.fair_shares();
        let mut order: BTreeSet<(Share, i64, usize)> = queues
            .iter()
            .enumerate()
            .map(|(index, queue)| self.ratio_key(queue, index, &fair_shares))
            .collect();
        while let Some((_, _, index)) = order.pop_first() {
            self.consider_head(&mut queues[index], higher_priority, competing);
            let queue = &queues[index];
            if queue.next < queue.jobs.len() {
                order.insert(self.ratio_key(queue, index, &fair_shares));
            }
        }
    }

    fn ratio_key(&self, queue: &Queue<'_>, index: usize, fair_shares: &[f64]) -> (Share, i64, usize) {
        let held = self.members[queue.member].holder.held.dominant_share(&self.total);
        let head = &self.input.pending[queue.jobs[queue.next]];
        (
            Share(ratio(held, fair_shares[queue.member])),
            head.submitted_at_ms,
            index,
        )
    }

    /// Each member's fair dominant share now. What is divided is what all members hold, or
    /// while the cluster has room and more is asked, up to the whole cluster (1), so a pass on
    /// an idle cluster does not divide nothing.
    fn fair_shares(&self) -> Vec<f64> {
        let held: f64 = self
            .members
            .iter()
            .map(|member| member.holder.held.dominant_share(&self.total))
            .sum();
        let demands: Vec<f64> = self
            .member_demands
            .iter()
            .map(|demand| demand.dominant_share(&self.total))
            .collect();
        let mut members_of_project: Vec<Vec<usize>> = vec![Vec::new(); self.projects.len()];
        let mut project_demands = vec![0.0; self.projects.len()];
        for (index, member) in self.members.iter().enumerate() {
            members_of_project[member.project].push(index);
            project_demands[member.project] += demands[index];
        }
        let capacity = held.max(project_demands.iter().sum::<f64>().min(1.0));
        let project_claims: Vec<(f64, f64)> = self
            .projects
            .iter()
            .zip(&project_demands)
            .map(|(project, &demand)| (project.weight, demand))
            .collect();
        let mut fair_shares = vec![0.0; self.members.len()];
        for (project_share, members) in water_fill(capacity, &project_claims)
            .into_iter()
            .zip(&members_of_project)
        {
            let claims: Vec<(f64, f64)> = members
                .iter()
                .map(|&member| (self.members[member].holder.weight, demands[member]))
                .collect();
            for (&member, share) in members.iter().zip(water_fill(project_share, &claims)) {
                fair_shares[member] = share;
            }
        }
        fair_shares
    }
}

/// Held over fair share: 0 for a user holding nothing, unbounded for one holding something
/// while its fair share is nothing.
fn ratio(held: f64, fair_share: f64) -> f64 {
    if held <= 0.0 {
        0.0
    } else if fair_share <= 0.0 {
        f64::INFINITY
    } else {
        held / fair_share
    }
}

/// Weighted max-min division of `capacity` between `claims` of (weight, demand): none gets more
/// than its demand, and what a capped claim leaves goes to the others by weight. The study
/// (`sched-sim`) measures fairness against the same division.
pub fn water_fill(capacity: f64, claims: &[(f64, f64)]) -> Vec<f64> {
    let mut shares = vec![0.0; claims.len()];
    let mut order: Vec<usize> = (0..claims.len()).filter(|&index| claims[index].1 > 0.0).collect();
    order.sort_by(|&a, &b| (claims[a].1 / claims[a].0).total_cmp(&(claims[b].1 / claims[b].0)));
    let mut left = capacity;
    let mut weight_left: f64 = order.iter().map(|&index| claims[index].0).sum();
    for (position, &index) in order.iter().enumerate() {
        let (weight, demand) = claims[index];
        let level = left / weight_left;
        if demand <= weight * level {
            shares[index] = demand;
            left -= demand;
            weight_left -= weight;
        } else {
            for &rest in &order[position..] {
                shares[rest] = claims[rest].0 * level;
            }
            break;
        }
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn water_fill_caps_by_demand_and_splits_the_rest_by_weight() {
        // 1 to divide: the small claim gets its 0.1, the rest 0.9 splits 2:1.
        let shares = water_fill(1.0, &[(1.0, 0.1), (2.0, 5.0), (1.0, 5.0)]);
        let expected = [0.1, 0.6, 0.3];
        for (share, expected) in shares.iter().zip(expected) {
            assert!((share - expected).abs() < 1e-9, "{shares:?}");
        }
        assert_eq!(water_fill(1.0, &[(1.0, 0.0), (1.0, 0.2)]), [0.0, 0.2]);
    }

    #[test]
    fn ratio_orders_nothing_held_first() {
        assert_eq!(ratio(0.0, 0.0), 0.0);
        assert_eq!(ratio(0.2, 0.4), 0.5);
        assert_eq!(ratio(0.1, 0.0), f64::INFINITY);
    }
}
