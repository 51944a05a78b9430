//! The boot bridge: what EC2 does when an instance boots, for moto's instances. It watches moto
//! for instances with the world's `kiln-cluster` tag; for each one running it takes the user
//! data the launch template gave it (terraform's runner config, rendered), puts the instance id
//! where the boot script does (`RUNNER_ID`), starts an `amazon-ec2-metadata-mock` as that
//! instance's IMDS (its id, type, zone and life cycle) and a real `kiln-runner` process with
//! that config. What differs from an instance is given through the runner's environment, as the
//! boot script gives the database URL: the stack's NATS user seed, database and object store,
//! process jobs instead of containers, a work dir of its own, the AEMM as the metadata service,
//! and the type's CPUs and memory as the hardware would report them. When moto says the
//! instance is gone it kills both (SIGKILL: a machine that vanished).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use kiln_cloud::ec2::Ec2Cloud;
use kiln_cloud::{CapacityType, Cloud, InstanceState, TagSelector};
use kiln_core::nats_auth::Service;
use kiln_core::testing::{Aemm, AemmInstance, AemmNotice};
use tokio_util::sync::CancellationToken;

use crate::Stack;
use crate::ec2::{Ec2World, binary, shape_of};

/// One booted instance.
struct Booted {
    runner: Child,
    aemm: Aemm,
}

#[derive(Default)]
struct Bridge {
    booted: BTreeMap<String, Booted>,
    /// Instances launched while paused, not booted yet.
    held: HashSet<String>,
    /// Boot nothing new while set.
    paused: bool,
    /// Every instance booted so far, in order.
    history: Vec<String>,
}

pub struct BootBridge {
    state: Arc<Mutex<Bridge>>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    pub dir: PathBuf,
}

/// What every runner the bridge boots gets from the stack, through its environment.
#[derive(Clone)]
struct Environment {
    vars: Vec<(String, String)>,
    region: String,
}

impl BootBridge {
    pub fn start(world: &Ec2World, stack: &Stack) -> BootBridge {
        let dir = stack.dir.path().join("instances");
        std::fs::create_dir_all(&dir).expect("the instances' dir");
        let nats = stack.nats.service_config(Service::Runner);
        let mut vars = vec![
            ("KILN_RUNNER__PROVIDER".to_owned(), "process".to_owned()),
            (
                "KILN_RUNNER__DATABASE__URL".to_owned(),
                stack.database.url.expose().to_owned(),
            ),
            ("KILN_RUNNER__OBJECTS__URL".to_owned(), stack.objects.url.clone()),
            ("KILN_RUNNER__GRPC__LISTEN".to_owned(), "127.0.0.1:0".to_owned()),
            ("KILN_RUNNER__METRICS__ENABLED".to_owned(), "false".to_owned()),
            ("KILN_RUNNER__REPORT_INTERVAL_MS".to_owned(), "200".to_owned()),
            ("KILN_RUNNER__STOP_GRACE_PERIOD_MS".to_owned(), "2000".to_owned()),
            ("KILN_RUNNER__IMDS__POLL_INTERVAL_MS".to_owned(), "200".to_owned()),
            // The tests' jobs reach the stack's servers on ports no runner config names.
            ("KILN_RUNNER__PROCESS__FIREWALL".to_owned(), "false".to_owned()),
            (
                "KILN_RUNNER__AGENT_BINARY".to_owned(),
                crate::agent_binary().display().to_string(),
            ),
            (
                "KILN_RUNNER__SECRETS__KEY_FILE".to_owned(),
                crate::secrets_config(stack.dir.path()).key_file.display().to_string(),
            ),
        ];
        if let Some(seed) = &nats.nkey_seed_file {
            vars.push((
                "KILN_RUNNER__NATS__NKEY_SEED_FILE".to_owned(),
                seed.display().to_string(),
            ));
        }
        let environment = Environment {
            vars,
            region: world.env.region.clone(),
        };
        let state = Arc::new(Mutex::new(Bridge::default()));
        let stop = CancellationToken::new();
        let task = tokio::spawn(watch(
            world.cloud.clone(),
            world.cluster.clone(),
            environment,
            dir.clone(),
            state.clone(),
            stop.clone(),
        ));
        BootBridge {
            state,
            stop,
            task: Some(task),
            dir,
        }
    }

    /// Instances booted so far, in order.
    pub fn booted(&self) -> Vec<String> {
        self.state.lock().expect("bridge").history.clone()
    }

    /// Instances booted and not gone.
    pub fn running(&self) -> Vec<String> {
        self.state.lock().expect("bridge").booted.keys().cloned().collect()
    }

    /// Boots nothing new until [`BootBridge::resume`] (instances launched meanwhile wait).
    pub fn pause(&self) {
        self.state.lock().expect("bridge").paused = true;
    }

    /// Boots again, the instances that waited included (those still running).
    pub fn resume(&self) {
        let mut state = self.state.lock().expect("bridge");
        state.paused = false;
        state.held.clear();
    }

    /// Makes the metadata service of a booted instance show `notices` now.
    pub fn trigger(&self, instance: &str, notices: &[AemmNotice]) {
        let mut state = self.state.lock().expect("bridge");
        let booted = state.booted.get_mut(instance).expect("a booted instance");
        booted.aemm.trigger(notices);
    }

    /// The log of the runner on `instance`.
    pub fn runner_log(&self, instance: &str) -> String {
        std::fs::read_to_string(self.dir.join(instance).join("runner.log")).unwrap_or_default()
    }

    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for BootBridge {
    fn drop(&mut self) {
        self.stop.cancel();
        let mut state = self.state.lock().expect("bridge");
        if std::thread::panicking() {
            for id in state.history.clone() {
                let log = std::fs::read_to_string(self.dir.join(&id).join("runner.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("--- runner on {id} (last lines) ---");
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
        for (_, mut booted) in std::mem::take(&mut state.booted) {
            let _ = booted.runner.kill();
            let _ = booted.runner.wait();
        }
    }
}

async fn watch(
    cloud: Arc<Ec2Cloud>,
    cluster: String,
    environment: Environment,
    dir: PathBuf,
    state: Arc<Mutex<Bridge>>,
    stop: CancellationToken,
) {
    let selector = TagSelector {
        cluster,
        pool: None,
        intent: None,
        live_only: false,
    };
    while !stop.is_cancelled() {
        let listed = match cloud.list(&selector).await {
            Ok(listed) => listed,
            Err(error) => {
                // Not an empty listing: that would read as every machine gone.
                eprintln!("boot bridge: listing failed ({error}); trying again");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let live: HashSet<String> = listed
            .iter()
            .filter(|i| i.state.is_live())
            .map(|i| i.id.0.clone())
            .collect();
        // Gone: the machine vanishes with its runner.
        {
            let mut state = state.lock().expect("bridge");
            let gone: Vec<String> = state.booted.keys().filter(|id| !live.contains(*id)).cloned().collect();
            for id in gone {
                if let Some(mut booted) = state.booted.remove(&id) {
                    let _ = booted.runner.kill();
                    let _ = booted.runner.wait();
                }
            }
        }
        for instance in listed.iter().filter(|i| i.state == InstanceState::Running) {
            let id = instance.id.0.clone();
            {
                let mut state = state.lock().expect("bridge");
                if state.booted.contains_key(&id) || state.history.contains(&id) || state.held.contains(&id) {
                    continue;
                }
                if state.paused {
                    state.held.insert(id);
                    continue;
                }
            }
            let user_data = match cloud.user_data(&instance.id).await {
                Ok(data) => data,
                Err(error) => {
                    eprintln!("boot bridge: no user data for {id} yet ({error})");
                    continue;
                }
            };
            let booted = boot(instance, &user_data, &environment, &dir);
            let mut state = state.lock().expect("bridge");
            state.history.push(id.clone());
            state.booted.insert(id, booted);
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

/// Boots one instance: its metadata service, then its runner from its user data.
fn boot(
    instance: &kiln_cloud::CloudInstance,
    user_data: &str,
    environment: &Environment,
    dir: &std::path::Path,
) -> Booted {
    let id = &instance.id.0;
    let config = base64::engine::general_purpose::STANDARD
        .decode(user_data.trim())
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .unwrap_or_else(|| panic!("the user data of {id} is not base64 text: {user_data:?}"));
    assert!(
        config.contains("runner-id = \"RUNNER_ID\""),
        "the user data of {id} is not terraform's runner config:\n{config}"
    );
    // What the boot script does: the runner's id is the instance's.
    let config = config.replace("RUNNER_ID", id);
    let home = dir.join(id);
    std::fs::create_dir_all(&home).expect("the instance's dir");
    let path = home.join("runner.toml");
    std::fs::write(&path, config).expect("write runner.toml");
    let aemm = Aemm::start(AemmInstance {
        instance_id: id.clone(),
        instance_type: instance.key.instance_type.clone(),
        zone: instance.key.zone.clone(),
        region: environment.region.clone(),
        life_cycle: match instance.key.capacity {
            CapacityType::Spot => "spot".into(),
            CapacityType::OnDemand => "on-demand".into(),
        },
    });
    let (cpu_millis, memory_bytes) = shape_of(&instance.key.instance_type);
    let log = std::fs::File::create(home.join("runner.log")).expect("the runner's log");
    let runner = Command::new(binary("kiln-runner"))
        .arg("--config")
        .arg(&path)
        .envs(environment.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("KILN_RUNNER__WORK_DIR", home.join("work"))
        .env("KILN_RUNNER__CPU_MILLIS", cpu_millis.to_string())
        .env("KILN_RUNNER__MEMORY_BYTES", memory_bytes.to_string())
        .env("KILN_RUNNER__IMDS__ENDPOINT", &aemm.endpoint)
        .env("KILN_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start kiln-runner");
    Booted { runner, aemm }
}
