//! The simulated cloud: the [`Cloud`] trait in process, for the provisioner's tests and `kiln up`
//! with thousands of instances.
//!
//! A [`SimCatalogue`] of types (shape, on-demand and spot price) × zones; launches idempotent by
//! intent id; instances pending until a seeded boot latency has passed; per-offering capacity
//! caps, unavailable offerings and call faults that tests set; spot notices and rebalance
//! recommendations through [`Cloud::interruptions`]; counts of calls per method. Simulated time
//! is the wall clock plus what [`SimCloud::advance`] added.

mod catalogue;
mod state;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use futures::stream::BoxStream;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;

pub use catalogue::{SimCatalogue, SimType};

use self::state::SimState;
use crate::timefmt;
use crate::{
    CapacityType, Cloud, CloudError, CloudInstance, InstanceId, Interruption, LaunchIntent, Launched, NoticeAction,
    Offering, OfferingKey, PoolSpec, PriceSource, TagSelector, Unavailable,
};

/// How the simulated cloud behaves over time.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Seeds the boot latencies: the same seed and calls give the same latencies.
    pub seed: u64,
    pub boot_min: Duration,
    pub boot_max: Duration,
    /// Between a spot notice and the end of the instance.
    pub notice: Duration,
    /// Live instances at once, at most (a `Quota` failure past it).
    pub max_instances: usize,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            seed: 1,
            boot_min: Duration::from_secs(20),
            boot_max: Duration::from_secs(90),
            notice: Duration::from_secs(120),
            max_instances: 10_000,
        }
    }
}

/// A trait method, for faults and call counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SimMethod {
    Create,
    Get,
    List,
    Terminate,
    Offerings,
}

/// What an armed fault does to a call.
#[derive(Debug, Clone, PartialEq)]
pub enum SimFault {
    /// The call fails with this error and does nothing.
    Error(CloudError),
    /// The call is carried out and its answer lost: `CloudError::Ambiguous`.
    Drop,
}

/// Calls per method so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimCalls {
    pub create: u64,
    pub get: u64,
    pub list: u64,
    pub terminate: u64,
    pub offerings: u64,
}

/// What the cloud would charge: every instance it ever launched, from launch to termination
/// (to now for a live one), at the price of its offering when it was launched.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SimBill {
    pub instances: usize,
    pub instance_hours: f64,
    pub cost: f64,
}

pub struct SimCloud {
    catalogue: SimCatalogue,
    config: SimConfig,
    state: Mutex<SimState>,
    events: broadcast::Sender<Interruption>,
}

impl SimCloud {
    pub fn new(catalogue: SimCatalogue, config: SimConfig) -> SimCloud {
        let (events, _) = broadcast::channel(4096);
        SimCloud {
            state: Mutex::new(SimState {
                rng: ChaCha8Rng::seed_from_u64(config.seed),
                offset: Duration::ZERO,
                // The last 48 bits of a v7 uuid are random.
                id_prefix: uuid::Uuid::now_v7().simple().to_string()[20..].to_owned(),
                next_id: 0,
                instances: BTreeMap::new(),
                by_intent: HashMap::new(),
                live: HashMap::new(),
                live_total: 0,
                capacity: HashMap::new(),
                unavailable: HashMap::new(),
                faults: Vec::new(),
                spot_prices: HashMap::new(),
                ending: BinaryHeap::new(),
                calls: SimCalls::default(),
            }),
            catalogue,
            config,
            events,
        }
    }

    pub fn catalogue(&self) -> &SimCatalogue {
        &self.catalogue
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().expect("sim cloud lock")
    }

    fn publish(&self, events: Vec<Interruption>) {
        for event in events {
            // No subscriber is fine: the events are the cloud side's, optional.
            let _ = self.events.send(event);
        }
    }

    /// Moves simulated time forward: boots finish, notices run out.
    pub fn advance(&self, by: Duration) {
        let gone = {
            let mut state = self.lock();
            state.offset += by;
            state.sweep()
        };
        self.publish(gone);
    }

    /// At most `capacity` live instances of the offering (`None`: no cap).
    pub fn set_capacity(&self, key: &OfferingKey, capacity: Option<u32>) {
        let mut state = self.lock();
        match capacity {
            Some(cap) => state.capacity.insert(key.clone(), cap),
            None => state.capacity.remove(key),
        };
    }

    /// The offering fails every launch with this reason until cleared with `None`.
    pub fn set_unavailable(&self, key: &OfferingKey, reason: Option<Unavailable>) {
        let mut state = self.lock();
        match reason {
            Some(reason) => state.unavailable.insert(key.clone(), reason),
            None => state.unavailable.remove(key),
        };
    }

    /// The next `times` calls of `method` meet `fault`.
    pub fn fail_next(&self, method: SimMethod, fault: SimFault, times: u32) {
        if times > 0 {
            self.lock().faults.push((method, fault, times));
        }
    }

    /// The spot price of a type in a zone from now on (else the catalogue's).
    pub fn set_spot_price(&self, instance_type: &str, zone: &str, price: f64) {
        let mut state = self.lock();
        let at_ms = timefmt::millis(state.wall());
        state
            .spot_prices
            .insert((instance_type.to_owned(), zone.to_owned()), (price, at_ms));
    }

    /// A spot notice: `Notice { terminate }` now, and the instance ends when the configured
    /// notice has passed (`Gone` then). False for an unknown or ended instance.
    pub fn preempt(&self, id: &InstanceId) -> bool {
        let events = {
            let mut state = self.lock();
            let now = state.now();
            let at = state.wall() + self.config.notice;
            let Some(sim) = state.instances.get_mut(id) else {
                return false;
            };
            if !sim.instance.state.is_live() || sim.ends_at.is_some() {
                return false;
            }
            sim.ends_at = Some(now + self.config.notice);
            state.ending.push(Reverse((now + self.config.notice, id.clone())));
            let mut events = vec![Interruption::Notice {
                instance: id.clone(),
                action: NoticeAction::Terminate,
                at,
            }];
            events.extend(state.sweep());
            events
        };
        self.publish(events);
        true
    }

    /// A rebalance recommendation for a live instance; false for an unknown or ended one.
    pub fn rebalance(&self, id: &InstanceId) -> bool {
        let event = {
            let state = self.lock();
            match state.instances.get(id) {
                Some(sim) if sim.instance.state.is_live() => Interruption::Rebalance {
                    instance: id.clone(),
                    at: state.wall(),
                },
                _ => return false,
            }
        };
        self.publish(vec![event]);
        true
    }

    pub fn calls(&self) -> SimCalls {
        self.lock().calls
    }

    /// The bill of every instance launched so far, across every cluster.
    pub fn bill(&self) -> SimBill {
        let state = self.lock();
        let now = state.wall();
        let mut bill = SimBill::default();
        for sim in state.instances.values() {
            let until = sim.ended_at.unwrap_or(now);
            let hours = until
                .duration_since(sim.instance.launched_at)
                .unwrap_or_default()
                .as_secs_f64()
                / 3600.0;
            bill.instances += 1;
            bill.instance_hours += hours;
            bill.cost += hours * sim.price_per_hour;
        }
        bill
    }

    /// When an instance's boot ended (simulated wall time), once it has.
    pub fn running_since(&self, id: &InstanceId) -> Option<SystemTime> {
        let state = self.lock();
        let sim = state.instances.get(id)?;
        let ago = state.now().checked_duration_since(sim.running_at)?;
        Some(state.wall() - ago)
    }

    /// Live instances (pending, running, stopping) across every cluster.
    pub fn live_instances(&self) -> usize {
        self.lock().live_total
    }

    /// Counts the call, ends what is due, and applies an armed fault.
    fn begin(&self, method: SimMethod) -> Result<Option<SimFault>, CloudError> {
        let (gone, fault) = {
            let mut state = self.lock();
            let calls = &mut state.calls;
            match method {
                SimMethod::Create => calls.create += 1,
                SimMethod::Get => calls.get += 1,
                SimMethod::List => calls.list += 1,
                SimMethod::Terminate => calls.terminate += 1,
                SimMethod::Offerings => calls.offerings += 1,
            }
            (state.sweep(), state.take_fault(method))
        };
        self.publish(gone);
        match fault {
            Some(SimFault::Error(error)) => Err(error),
            other => Ok(other),
        }
    }
}

fn dropped(fault: Option<SimFault>, what: &str) -> Result<(), CloudError> {
    match fault {
        Some(SimFault::Drop) => Err(CloudError::Ambiguous(format!("the sim dropped the answer to {what}"))),
        _ => Ok(()),
    }
}

#[async_trait::async_trait]
impl Cloud for SimCloud {
    fn name(&self) -> &'static str {
        "sim"
    }

    async fn create(&self, intent: &LaunchIntent) -> Result<Launched, CloudError> {
        let fault = self.begin(SimMethod::Create)?;
        if intent.candidates.is_empty() || intent.count == 0 {
            return Err(CloudError::Invalid(format!("intent {} asks for nothing", intent.id)));
        }
        if let Some(other) = intent.candidates.iter().find(|c| c.key.capacity != intent.capacity) {
            return Err(CloudError::Invalid(format!(
                "intent {} is {} but names {}",
                intent.id, intent.capacity, other.key
            )));
        }
        intent.check_placement()?;
        let launched = {
            let mut state = self.lock();
            if let Some(ids) = state.by_intent.get(&intent.id) {
                // The same intent again: its instances, nothing new (a ClientToken replay).
                let instances = ids
                    .iter()
                    .filter_map(|id| state.instances.get(id))
                    .map(|s| state.view(s))
                    .collect();
                Launched {
                    instances,
                    failures: Vec::new(),
                }
            } else {
                let catalogue = &self.catalogue;
                let offered = |key: &OfferingKey| catalogue.offers(&key.instance_type, &key.zone);
                state.launch(intent, &self.config, &offered)
            }
        };
        dropped(fault, "create")?;
        Ok(launched)
    }

    async fn get(&self, id: &InstanceId) -> Result<Option<CloudInstance>, CloudError> {
        let fault = self.begin(SimMethod::Get)?;
        let found = {
            let state = self.lock();
            state.instances.get(id).map(|sim| state.view(sim))
        };
        dropped(fault, "get")?;
        Ok(found)
    }

    async fn list(&self, selector: &TagSelector) -> Result<Vec<CloudInstance>, CloudError> {
        let fault = self.begin(SimMethod::List)?;
        let found = {
            let state = self.lock();
            match selector.intent.and_then(|intent| state.by_intent.get(&intent)) {
                Some(ids) => ids
                    .iter()
                    .filter_map(|id| state.instances.get(id))
                    .filter(|sim| state.matches(sim, selector))
                    .map(|sim| state.view(sim))
                    .collect(),
                None if selector.intent.is_some() => Vec::new(),
                None => state
                    .instances
                    .values()
                    .filter(|sim| state.matches(sim, selector))
                    .map(|sim| state.view(sim))
                    .collect(),
            }
        };
        dropped(fault, "list")?;
        Ok(found)
    }

    async fn terminate(&self, ids: &[InstanceId]) -> Result<(), CloudError> {
        let fault = self.begin(SimMethod::Terminate)?;
        let gone: Vec<Interruption> = {
            let mut state = self.lock();
            ids.iter()
                .filter(|id| state.end(id))
                .map(|id| Interruption::Gone { instance: id.clone() })
                .collect()
        };
        self.publish(gone);
        dropped(fault, "terminate")
    }

    async fn offerings(&self, pool: &PoolSpec) -> Result<Vec<Offering>, CloudError> {
        let fault = self.begin(SimMethod::Offerings)?;
        let spot_prices = self.lock().spot_prices.clone();
        let zones: Vec<&String> = if pool.zones.is_empty() {
            self.catalogue.zones.iter().collect()
        } else {
            pool.zones.iter().filter(|z| self.catalogue.zones.contains(z)).collect()
        };
        let mut out = Vec::new();
        for zone in zones {
            for sim_type in &self.catalogue.types {
                if !pool.instance_types.is_empty() && !pool.instance_types.contains(&sim_type.name) {
                    continue;
                }
                if pool
                    .requirements
                    .as_ref()
                    .is_some_and(|r| !r.admits(&sim_type.name, &sim_type.shape))
                    || !self.catalogue.offers(&sim_type.name, zone)
                {
                    continue;
                }
                for &capacity in &pool.capacity_types {
                    let (price_per_hour, price_source) = match capacity {
                        CapacityType::OnDemand => (
                            pool.on_demand_prices
                                .get(&sim_type.name)
                                .copied()
                                .unwrap_or(sim_type.on_demand_per_hour),
                            PriceSource::Configured,
                        ),
                        CapacityType::Spot => match spot_prices.get(&(sim_type.name.clone(), zone.clone())) {
                            Some(&(price, at_ms)) => (price, PriceSource::SpotHistory { at_ms }),
                            None => (sim_type.spot_per_hour, PriceSource::Configured),
                        },
                    };
                    out.push(Offering {
                        key: OfferingKey {
                            instance_type: sim_type.name.clone(),
                            zone: zone.clone(),
                            capacity,
                        },
                        shape: sim_type.shape.clone(),
                        price_per_hour,
                        price_source,
                        subnet: None,
                    });
                }
            }
        }
        dropped(fault, "offerings")?;
        Ok(out)
    }

    fn interruptions(&self) -> Option<BoxStream<'static, Interruption>> {
        let stream = BroadcastStream::new(self.events.subscribe()).filter_map(|event| async move { event.ok() });
        Some(stream.boxed())
    }
}

#[cfg(test)]
mod tests;
