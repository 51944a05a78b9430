//! The queue order: FIFO by submit time, with a capacity check against what runners report.
//!
//! A job that fits no pool even when it is empty is passed over (it waits for a bigger pool);
//! any other job that does not fit now blocks the jobs behind it, so the queue stays FIFO.

use std::collections::BTreeMap;

use kiln_core::capacity::PoolCapacity;
use kiln_core::store::JobRecord;

/// Free CPU and memory of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Free {
    cpu_millis: i64,
    memory_bytes: i64,
}

/// Decides which queued jobs start now and on which pool.
///
/// `queued` is in FIFO order; `usage` is what active jobs hold per pool. Returns the index of
/// each job to place with its pool.
pub fn plan(
    queued: &[JobRecord],
    pools: &BTreeMap<String, PoolCapacity>,
    usage: &BTreeMap<String, (i64, i64)>,
) -> Vec<(usize, String)> {
    let mut free: BTreeMap<&str, Free> = pools
        .iter()
        .map(|(name, capacity)| {
            let (cpu_used, memory_used) = usage.get(name).copied().unwrap_or_default();
            let free = Free {
                cpu_millis: capacity.cpu_millis - cpu_used,
                memory_bytes: capacity.memory_bytes - memory_used,
            };
            (name.as_str(), free)
        })
        .collect();
    let mut placements = Vec::new();
    for (index, job) in queued.iter().enumerate() {
        let fits_ever = pools
            .values()
            .any(|capacity| job.cpu_millis <= capacity.cpu_millis && job.memory_bytes <= capacity.memory_bytes);
        if !fits_ever {
            continue;
        }
        let chosen = free
            .iter_mut()
            .find(|(_, free)| job.cpu_millis <= free.cpu_millis && job.memory_bytes <= free.memory_bytes);
        match chosen {
            Some((pool, free)) => {
                free.cpu_millis -= job.cpu_millis;
                free.memory_bytes -= job.memory_bytes;
                placements.push((index, pool.to_string()));
            }
            // The head of the line waits for capacity, and so does everyone behind it.
            None => break,
        }
    }
    placements
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(cpu_millis: i64, memory_bytes: i64) -> JobRecord {
        JobRecord {
            id: String::new(),
            owner_id: String::new(),
            project: String::new(),
            name: String::new(),
            command_json: "[]".into(),
            env_json: "{}".into(),
            cpu_millis,
            memory_bytes,
            code_digest: String::new(),
            state: "QUEUED".into(),
            version: 1,
            published_version: 1,
            attempt: 1,
            pool: String::new(),
            runner_id: String::new(),
            instance_id: String::new(),
            exit_code: None,
            reason: String::new(),
            stop_requested: false,
            created_at_ms: 0,
            updated_at_ms: 0,
            started_at_ms: None,
            finished_at_ms: None,
            image: String::new(),
            gpus: 0,
            max_runtime_secs: 0,
            datasets_json: "[]".into(),
        }
    }

    fn pool(cpu_millis: i64, memory_bytes: i64) -> PoolCapacity {
        PoolCapacity {
            cpu_millis,
            memory_bytes,
            runners: 1,
        }
    }

    #[test]
    fn places_in_order_until_full() {
        let pools = BTreeMap::from([("local".to_string(), pool(2000, 4096))]);
        let queued = [job(1000, 1024), job(1000, 1024), job(1000, 1024)];
        let placed = plan(&queued, &pools, &BTreeMap::new());
        assert_eq!(placed, vec![(0, "local".to_string()), (1, "local".to_string())]);
    }

    #[test]
    fn active_jobs_hold_capacity() {
        let pools = BTreeMap::from([("local".to_string(), pool(2000, 4096))]);
        let usage = BTreeMap::from([("local".to_string(), (1500, 0))]);
        assert!(plan(&[job(1000, 1)], &pools, &usage).is_empty());
        assert_eq!(plan(&[job(500, 1)], &pools, &usage).len(), 1);
    }

    #[test]
    fn head_of_line_blocks_but_impossible_jobs_do_not() {
        let pools = BTreeMap::from([("local".to_string(), pool(2000, 4096))]);
        let usage = BTreeMap::from([("local".to_string(), (1000, 0))]);
        // Too big for the pool at all: skipped. Fits later: blocks the small one behind it.
        let queued = [job(64_000, 1), job(2000, 1), job(100, 1)];
        assert!(plan(&queued, &pools, &usage).is_empty());
        let queued = [job(64_000, 1), job(100, 1)];
        assert_eq!(plan(&queued, &pools, &usage), vec![(1, "local".to_string())]);
    }

    #[test]
    fn no_runners_means_nothing_starts() {
        assert!(plan(&[job(1, 1)], &BTreeMap::new(), &BTreeMap::new()).is_empty());
    }
}
