//! Sweeps: the advisor in the stack, its client, waiting on a sweep, and a driver that plays
//! the trials of a sweep on the `sim` provider (where nothing runs): it logs each running
//! trial's learning curve, as the trial's code would; and the checks every finished sweep must
//! pass.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use kiln_core::auth::BearerInterceptor;
use kiln_core::runs::ConfigValue;
use kiln_proto::v1 as pb;
use kiln_proto::v1::sweep_service_client::SweepServiceClient;
use tonic::transport::Channel;

use crate::{Authed, PATIENCE, ServiceHandle, Stack, ephemeral};

impl Stack {
    /// An advisor configuration for this stack: a pass every 100 ms, a 1 s lease, and 300 ms
    /// for a trial stopped early to end by itself.
    pub fn advisor_config(&self, name: &str) -> kiln_advisor::Config {
        kiln_advisor::Config {
            grpc: ephemeral(),
            database: self.database.clone(),
            nats: self.nats.service_config(kiln_core::nats_auth::Service::Advisor),
            objects: self.objects.clone(),
            instance_name: name.to_string(),
            lease_ttl_ms: 1_000,
            pass_interval_ms: 100,
            stop_grace_ms: 300,
            ..Default::default()
        }
    }

    /// Starts the stack's advisor (again, after a crash: on the same port, so trials find it).
    pub async fn start_advisor(&mut self, mut config: kiln_advisor::Config) {
        if let Some(addr) = self.advisor_addr {
            config.grpc.listen = addr;
        }
        let (handle, addr) = self.spawn_advisor(config).await;
        self.advisor_addr = Some(addr);
        self.advisor = Some(handle);
    }

    /// Starts one more advisor replica; the caller holds it.
    pub async fn spawn_advisor(&self, config: kiln_advisor::Config) -> (ServiceHandle, SocketAddr) {
        let service = kiln_advisor::Advisor::bind(config).await.expect("advisor binds");
        let addr = service.local_addr();
        (ServiceHandle::spawn(|token| service.serve(token)), addr)
    }

    pub async fn sweeps(&self) -> SweepServiceClient<Authed> {
        self.sweeps_as(&self.token).await
    }

    pub async fn sweeps_as(&self, token: &str) -> SweepServiceClient<Authed> {
        let addr = self.advisor_addr.expect("the advisor is started");
        SweepServiceClient::with_interceptor(Self::channel(addr).await, BearerInterceptor::new(token))
    }

    pub async fn create_sweep(&self, spec_yaml: &str) -> pb::Sweep {
        self.sweeps()
            .await
            .create_sweep(pb::CreateSweepRequest {
                spec_yaml: spec_yaml.to_string(),
                ..Default::default()
            })
            .await
            .expect("the sweep is created")
            .into_inner()
    }

    /// A sweep, read again while the advisor is away (a test may be restarting it).
    pub async fn sweep(&self, sweep_id: &str) -> pb::Sweep {
        let addr = self.advisor_addr.expect("the advisor is started");
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let answer = match Channel::from_shared(format!("http://{addr}"))
                .expect("uri")
                .connect()
                .await
            {
                Ok(channel) => SweepServiceClient::with_interceptor(channel, BearerInterceptor::new(&self.token))
                    .get_sweep(pb::GetSweepRequest {
                        sweep_id: sweep_id.to_string(),
                    })
                    .await
                    .map_err(|status| status.to_string()),
                Err(error) => Err(error.to_string()),
            };
            match answer {
                Ok(sweep) => return sweep.into_inner(),
                Err(error) => assert!(
                    tokio::time::Instant::now() < deadline,
                    "the advisor at {addr} did not answer for {PATIENCE:?}: {error}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the sweep is in `state` (within `patience`), reading it through any advisor
    /// replica that answers.
    pub async fn wait_for_sweep(&self, sweep_id: &str, state: &str, patience: Duration) -> pb::Sweep {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let sweep = self.sweep(sweep_id).await;
            if sweep.state == state {
                return sweep;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "sweep {sweep_id} is still {} ({:?}) after {patience:?}, not {state}",
                sweep.state,
                sweep.counts
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A synthetic learning curve with crossing ranks: trials with a small `lr` start worse and end
/// better. Its value at `epoch` (1-based) for `lr`.
pub fn curve(lr: f64, epoch: u32) -> f64 {
    let quality = (lr.log10() + 2.0).powi(2); // best at lr = 0.01
    let speed = 1.0 / (1.0 + 50.0 * lr); // small lr learns slowly
    quality + 3.0 * (-(f64::from(epoch)) * speed / 3.0).exp() + 0.1 / f64::from(epoch)
}

/// Plays the trials of a sweep on the sim provider until it is no longer running: for each
/// trial whose job runs, saves a run artifact `model.txt` on its first epoch and logs the next
/// epoch of [`curve`] (`val/loss` and `epoch`) every tick, up to `epochs`; a resumed trial goes
/// on from the epoch it had logged. Returns the epochs
/// logged per trial.
pub async fn drive_sim_trials(stack: &Stack, sweep_id: &str, epochs: u32, tick: Duration) -> HashMap<u32, u32> {
    let mut logs = stack.logs_client().await;
    let mut jobs = stack.jobs().await;
    let mut logged: HashMap<u32, u32> = HashMap::new();
    let deadline = tokio::time::Instant::now() + PATIENCE * 4;
    loop {
        let sweep = stack.sweep(sweep_id).await;
        if !["running", "stopping"].contains(&sweep.state.as_str()) {
            return logged;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "sweep {sweep_id} never ended: {:?}",
            sweep.counts
        );
        for trial in &sweep.trials {
            if trial.job_id.is_empty() || trial.state == "stopped" {
                continue;
            }
            let job = jobs
                .get_job(pb::GetJobRequest {
                    job_id: trial.job_id.clone(),
                })
                .await
                .expect("get job")
                .into_inner();
            if job.state != pb::JobState::Running as i32 {
                continue;
            }
            let done = logged.entry(trial.index).or_default();
            if *done >= epochs {
                continue;
            }
            *done += 1;
            let lr = trial
                .config
                .get("lr")
                .and_then(ConfigValue::from_proto)
                .and_then(|value| value.as_f64())
                .expect("every trial has an lr");
            if *done == 1 {
                // What the trial "trained", where a model registered from it will find it.
                crate::save_file(stack, &trial.job_id, "model.txt", format!("lr={lr}").as_bytes()).await;
            }
            let step = i64::from(*done);
            logs.write_metrics(pb::WriteMetricsRequest {
                job_id: trial.job_id.clone(),
                points: vec![
                    point("val/loss", step, curve(lr, *done)),
                    point("epoch", step, f64::from(*done)),
                ],
                columns: None,
            })
            .await
            .expect("write a trial's metrics");
        }
        tokio::time::sleep(tick).await;
    }
}

fn point(key: &str, step: i64, value: f64) -> pb::MetricPoint {
    pb::MetricPoint {
        key: key.to_string(),
        step,
        value,
        timestamp_ms: 0,
    }
}

/// Checks what every finished sweep must show: exactly `trials` trials, one job each.
pub fn assert_each_trial_once(sweep: &pb::Sweep, trials: usize) {
    assert_eq!(sweep.trials.len(), trials, "{:?}", sweep.counts);
    let indexes: HashSet<u32> = sweep.trials.iter().map(|trial| trial.index).collect();
    assert_eq!(indexes.len(), trials, "trial indexes repeat");
    let jobs: HashSet<&str> = sweep.trials.iter().map(|trial| trial.job_id.as_str()).collect();
    assert_eq!(jobs.len(), trials, "a job serves two trials, or a trial has none");
    assert!(!jobs.contains(""), "a trial without a job");
}

/// Checks that the sweep registered its best trial, once: version 1 of `NAME-best` under the
/// alias `candidate`, holding `file` and the trial's lineage (job, sweep, knobs, final value).
pub async fn assert_registered(stack: &Stack, sweep: &pb::Sweep, file: &str) {
    let model = format!("{}-best", sweep.name);
    assert_eq!(sweep.registered, format!("{model}:1"), "{:?}", sweep.reason);
    let mut models = stack.models().await;
    let by_alias = pb::GetModelVersionRequest {
        name: model.clone(),
        version: 0,
        alias: "candidate".into(),
        project: sweep.project.clone(),
    };
    let version = models
        .get_model_version(by_alias)
        .await
        .expect("the alias")
        .into_inner();
    let best = sweep.best.clone().expect("a best trial");
    let lineage = version.lineage.clone().expect("a lineage");
    assert_eq!(version.version, 1);
    assert_eq!(
        (lineage.job_id.as_str(), lineage.sweep_id.as_str()),
        (best.job_id.as_str(), sweep.id.as_str())
    );
    assert_eq!(lineage.config.get("lr"), best.config.get("lr"));
    assert_eq!(lineage.metrics.get("val/loss").copied(), best.value);
    assert_eq!(version.tags.get("sweep"), Some(&sweep.id));
    assert_eq!(
        version.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
        [file]
    );
    let versions = pb::ListModelVersionsRequest {
        name: model,
        ..Default::default()
    };
    let all = models
        .list_model_versions(versions)
        .await
        .unwrap()
        .into_inner()
        .versions;
    assert_eq!(all.len(), 1, "the best trial was registered more than once");
}

/// The jobs in the database that belong to the sweep (by the name the advisor gives them).
pub async fn jobs_of(stack: &Stack, sweep: &pb::Sweep) -> usize {
    let prefix = format!("{}-", sweep.name);
    stack
        .store
        .list_jobs(None, &kiln_core::authz::Visible::All, true, 100_000)
        .await
        .expect("list jobs")
        .into_iter()
        .filter(|job| job.name.starts_with(&prefix))
        .count()
}
