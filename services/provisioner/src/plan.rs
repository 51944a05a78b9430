//! From demand to machines: one pool's cycle as a pure function (docs/provisioner.md section 7).
//!
//! Jobs first go onto the machines already on their way (booting instances, intents in flight),
//! largest first, so a cycle never launches again for jobs a machine is coming for. The rest
//! are packed first-fit decreasing onto new machines of their capacity type: a job goes to the
//! open machine where it fits and whose cheapest remaining candidate offering gets dearer the
//! least; otherwise it opens a machine whose candidates are every available offering that holds
//! it. A machine costlier than its jobs' own cheapest machines is split into those. Machines
//! with the same candidates become one intent of `count` machines. `max-instances` caps the
//! pool; what is cut stays demand, held back with the reason.
//!
//! A gang (a job asking for several nodes) is planned before the rest and never packed with
//! them: machines on their way hold what nodes they can, and the others become one intent of
//! their own, one machine per node, launched together (one call, one zone, the pool's
//! placement group) or not at all. `max-instances` takes a gang whole or holds it back whole.

mod gangs;

use std::collections::BTreeMap;

use kiln_cloud::{CapacityType, Offering, OfferingKey, Shape};
use kiln_core::capacity::Instance;
use kiln_core::provisioning::DemandJob;

/// At most this many offerings go into one create call (Karpenter's `maxInstanceTypes`).
pub const MAX_CANDIDATES: usize = 60;

/// Resources as the planner adds them up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Room {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub gpus: i64,
    /// Jobs' disks (`--disk`): what the machine's root volume is sized for.
    pub disk_bytes: i64,
}

impl Room {
    /// A machine of `shape` whose root volume can give its jobs `disk_bytes`.
    pub fn of_shape(shape: &Shape, disk_bytes: i64) -> Room {
        Room {
            cpu_millis: shape.cpu_millis,
            memory_bytes: shape.memory_bytes,
            gpus: shape.gpus,
            disk_bytes,
        }
    }

    pub fn of_job(job: &Instance) -> Room {
        Room {
            cpu_millis: job.cpu_millis,
            memory_bytes: job.memory_bytes,
            gpus: job.gpus,
            disk_bytes: job.disk_bytes,
        }
    }

    fn plus(self, other: Room) -> Room {
        Room {
            cpu_millis: self.cpu_millis + other.cpu_millis,
            memory_bytes: self.memory_bytes + other.memory_bytes,
            gpus: self.gpus + other.gpus,
            disk_bytes: self.disk_bytes + other.disk_bytes,
        }
    }

    fn minus(self, other: Room) -> Room {
        Room {
            cpu_millis: self.cpu_millis - other.cpu_millis,
            memory_bytes: self.memory_bytes - other.memory_bytes,
            gpus: self.gpus - other.gpus,
            disk_bytes: self.disk_bytes - other.disk_bytes,
        }
    }

    pub fn fits_in(self, room: Room) -> bool {
        self.cpu_millis <= room.cpu_millis
            && self.memory_bytes <= room.memory_bytes
            && self.gpus <= room.gpus
            && self.disk_bytes <= room.disk_bytes
    }

    /// How many of this fit in `room`, fractionally (the scarcest resource decides).
    fn copies_in(self, room: Room) -> f64 {
        let fit = |asked: i64, has: i64| {
            if asked > 0 {
                has as f64 / asked as f64
            } else {
                f64::INFINITY
            }
        };
        let copies = fit(self.cpu_millis, room.cpu_millis)
            .min(fit(self.memory_bytes, room.memory_bytes))
            .min(fit(self.gpus, room.gpus))
            .min(fit(self.disk_bytes, room.disk_bytes));
        if copies.is_finite() { copies } else { 1.0 }
    }

    /// The largest share of `of` this takes, over the resources `of` has.
    fn dominant_share(self, of: Room) -> f64 {
        let share = |used: i64, total: i64| if total > 0 { used as f64 / total as f64 } else { 0.0 };
        share(self.cpu_millis, of.cpu_millis)
            .max(share(self.memory_bytes, of.memory_bytes))
            .max(share(self.gpus, of.gpus))
            .max(share(self.disk_bytes, of.disk_bytes))
    }
}

/// A machine on its way: a booting instance, or one of an intent in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct Coming {
    pub capacity: CapacityType,
    pub room: Room,
}

/// What the planner knows of one pool for one cycle.
#[derive(Debug, Clone)]
pub struct PoolInput<'a> {
    pub pool: &'a str,
    /// The pool's offerings not marked unavailable, any capacity type.
    pub offerings: &'a [Offering],
    /// Why the pool's other offerings are unavailable, for the held-back reasons.
    pub unavailable_reasons: Vec<String>,
    pub demand: Vec<&'a DemandJob>,
    pub coming: Vec<Coming>,
    /// Live instances plus machines in flight: what `max_instances` counts.
    pub live_instances: u32,
    pub max_instances: u32,
    /// The pool's capacity types, in config order.
    pub capacity_types: &'a [CapacityType],
    /// The most disk the jobs of one new machine may have (its root volume sized for them).
    pub job_disk_bytes: i64,
}

/// A group of identical machines to launch: one intent.
#[derive(Debug, Clone, PartialEq)]
pub struct Machines {
    pub capacity: CapacityType,
    pub count: u32,
    /// Cheapest first, at most [`MAX_CANDIDATES`].
    pub candidates: Vec<Offering>,
    /// The jobs they are for.
    pub jobs: Vec<String>,
    /// One gang's machines: all of them or none, in one zone.
    pub gang: bool,
    /// The disk each machine's jobs ask for together, in whole GiB (its root volume's part).
    pub disk_bytes: i64,
}

/// The cycle's decision for one pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolPlan {
    pub launch: Vec<Machines>,
    /// Jobs a coming machine holds.
    pub covered: Vec<String>,
    /// Jobs this pool will not launch for now, and why.
    pub held_back: Vec<(String, String)>,
}

/// One machine being filled.
struct Open {
    capacity: CapacityType,
    used: Room,
    jobs: Vec<usize>,
    /// Indices into the offerings that still hold everything placed.
    candidates: Vec<usize>,
}

/// Decides one pool's launches.
pub fn plan(input: &PoolInput<'_>) -> PoolPlan {
    let mut out = PoolPlan::default();
    let largest = input
        .offerings
        .iter()
        .map(|offering| input.room_of(offering))
        .fold(Room::default(), |a, b| Room {
            cpu_millis: a.cpu_millis.max(b.cpu_millis),
            memory_bytes: a.memory_bytes.max(b.memory_bytes),
            gpus: a.gpus.max(b.gpus),
            disk_bytes: a.disk_bytes.max(b.disk_bytes),
        });
    let mut coming_free: Vec<(CapacityType, Room)> = input.coming.iter().map(|c| (c.capacity, c.room)).collect();
    let (gangs, singles): (Vec<usize>, Vec<usize>) = (0..input.demand.len()).partition(|&i| input.demand[i].nodes > 1);
    let gang_machines = gangs::plan(input, &gangs, &mut coming_free, &mut out);
    // Largest first (first-fit decreasing), then the oldest.
    let mut order = singles;
    order.sort_by(|&a, &b| {
        let (ja, jb) = (input.demand[a], input.demand[b]);
        Room::of_job(&jb.resources)
            .dominant_share(largest)
            .total_cmp(&Room::of_job(&ja.resources).dominant_share(largest))
            .then(ja.submitted_at_ms.cmp(&jb.submitted_at_ms))
            .then(ja.job_id.cmp(&jb.job_id))
    });
    let mut open: Vec<Open> = Vec::new();
    for index in order {
        let job = input.demand[index];
        let asked = Room::of_job(&job.resources);
        let Some(capacity) = capacity_or_hold(input, job, asked, &mut out) else {
            continue;
        };
        // A machine on its way holds it.
        if let Some(slot) = coming_free
            .iter_mut()
            .find(|(coming_capacity, free)| accepts(job, *coming_capacity) && asked.fits_in(*free))
        {
            slot.1 = slot.1.minus(asked);
            out.covered.push(job.job_id.clone());
            continue;
        }
        place(input, &mut open, index, asked, capacity);
    }
    let machines = split_costly(input, open);
    let mut room_left = input.max_instances.saturating_sub(input.live_instances);
    let at_max = || format!("pool {} at max-instances ({})", input.pool, input.max_instances);
    // Machines whose jobs ask for different disks are different launches (their volumes differ).
    let mut groups: BTreeMap<(CapacityType, Vec<OfferingKey>, i64), Machines> = BTreeMap::new();
    for machine in machines {
        let job_ids: Vec<String> = machine.jobs.iter().map(|&i| input.demand[i].job_id.clone()).collect();
        if room_left == 0 {
            out.held_back.extend(job_ids.into_iter().map(|id| (id, at_max())));
            continue;
        }
        room_left -= 1;
        let candidates = cheapest_first(input, &machine.candidates);
        let keys = candidates.iter().map(|c| c.key.clone()).collect();
        let disk_bytes = whole_gib(machine.used.disk_bytes);
        let group = groups
            .entry((machine.capacity, keys, disk_bytes))
            .or_insert_with(|| Machines {
                capacity: machine.capacity,
                count: 0,
                candidates,
                jobs: Vec::new(),
                gang: false,
                disk_bytes,
            });
        group.count += 1;
        group.jobs.extend(job_ids);
    }
    out.launch = groups.into_values().collect();
    for gang in gang_machines {
        if gang.count > room_left {
            let nodes = gang.count;
            out.held_back.extend(
                gang.jobs
                    .into_iter()
                    .map(|id| (id, format!("{}: its gang needs {nodes} machines at once", at_max()))),
            );
            continue;
        }
        room_left -= gang.count;
        out.launch.push(gang);
    }
    out
}

impl PoolInput<'_> {
    /// What a new machine of the offering holds, its volume sized up to the pool's most.
    fn room_of(&self, offering: &Offering) -> Room {
        Room::of_shape(&offering.shape, self.job_disk_bytes)
    }
}

/// Bytes rounded up to whole GiB: volumes are sized in GiB.
fn whole_gib(bytes: i64) -> i64 {
    const GIB: u64 = 1 << 30;
    let gib = u64::try_from(bytes).unwrap_or(0).div_ceil(GIB);
    i64::try_from(gib * GIB).unwrap_or(i64::MAX)
}

/// The offerings `candidates` names, cheapest first, at most [`MAX_CANDIDATES`].
fn cheapest_first(input: &PoolInput<'_>, candidates: &[usize]) -> Vec<Offering> {
    let mut offerings: Vec<Offering> = candidates.iter().map(|&i| input.offerings[i].clone()).collect();
    offerings.sort_by(|a, b| a.price_per_hour.total_cmp(&b.price_per_hour).then(a.key.cmp(&b.key)));
    offerings.truncate(MAX_CANDIDATES);
    offerings
}

/// [`capacity_for`], or `None` with the job held back and why.
fn capacity_or_hold(input: &PoolInput<'_>, job: &DemandJob, asked: Room, out: &mut PoolPlan) -> Option<CapacityType> {
    let capacity = capacity_for(input, job, asked);
    if capacity.is_none() {
        out.held_back.push((job.job_id.clone(), no_offering_reason(input, job)));
    }
    capacity
}

/// The capacity type to launch for the job: its market, `auto` as the scheduler chose it, and
/// on-demand when no spot offering holds an `auto` job. `None`: nothing available holds it.
fn capacity_for(input: &PoolInput<'_>, job: &DemandJob, asked: Room) -> Option<CapacityType> {
    let holds = |capacity: CapacityType| {
        input.capacity_types.contains(&capacity)
            && input
                .offerings
                .iter()
                .any(|o| o.key.capacity == capacity && asked.fits_in(input.room_of(o)))
    };
    let preferred = match job.market.as_str() {
        "spot" => return holds(CapacityType::Spot).then_some(CapacityType::Spot),
        "on-demand" => return holds(CapacityType::OnDemand).then_some(CapacityType::OnDemand),
        _ if job.chosen_market == "on-demand" => CapacityType::OnDemand,
        _ => CapacityType::Spot,
    };
    let other = match preferred {
        CapacityType::Spot => CapacityType::OnDemand,
        CapacityType::OnDemand => CapacityType::Spot,
    };
    [preferred, other].into_iter().find(|&capacity| holds(capacity))
}

fn accepts(job: &DemandJob, capacity: CapacityType) -> bool {
    match job.market.as_str() {
        "spot" => capacity == CapacityType::Spot,
        "on-demand" => capacity == CapacityType::OnDemand,
        _ => true,
    }
}

fn no_offering_reason(input: &PoolInput<'_>, job: &DemandJob) -> String {
    let market = match job.market.as_str() {
        "spot" | "on-demand" => format!("{} ", job.market),
        _ => String::new(),
    };
    let mut reason = format!("pool {}: no available {market}offering holds it", input.pool);
    if !input.unavailable_reasons.is_empty() {
        reason.push_str(&format!(" ({})", input.unavailable_reasons.join("; ")));
    }
    reason
}

/// Puts the job on the open machine where it costs least, or opens one: a machine grows to a
/// larger type only while the larger type's extra room costs no more a copy of the job than the
/// job's own machine.
fn place(input: &PoolInput<'_>, open: &mut Vec<Open>, index: usize, asked: Room, capacity: CapacityType) {
    let holds = |i: usize| input.room_of(&input.offerings[i]);
    let cheapest_of = |candidates: &[usize]| {
        candidates.iter().copied().min_by(|&a, &b| {
            input.offerings[a]
                .price_per_hour
                .total_cmp(&input.offerings[b].price_per_hour)
        })
    };
    let price = |offering: Option<usize>| offering.map_or(f64::INFINITY, |i| input.offerings[i].price_per_hour);
    // The job's own machine, and what one copy of the job costs on it.
    let candidates = holding(input, capacity, asked);
    let alone = cheapest_of(&candidates);
    let alone_per_copy = price(alone) / alone.map_or(1.0, |i| asked.copies_in(holds(i)));
    let mut best: Option<(f64, usize, Vec<usize>)> = None;
    for (m, machine) in open.iter().enumerate() {
        if machine.capacity != capacity {
            continue;
        }
        let used = machine.used.plus(asked);
        let left: Vec<usize> = machine
            .candidates
            .iter()
            .copied()
            .filter(|&i| used.fits_in(holds(i)))
            .collect();
        let (now, next) = (cheapest_of(&machine.candidates), cheapest_of(&left));
        let Some(next) = next else { continue };
        let rise = price(Some(next)) - price(now);
        // A larger type must sell its extra room no dearer than the job's own machine sells
        // room: past that point (a type with more memory per CPU, say) the premium buys nothing.
        let gained = asked.copies_in(holds(next)) - now.map_or(0.0, |i| asked.copies_in(holds(i)));
        if rise > 1e-12 && (gained <= 0.0 || rise / gained > alone_per_copy + 1e-12) {
            continue;
        }
        if best.as_ref().is_none_or(|(r, _, _)| rise < *r) {
            best = Some((rise, m, left));
        }
    }
    if let Some((_, m, left)) = best {
        let machine = &mut open[m];
        machine.used = machine.used.plus(asked);
        machine.jobs.push(index);
        machine.candidates = left;
        return;
    }
    open.push(Open {
        capacity,
        used: asked,
        jobs: vec![index],
        candidates,
    });
}

/// The offerings of `capacity` whose shape holds `asked`, as indices.
fn holding(input: &PoolInput<'_>, capacity: CapacityType, asked: Room) -> Vec<usize> {
    (0..input.offerings.len())
        .filter(|&i| {
            let offering = &input.offerings[i];
            offering.key.capacity == capacity && asked.fits_in(input.room_of(offering))
        })
        .collect()
}

/// Splits a machine dearer than its jobs' own cheapest machines together into those.
fn split_costly(input: &PoolInput<'_>, open: Vec<Open>) -> Vec<Open> {
    let mut out = Vec::with_capacity(open.len());
    for machine in open {
        let price = |candidates: &[usize]| {
            candidates
                .iter()
                .map(|&i| input.offerings[i].price_per_hour)
                .fold(f64::INFINITY, f64::min)
        };
        let singles: Vec<Vec<usize>> = machine
            .jobs
            .iter()
            .map(|&job| holding(input, machine.capacity, Room::of_job(&input.demand[job].resources)))
            .collect();
        let apart: f64 = singles.iter().map(|c| price(c)).sum();
        if machine.jobs.len() > 1 && apart + 1e-9 < price(&machine.candidates) {
            for (job, candidates) in machine.jobs.iter().zip(singles) {
                out.push(Open {
                    capacity: machine.capacity,
                    used: Room::of_job(&input.demand[*job].resources),
                    jobs: vec![*job],
                    candidates,
                });
            }
        } else {
            out.push(machine);
        }
    }
    out
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
