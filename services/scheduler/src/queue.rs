//! The queue order: FIFO by submit time, with a capacity check against what runners report.
//!
//! A job that fits no pool even when it is empty is passed over (it waits for a bigger pool);
//! any other job that does not fit now blocks the jobs behind it, so the queue stays FIFO.

use std::collections::BTreeMap;

use kiln_core::capacity::PoolCapacity;
use kiln_core::store::{JobRecord, Usage};

/// Tells whether `room` (free or total CPU, memory and GPUs of a pool) holds the job.
fn holds(room: &Usage, job: &JobRecord) -> bool {
    job.cpu_millis <= room.cpu_millis && job.memory_bytes <= room.memory_bytes && i64::from(job.gpus) <= room.gpus
}

/// Decides which queued jobs start now and on which pool.
///
/// `queued` is in FIFO order; `usage` is what active jobs hold per pool. Returns the index of
/// each job to place with its pool.
pub fn plan(
    queued: &[JobRecord],
    pools: &BTreeMap<String, PoolCapacity>,
    usage: &BTreeMap<String, Usage>,
) -> Vec<(usize, String)> {
    let total = |capacity: &PoolCapacity| Usage {
        cpu_millis: capacity.cpu_millis,
        memory_bytes: capacity.memory_bytes,
        gpus: capacity.gpus,
    };
    let mut free: BTreeMap<&str, Usage> = pools
        .iter()
        .map(|(name, capacity)| {
            let used = usage.get(name).copied().unwrap_or_default();
            let total = total(capacity);
            let free = Usage {
                cpu_millis: total.cpu_millis - used.cpu_millis,
                memory_bytes: total.memory_bytes - used.memory_bytes,
                gpus: total.gpus - used.gpus,
            };
            (name.as_str(), free)
        })
        .collect();
    let mut placements = Vec::new();
    for (index, job) in queued.iter().enumerate() {
        if !pools.values().any(|capacity| holds(&total(capacity), job)) {
            continue;
        }
        match free.iter_mut().find(|(_, free)| holds(free, job)) {
            Some((pool, free)) => {
                free.cpu_millis -= job.cpu_millis;
                free.memory_bytes -= job.memory_bytes;
                free.gpus -= i64::from(job.gpus);
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
            batch_id: String::new(),
        }
    }

    fn pool(cpu_millis: i64, memory_bytes: i64) -> PoolCapacity {
        PoolCapacity {
            cpu_millis,
            memory_bytes,
            gpus: 0,
            runners: 1,
        }
    }

    fn used(cpu_millis: i64) -> Usage {
        Usage {
            cpu_millis,
            ..Usage::default()
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
        let usage = BTreeMap::from([("local".to_string(), used(1500))]);
        assert!(plan(&[job(1000, 1)], &pools, &usage).is_empty());
        assert_eq!(plan(&[job(500, 1)], &pools, &usage).len(), 1);
    }

    #[test]
    fn head_of_line_blocks_but_impossible_jobs_do_not() {
        let pools = BTreeMap::from([("local".to_string(), pool(2000, 4096))]);
        let usage = BTreeMap::from([("local".to_string(), used(1000))]);
        // Too big for the pool at all: skipped. Fits later: blocks the small one behind it.
        let queued = [job(64_000, 1), job(2000, 1), job(100, 1)];
        assert!(plan(&queued, &pools, &usage).is_empty());
        let queued = [job(64_000, 1), job(100, 1)];
        assert_eq!(plan(&queued, &pools, &usage), vec![(1, "local".to_string())]);
    }

    #[test]
    fn gpu_jobs_go_where_gpus_are() {
        let mut gpu_job = job(100, 1);
        gpu_job.gpus = 2;
        let pools = BTreeMap::from([
            ("cpu".to_string(), pool(8000, 1 << 30)),
            (
                "gpu".to_string(),
                PoolCapacity {
                    gpus: 2,
                    ..pool(8000, 1 << 30)
                },
            ),
        ]);
        assert_eq!(
            plan(&[gpu_job.clone(), gpu_job.clone()], &pools, &BTreeMap::new()),
            vec![(0, "gpu".to_string())]
        );
        let no_gpus = BTreeMap::from([("cpu".to_string(), pool(8000, 1 << 30))]);
        assert!(plan(&[gpu_job], &no_gpus, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn no_runners_means_nothing_starts() {
        assert!(plan(&[job(1, 1)], &BTreeMap::new(), &BTreeMap::new()).is_empty());
    }
}
