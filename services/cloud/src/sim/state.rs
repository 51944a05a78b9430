//! The simulated cloud's state behind one lock: instances indexed by id and by intent, live
//! counts per offering for the capacity caps, and the heap of instances whose notice runs out.
//! Every operation is O(its answer) or O(log n), so thousands of instances stay cheap.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::time::{Duration, Instant, SystemTime};

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use super::{SimCalls, SimConfig, SimFault, SimMethod};
use crate::{
    CloudInstance, InstanceId, InstanceState, IntentId, Interruption, LaunchIntent, Launched, Offering,
    OfferingFailure, OfferingKey, TagSelector, Unavailable,
};

pub(super) struct SimInstance {
    pub(super) instance: CloudInstance,
    pub(super) cluster: String,
    pub(super) running_at: Instant,
    /// When a preemption notice runs out.
    pub(super) ends_at: Option<Instant>,
    /// What the instance costs an hour: its offering's price when it was launched.
    pub(super) price_per_hour: f64,
    /// When it was terminated (simulated wall time), for the bill.
    pub(super) ended_at: Option<SystemTime>,
}

/// Instances of one offering a launch takes: the offering, its price an hour, how many.
type Take = (OfferingKey, f64, u32);

pub(super) struct SimState {
    pub(super) rng: ChaCha8Rng,
    /// Simulated time ahead of the wall clock (`SimCloud::advance`).
    pub(super) offset: Duration,
    /// Random per cloud, so two clouds (a restart over the same store) never make the same id.
    pub(super) id_prefix: String,
    pub(super) next_id: u64,
    pub(super) instances: BTreeMap<InstanceId, SimInstance>,
    pub(super) by_intent: HashMap<IntentId, Vec<InstanceId>>,
    pub(super) live: HashMap<OfferingKey, u32>,
    pub(super) live_total: usize,
    pub(super) capacity: HashMap<OfferingKey, u32>,
    pub(super) unavailable: HashMap<OfferingKey, Unavailable>,
    pub(super) faults: Vec<(SimMethod, SimFault, u32)>,
    pub(super) spot_prices: HashMap<(String, String), (f64, i64)>,
    pub(super) ending: BinaryHeap<Reverse<(Instant, InstanceId)>>,
    pub(super) calls: SimCalls,
}

impl SimState {
    pub(super) fn now(&self) -> Instant {
        Instant::now() + self.offset
    }

    pub(super) fn wall(&self) -> SystemTime {
        SystemTime::now() + self.offset
    }

    /// The fault to act on for this call, if one is armed.
    pub(super) fn take_fault(&mut self, method: SimMethod) -> Option<SimFault> {
        let index = self
            .faults
            .iter()
            .position(|(m, _, times)| *m == method && *times > 0)?;
        let (_, fault, times) = &mut self.faults[index];
        *times -= 1;
        let fault = fault.clone();
        if *times == 0 {
            self.faults.remove(index);
        }
        Some(fault)
    }

    /// Ends the instances whose notice ran out; their `Gone` events.
    pub(super) fn sweep(&mut self) -> Vec<Interruption> {
        let now = self.now();
        let mut gone = Vec::new();
        while let Some(Reverse((at, _))) = self.ending.peek()
            && *at <= now
        {
            let Some(Reverse((_, id))) = self.ending.pop() else {
                break;
            };
            if self.end(&id) {
                gone.push(Interruption::Gone { instance: id });
            }
        }
        gone
    }

    /// Marks an instance terminated; false when it was unknown or already ended.
    pub(super) fn end(&mut self, id: &InstanceId) -> bool {
        let Some(sim) = self.instances.get_mut(id) else {
            return false;
        };
        if sim.instance.state == InstanceState::Terminated {
            return false;
        }
        sim.instance.state = InstanceState::Terminated;
        // A noticed instance ended when its notice ran out, however late the sweep came.
        let late = sim
            .ends_at
            .map(|at| (Instant::now() + self.offset).saturating_duration_since(at))
            .unwrap_or_default();
        sim.ended_at = Some(SystemTime::now() + self.offset - late);
        let key = sim.instance.key.clone();
        if let Some(count) = self.live.get_mut(&key) {
            *count = count.saturating_sub(1);
        }
        self.live_total = self.live_total.saturating_sub(1);
        true
    }

    /// An instance as a caller sees it now (pending until its boot latency has passed).
    pub(super) fn view(&self, sim: &SimInstance) -> CloudInstance {
        let mut instance = sim.instance.clone();
        if instance.state == InstanceState::Pending && self.now() >= sim.running_at {
            instance.state = InstanceState::Running;
        }
        instance
    }

    pub(super) fn matches(&self, sim: &SimInstance, selector: &TagSelector) -> bool {
        sim.cluster == selector.cluster
            && selector
                .pool
                .as_ref()
                .is_none_or(|p| sim.instance.pool.as_ref() == Some(p))
            && selector.intent.is_none_or(|i| sim.instance.intent == Some(i))
            && (!selector.live_only || sim.instance.state.is_live())
    }

    /// Launches what the intent's candidates allow: the first zone group that meets `count`
    /// (or the fullest), nothing below `min_count`.
    pub(super) fn launch(
        &mut self,
        intent: &LaunchIntent,
        config: &SimConfig,
        offered: &dyn Fn(&OfferingKey) -> bool,
    ) -> Launched {
        let groups: Vec<Vec<&Offering>> = if intent.single_zone {
            let mut zones: Vec<&str> = Vec::new();
            for candidate in &intent.candidates {
                if !zones.contains(&candidate.key.zone.as_str()) {
                    zones.push(&candidate.key.zone);
                }
            }
            zones
                .iter()
                .map(|zone| intent.candidates.iter().filter(|c| c.key.zone == *zone).collect())
                .collect()
        } else {
            vec![intent.candidates.iter().collect()]
        };
        let mut failures = Vec::new();
        let mut best: Option<(Vec<Take>, u32)> = None;
        for group in groups {
            let (plan, filled) = self.plan(&group, intent.count, config, offered, &mut failures);
            if best.as_ref().is_none_or(|(_, most)| filled > *most) {
                best = Some((plan, filled));
            }
            if filled >= intent.count {
                break;
            }
        }
        let (plan, filled) = best.unwrap_or_default();
        if filled < intent.min_count.max(1) {
            return Launched {
                instances: Vec::new(),
                failures,
            };
        }
        let mut instances = Vec::new();
        for (key, price_per_hour, count) in plan {
            for _ in 0..count {
                instances.push(self.start(intent, &key, price_per_hour, config));
            }
        }
        Launched { instances, failures }
    }

    fn plan(
        &self,
        group: &[&Offering],
        count: u32,
        config: &SimConfig,
        offered: &dyn Fn(&OfferingKey) -> bool,
        failures: &mut Vec<OfferingFailure>,
    ) -> (Vec<Take>, u32) {
        let mut left = count;
        let mut room_total = config.max_instances.saturating_sub(self.live_total) as u32;
        let mut plan = Vec::new();
        for candidate in group {
            if left == 0 {
                break;
            }
            let key = &candidate.key;
            let fail = |reason: Unavailable, message: &str| OfferingFailure {
                key: key.clone(),
                reason,
                message: message.to_owned(),
            };
            if !offered(key) {
                failures.push(fail(
                    Unavailable::NotOffered,
                    "the sim does not offer this type in this zone",
                ));
                continue;
            }
            if let Some(reason) = self.unavailable.get(key) {
                failures.push(fail(reason.clone(), "injected by the test"));
                continue;
            }
            let room = match self.capacity.get(key) {
                Some(cap) => cap.saturating_sub(self.live.get(key).copied().unwrap_or(0)),
                None => u32::MAX,
            };
            let take = left.min(room).min(room_total);
            if take < left {
                failures.push(if room_total < left.min(room) {
                    fail(
                        Unavailable::Quota {
                            name: "sim instances".to_owned(),
                        },
                        "the sim's instance cap is reached",
                    )
                } else {
                    fail(Unavailable::NoCapacity, "the offering's capacity cap is reached")
                });
            }
            if take > 0 {
                plan.push((key.clone(), candidate.price_per_hour, take));
                left -= take;
                room_total -= take;
            }
        }
        (plan, count - left)
    }

    fn start(
        &mut self,
        intent: &LaunchIntent,
        key: &OfferingKey,
        price_per_hour: f64,
        config: &SimConfig,
    ) -> CloudInstance {
        self.next_id += 1;
        let id = InstanceId(format!("sim-i-{}{:08x}", self.id_prefix, self.next_id));
        let (low, high) = (config.boot_min.as_millis() as u64, config.boot_max.as_millis() as u64);
        let boot = Duration::from_millis(self.rng.random_range(low..=high.max(low)));
        let instance = CloudInstance {
            id: id.clone(),
            intent: Some(intent.id),
            pool: Some(intent.pool.clone()),
            key: key.clone(),
            state: InstanceState::Pending,
            launched_at: self.wall(),
            private_ip: Some(std::net::IpAddr::from([
                10,
                0,
                (self.next_id >> 8) as u8,
                self.next_id as u8,
            ])),
        };
        self.instances.insert(
            id.clone(),
            SimInstance {
                instance: instance.clone(),
                cluster: intent.cluster.clone(),
                running_at: self.now() + boot,
                ends_at: None,
                price_per_hour,
                ended_at: None,
            },
        );
        self.by_intent.entry(intent.id).or_default().push(id);
        *self.live.entry(key.clone()).or_insert(0) += 1;
        self.live_total += 1;
        instance
    }
}
