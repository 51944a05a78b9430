//! A provisioned pool on the simulated cloud (issue 27): kiln-provisioner, in this process,
//! launches instances of `kiln_cloud::sim::SimCloud` for the scheduler's demand, and the fleet
//! boots a real (in-process) `kiln-runner` on each running instance. The runner learns what it is
//! and what the cloud warns it of through a [`MetadataSource`] reading the sim cloud, as a runner
//! on EC2 reads IMDS, so a spot notice is acted on by the same code (cordon, jobs stopped within
//! the notice as spot preemptions and queued again). The fleet also plays the cloud's spot
//! market: it preempts running instances at a seeded rate. An instance that ends takes its runner
//! with it. Each runner runs its jobs on the runner's `sim` provider with no boot time and no
//! preemptions of its own (the instance is the cloud's), so batch workers' agent loops run in
//! this process.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kiln_cloud::sim::{SimCatalogue, SimCloud, SimConfig};
use kiln_cloud::{CapacityType, Cloud, CloudInstance, InstanceState, Interruption, PoolSpec, TagSelector};
use kiln_runner::metadata::{Identity, MetadataSource, Notices};
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

use crate::{ServiceHandle, Stack};

/// The fleet's pool.
pub const SIM_POOL: &str = "sim-spot";

/// The placement group the pool's gangs launch into.
pub const SIM_PLACEMENT_GROUP: &str = "sim-gangs";

/// What a runner on a sim instance reads as its metadata.
struct SimMetadata {
    identity: Identity,
    notices: Arc<Mutex<HashMap<String, Notices>>>,
}

#[async_trait::async_trait]
impl MetadataSource for SimMetadata {
    async fn identity(&self) -> kiln_runner::Result<Identity> {
        Ok(self.identity.clone())
    }

    async fn notices(&self) -> kiln_runner::Result<Notices> {
        let notices = self.notices.lock().expect("notices");
        Ok(notices.get(&self.identity.instance_id).cloned().unwrap_or_default())
    }
}

/// How the fleet behaves.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub max_instances: u32,
    /// Spot notices per instance-hour the fleet gives running instances.
    pub preemptions_per_hour: f64,
    pub seed: u64,
    /// The pool's idle timeout: how long a registered runner with nothing to run is kept.
    pub idle_timeout_secs: u64,
    /// The runners' lease (`lease-ttl-ms`; a runner's default is 10 s). The fleet's runners all
    /// live in the test process, on the cores every service shares: in a long run a stall of that
    /// process lapses dozens of leases at once, their workers end LOST and their instances idle
    /// out, which says nothing of a runner on a machine of its own.
    pub runner_lease_secs: u64,
}

pub struct SimFleet {
    pub cloud: Arc<SimCloud>,
    pub cluster: String,
    pub provisioner: Option<ServiceHandle>,
    state: Arc<Mutex<Fleet>>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

#[derive(Default)]
struct Fleet {
    runners: BTreeMap<String, FleetRunner>,
    booted: usize,
    preempted: usize,
    starts: HashMap<String, RunnerStart>,
}

/// A runner on an instance, and its part of the shared work root (its dataset cache), removed
/// with it: a million-item run boots over a thousand.
struct FleetRunner {
    handle: ServiceHandle,
    root: Option<std::path::PathBuf>,
}

impl FleetRunner {
    async fn crash(self) {
        self.handle.crash().await;
        remove_root(self.root);
    }

    async fn stop(self) {
        self.handle.stop().await;
        remove_root(self.root);
    }
}

fn remove_root(root: Option<std::path::PathBuf>) {
    if let Some(root) = root {
        let _ = std::fs::remove_dir_all(root);
    }
}

/// When an instance's boot ended in the cloud, and when its runner's bind returned: the time
/// between is this test process starting a runner, queued behind the others on two cores, which
/// a real machine does on its own.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunnerStart {
    pub running_ms: i64,
    pub bound_ms: i64,
}

impl SimFleet {
    /// The pool the provisioner is given: the standard sim catalogue's CPU types, spot only,
    /// gangs into the placement group [`SIM_PLACEMENT_GROUP`].
    pub fn pool(config: &FleetConfig) -> PoolSpec {
        PoolSpec {
            capacity_types: vec![CapacityType::Spot],
            launch_template: String::new(),
            max_instances: config.max_instances,
            idle_timeout_secs: config.idle_timeout_secs,
            // The pool's default (600 s; Karpenter gives a node 15 minutes to register). This
            // fleet binds its in-process runners one at a time on two cores, so after a burst of
            // launches an instance may wait over a minute for its runner: a tighter timeout
            // terminates instances about to register and launches replacements that wait again.
            // The boot timeout itself is tested on EC2 (tests/e2e/tests/ec2.rs) and the sim
            // cloud (services/provisioner/tests).
            placement_group: Some(SIM_PLACEMENT_GROUP.into()),
            ..SimCatalogue::standard().cpu_pool(SIM_POOL)
        }
    }

    pub async fn start(stack: &Stack, config: FleetConfig) -> SimFleet {
        let cloud = Arc::new(SimCloud::new(
            SimCatalogue::standard(),
            SimConfig {
                seed: config.seed,
                boot_min: Duration::from_millis(100),
                boot_max: Duration::from_millis(500),
                notice: Duration::from_secs(2),
                max_instances: config.max_instances as usize * 2,
            },
        ));
        let cluster = format!("sim-{}", &kiln_core::ids::new_id()[24..]);
        let provisioner_config = kiln_provisioner::Config {
            grpc: kiln_core::config::GrpcConfig::at(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
            metrics: kiln_core::metrics::MetricsConfig {
                enabled: false,
                ..Default::default()
            },
            database: stack.database.clone(),
            nats: stack.nats.service_config(kiln_core::nats_auth::Service::Provisioner),
            cluster: cluster.clone(),
            lease_ttl_ms: 1500,
            batch_idle_ms: 300,
            batch_max_ms: 2000,
            cycle_interval_ms: 500,
            reap_interval_ms: 2000,
            cordon_settle_ms: 500,
            pools: vec![SimFleet::pool(&config)],
            ..Default::default()
        };
        let sim: Arc<dyn Cloud> = cloud.clone();
        let service = kiln_provisioner::service::ProvisionerService::bind_with_clouds(
            provisioner_config,
            HashMap::from([(SIM_POOL.to_string(), sim)]),
        )
        .await
        .expect("the provisioner binds");
        let provisioner = ServiceHandle::spawn(|token| service.serve(token));
        let state = Arc::new(Mutex::new(Fleet::default()));
        let notices: Arc<Mutex<HashMap<String, Notices>>> = Arc::default();
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        // The cloud's own word on its instances: notices to the runners' metadata.
        let mut events = cloud.interruptions().expect("the sim cloud's interruptions");
        let (notices_in, stop_in) = (notices.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    _ = stop_in.cancelled() => return,
                    event = events.next() => event,
                };
                let Some(event) = event else { return };
                let mut notices = notices_in.lock().expect("notices");
                match event {
                    Interruption::Notice { instance, action, at } => {
                        let at_ms = kiln_cloud::timefmt::millis(at);
                        notices.entry(instance.0).or_default().interruption =
                            Some(kiln_runner::metadata::Interruption {
                                action: format!("{action:?}").to_lowercase(),
                                at_ms,
                            });
                    }
                    Interruption::Rebalance { instance, .. } => {
                        notices.entry(instance.0).or_default().rebalance_at_ms = Some(kiln_core::ids::now_ms());
                    }
                    Interruption::Gone { .. } => {}
                }
            }
        }));
        // A runner needs few connections; a thousand of them with the stack's pool each would
        // hold thousands of SQLite connections, whose lock waits starve the services' pools.
        let mut template = stack.runner_config("template");
        template.database.max_connections = 2;
        template.lease_ttl_ms = config.runner_lease_secs * 1000;
        tasks.push(tokio::spawn(boot_loop(
            template,
            cloud.clone(),
            cluster.clone(),
            notices,
            state.clone(),
            stop.clone(),
        )));
        tasks.push(tokio::spawn(market(
            cloud.clone(),
            cluster.clone(),
            config,
            state.clone(),
            stop.clone(),
        )));
        SimFleet {
            cloud,
            cluster,
            provisioner: Some(provisioner),
            state,
            stop,
            tasks,
        }
    }

    /// Instances booted so far, and spot notices given.
    pub fn counts(&self) -> (usize, usize) {
        let state = self.state.lock().expect("fleet");
        (state.booted, state.preempted)
    }

    /// When each instance (by id, which is its runner's id) finished booting and its runner was bound.
    pub fn runner_starts(&self) -> HashMap<String, RunnerStart> {
        self.state.lock().expect("fleet").starts.clone()
    }

    /// The cluster's instances the cloud still runs.
    pub async fn live(&self) -> Vec<CloudInstance> {
        self.cloud
            .list(&TagSelector {
                cluster: self.cluster.clone(),
                live_only: true,
                ..TagSelector::default()
            })
            .await
            .expect("list the fleet")
    }

    pub async fn stop(mut self) {
        self.stop.cancel();
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
        let runners = std::mem::take(&mut self.state.lock().expect("fleet").runners);
        for (_, runner) in runners {
            runner.stop().await;
        }
        if let Some(provisioner) = self.provisioner.take() {
            provisioner.stop().await;
        }
    }
}

/// Boots a runner on every running instance of the cluster; one whose instance ended goes.
/// How many instances the fleet binds before it lists the cloud again.
const BINDS_PER_LISTING: usize = 8;

async fn boot_loop(
    template: kiln_runner::Config,
    cloud: Arc<SimCloud>,
    cluster: String,
    notices: Arc<Mutex<HashMap<String, Notices>>>,
    state: Arc<Mutex<Fleet>>,
    stop: CancellationToken,
) {
    let selector = TagSelector {
        cluster,
        ..TagSelector::default()
    };
    while !stop.is_cancelled() {
        let listed = cloud.list(&selector).await.unwrap_or_default();
        let gone: Vec<FleetRunner> = {
            let mut state = state.lock().expect("fleet");
            let live: Vec<&str> = listed
                .iter()
                .filter(|i| i.state.is_live())
                .map(|i| i.id.0.as_str())
                .collect();
            let ended: Vec<String> = state
                .runners
                .keys()
                .filter(|id| !live.contains(&id.as_str()))
                .cloned()
                .collect();
            ended.iter().filter_map(|id| state.runners.remove(id)).collect()
        };
        for runner in gone {
            // The machine is gone: nothing of its runner is left.
            runner.crash().await;
        }
        // Oldest first (ids count up), a few per listing: a burst of launches takes a while to
        // bind on two cores, and an instance the provisioner released meanwhile is not bound.
        let waiting: Vec<&CloudInstance> = {
            let mut state = state.lock().expect("fleet");
            for instance in listed.iter().filter(|i| i.state == InstanceState::Running) {
                if !state.starts.contains_key(&instance.id.0) {
                    let running_ms = cloud.running_since(&instance.id).map_or(0, kiln_cloud::timefmt::millis);
                    let start = RunnerStart {
                        running_ms,
                        bound_ms: 0,
                    };
                    state.starts.insert(instance.id.0.clone(), start);
                }
            }
            listed
                .iter()
                .filter(|i| i.state == InstanceState::Running && !state.runners.contains_key(&i.id.0))
                .take(BINDS_PER_LISTING)
                .collect()
        };
        for instance in &waiting {
            let runner = boot(&template, &cloud, instance, notices.clone()).await;
            let mut state = state.lock().expect("fleet");
            state.booted += 1;
            state.runners.insert(instance.id.0.clone(), runner);
            state.starts.entry(instance.id.0.clone()).or_default().bound_ms = kiln_core::ids::now_ms();
        }
        if waiting.len() == BINDS_PER_LISTING {
            continue;
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

async fn boot(
    template: &kiln_runner::Config,
    cloud: &SimCloud,
    instance: &CloudInstance,
    notices: Arc<Mutex<HashMap<String, Notices>>>,
) -> FleetRunner {
    let kind = cloud
        .catalogue()
        .find(&instance.key.instance_type)
        .expect("a type of the catalogue")
        .clone();
    let id = instance.id.0.clone();
    let mut config = template.clone();
    config.runner_id = id.clone();
    config.pool = SIM_POOL.into();
    config.work_dir = template.work_dir.join(&id);
    config.provider = kiln_runner::ProviderKind::Sim;
    config.cpu_millis = kind.shape.cpu_millis;
    config.memory_bytes = kind.shape.memory_bytes;
    // The runner's default: a report (and the re-drive of its unpublished changes) every 5 s.
    // A runner reports at once when it starts and when it is cordoned, so placement does not
    // wait for it; at 1 s a thousand runners made a thousand KV writes and queries a second.
    config.report_interval_ms = 5000;
    config.metrics_interval_ms = 3_600_000;
    config.imds.poll_interval_ms = 200;
    // The instance is the cloud's: its runner's provider adds no boot time and no preemption.
    config.sim = kiln_runner::provider::sim::SimConfig {
        instance_types: vec![kiln_runner::provider::sim::InstanceType {
            name: kind.name.clone(),
            cpu_millis: kind.shape.cpu_millis,
            memory_bytes: kind.shape.memory_bytes,
            gpus: 0,
            on_demand_per_hour: kind.on_demand_per_hour,
            spot_per_hour: kind.spot_per_hour,
        }],
        spot: instance.key.capacity == CapacityType::Spot,
        boot_min_ms: 0,
        boot_max_ms: 0,
        preemptions_per_hour: 0.0,
        // Jobs at once on the machine (each a simulated instance of the runner's provider, whose
        // capacity `cpu-millis` and `memory-bytes` cap at the machine's).
        max_instances: 64,
        ..kiln_runner::provider::sim::SimConfig::default()
    };
    let source = Arc::new(SimMetadata {
        identity: Identity {
            instance_id: id,
            instance_type: instance.key.instance_type.clone(),
            zone: instance.key.zone.clone(),
            region: "sim".into(),
            market: instance.key.capacity.as_str().into(),
        },
        notices,
    });
    let root = config.shared_root();
    let runner = kiln_runner::Runner::bind_with_metadata(config, source)
        .await
        .expect("a runner binds on the instance");
    FleetRunner {
        handle: ServiceHandle::spawn(|token| runner.serve(token)),
        root,
    }
}

/// The spot market: every second, each running instance is noticed with the probability its
/// rate gives (seeded).
async fn market(
    cloud: Arc<SimCloud>,
    cluster: String,
    config: FleetConfig,
    state: Arc<Mutex<Fleet>>,
    stop: CancellationToken,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(config.seed);
    let chance = config.preemptions_per_hour / 3600.0;
    let selector = TagSelector {
        cluster,
        live_only: true,
        ..TagSelector::default()
    };
    while !stop.is_cancelled() {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let Ok(listed) = cloud.list(&selector).await else {
            continue;
        };
        for instance in listed.iter().filter(|i| i.state == InstanceState::Running) {
            if rng.random_bool(chance.min(1.0)) && cloud.preempt(&instance.id) {
                state.lock().expect("fleet").preempted += 1;
            }
        }
    }
}
