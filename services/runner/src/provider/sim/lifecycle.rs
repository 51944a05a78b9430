//! An instance's life on the simulated cloud, as the [`Provider`] calls: the cheapest type that
//! fits, the boot, the command's (or the batch agent's) run, signals, a spot preemption after
//! its notice, the exit and the release; and the capacity and prices the cloud offers.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use kiln_core::scheduling::Market;
use kiln_core::serving::ENV_PORT;
use kiln_proto::v1::LogStream;
use nix::sys::signal::Signal;
use rand::Rng;
use tokio::sync::{Notify, mpsc, watch};

use super::super::{
    Capacity, Exit, Instance, InstanceSpec, InstanceStats, Offer, OutputStream, Outputs, Preemption, Provider,
};
use super::{InstanceType, SimInstance, SimProvider, SimRecord};
use crate::error::{Error, Result};

/// The kiln-agent settings of a batch worker's instance; None for other jobs.
fn agent_settings(spec: &InstanceSpec) -> Option<kiln_agent::Settings> {
    Some(kiln_agent::Settings {
        batch_id: spec.env.get("KILN_BATCH_ID")?.clone(),
        addr: spec.env.get("KILN_ITEMS_ADDR")?.clone(),
        token: spec.env.get("KILN_TOKEN")?.clone(),
        slots: 1,
        masker: std::sync::Arc::new(kiln_agent::Masker::from_env(|name| spec.env.get(name).cloned())),
        tls: kiln_agent::TlsSettings::from_vars(|name| spec.env.get(name).cloned()).ok()?,
        // Built-ins only: nothing to measure.
        measure_with: None,
    })
}

/// Ready when the cloud sends the spot notice: `after` the start when a preemption was drawn,
/// or when [`SimCloud::preempt`](super::SimCloud::preempt) asks.
async fn notice_due(started: tokio::time::Instant, after: Option<Duration>, asked: &Notify) {
    let drawn = async {
        match after {
            Some(after) => tokio::time::sleep_until(started + after).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = drawn => {}
        _ = asked.notified() => {}
    }
}

/// Simulated run time of a command, in ms, and its exit code.
fn behaviour(command: &[String]) -> (u64, i32) {
    match command {
        [program, secs] if program == "sleep" => (secs.parse::<f64>().map(|s| (s * 1000.0) as u64).unwrap_or(0), 0),
        [program, code] if program == "exit" => (0, code.parse().unwrap_or(1)),
        _ => (0, 0),
    }
}

#[async_trait::async_trait]
impl Provider for SimProvider {
    fn name(&self) -> &'static str {
        "sim"
    }

    async fn provision(&self, spec: &InstanceSpec) -> Result<Instance> {
        let instance_type = self
            .config
            .instance_types
            .iter()
            .filter(|t| t.cpu_millis >= spec.cpu_millis && t.memory_bytes >= spec.memory_bytes && t.gpus >= spec.gpus)
            .min_by(|a, b| a.on_demand_per_hour.total_cmp(&b.on_demand_per_hour))
            .ok_or_else(|| {
                Error::Capacity(format!(
                    "no simulated instance type has {} CPU millis, {} bytes and {} GPUs",
                    spec.cpu_millis, spec.memory_bytes, spec.gpus
                ))
            })?
            .clone();
        let mut rng = self.seeded(&spec.job_id, spec.attempt);
        let boot_ms = rng.random_range(self.config.boot_min_ms..=self.config.boot_max_ms);
        let spot = self.config.spot && spec.market == Market::Spot;
        let preempted_after_ms = (spot && self.config.preemptions_per_hour > 0.0).then(|| {
            // Exponential time to preemption.
            let uniform: f64 = rng.random_range(f64::EPSILON..1.0);
            (-uniform.ln() / self.config.preemptions_per_hour * 3_600_000.0) as u64
        });
        let id = format!("sim:{}:{}-{}", instance_type.name, spec.job_id, spec.attempt);
        {
            let mut instances = self.instances.lock().expect("sim lock");
            if instances.len() >= self.config.max_instances {
                return Err(Error::Capacity(format!(
                    "the simulated cloud's cap of {} instances is reached",
                    self.config.max_instances
                )));
            }
            let record = SimRecord {
                price_per_hour: if spot {
                    instance_type.spot_per_hour
                } else {
                    instance_type.on_demand_per_hour
                },
                instance_type: instance_type.name,
                spot,
                boot_ms,
                preempted_after_ms,
            };
            instances.insert(
                id.clone(),
                SimInstance {
                    record,
                    command: spec.command.clone(),
                    agent: agent_settings(spec),
                    resume_from: spec.env.get("KILN_RESUME_FROM").cloned(),
                    exit: None,
                    signals: None,
                    rng,
                    job_id: spec.job_id.clone(),
                    hosted: None,
                    preempt_now: Default::default(),
                },
            );
        }
        tokio::time::sleep(self.wall(boot_ms)).await;
        let mut scratch_dir = PathBuf::new();
        if let Some(host) = self.host.as_ref().filter(|_| spec.env.contains_key(ENV_PORT)) {
            let hosted = host.provision(spec).await?;
            scratch_dir = hosted.scratch_dir.clone();
            if let Some(sim) = self.instances.lock().expect("sim lock").get_mut(&id) {
                sim.hosted = Some(hosted);
            }
        }
        Ok(Instance {
            provider: "sim",
            job_id: spec.job_id.clone(),
            attempt: spec.attempt,
            id,
            scratch_dir,
        })
    }

    async fn start(&self, instance: &mut Instance) -> Result<OutputStream> {
        let (exit_tx, exit_rx) = watch::channel(None);
        let (signals_tx, mut signals_rx) = mpsc::unbounded_channel();
        let (record, command, agent, resume_from, hosted, preempt_now) = {
            let mut instances = self.instances.lock().expect("sim lock");
            let sim = instances
                .get_mut(&instance.id)
                .ok_or_else(|| Error::Capacity("the instance is gone".into()))?;
            sim.exit = Some(exit_rx);
            sim.signals = Some(signals_tx);
            let _ = sim.rng.random::<u64>();
            (
                sim.record.clone(),
                sim.command.clone(),
                sim.agent.clone(),
                sim.resume_from.clone(),
                sim.hosted.clone(),
                sim.preempt_now.clone(),
            )
        };
        let mut line = format!(
            "sim: {} ({}) booted in {} ms",
            record.instance_type,
            if record.spot { "spot" } else { "on-demand" },
            record.boot_ms
        );
        if let Some(resume_from) = &resume_from {
            line.push_str(&format!("; KILN_RESUME_FROM={resume_from}"));
        }
        let boot_line = futures::stream::iter([(LogStream::Stdout, Bytes::from(line + "\n"))]);
        let notify_after = record
            .preempted_after_ms
            .map(|after| self.wall(after.saturating_sub(self.config.notice_ms)));
        let notice = Preemption {
            job_id: instance.job_id.clone(),
            notice: Duration::from_millis(self.config.notice_ms),
        };
        if let (Some(mut process), Some(host)) = (hosted, self.host.clone()) {
            let output = host.start(&mut process).await?;
            if let Some(sim) = self.instances.lock().expect("sim lock").get_mut(&instance.id) {
                sim.hosted = Some(process.clone());
            }
            let (notices, grace) = (self.preemptions_tx.clone(), self.wall(self.config.notice_ms));
            tokio::spawn(async move {
                let due = notice_due(tokio::time::Instant::now(), notify_after, &preempt_now);
                let exit = super::hosted::live(host, process, signals_rx, due, notices, notice, grace).await;
                let _ = exit_tx.send(Some(exit));
            });
            return Ok(Box::pin(boot_line.chain(output)));
        }
        // An agent runs until told to stop: a year stands for "no end of its own".
        let (run_ms, code) = match agent {
            Some(_) => (365 * 86_400_000, 0),
            None => behaviour(&command),
        };
        let run = self.wall(run_ms);
        // A drawn preemption after the command's end does not happen.
        let notify_after = notify_after.filter(|_| record.preempted_after_ms.is_some_and(|after| after < run_ms));
        // A batch worker's agent: it ends the instance when item-batch tells it to stop.
        let agent_stop = tokio_util::sync::CancellationToken::new();
        let mut agent_done = match agent {
            Some(settings) => {
                let stop = agent_stop.clone();
                let task = tokio::spawn(async move {
                    match kiln_agent::run(settings, kiln_agent::Runner::BuiltinsOnly, stop).await {
                        Ok(kiln_agent::Ended::Stopped(_)) => 0,
                        Ok(kiln_agent::Ended::Terminated) => 128 + 15,
                        Err(_) => 1,
                    }
                });
                Some(task)
            }
            None => None,
        };
        let grace = self.wall(self.config.notice_ms);
        let preemptions = self.preemptions_tx.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let agent_ended = async {
                match agent_done.as_mut() {
                    Some(task) => task.await.unwrap_or(1),
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(agent_ended);
            let exit_code = loop {
                let notify = notice_due(started, notify_after, &preempt_now);
                tokio::select! {
                    _ = tokio::time::sleep_until(started + run) => break code,
                    code = &mut agent_ended => break code,
                    signal = signals_rx.recv() => match signal {
                        Some(Signal::SIGKILL) | None => break 128 + 9,
                        Some(Signal::SIGTERM) => break 128 + 15,
                        Some(_) => {}
                    },
                    _ = notify => {
                        let _ = preemptions.send(notice.clone()).await;
                        // The cloud takes the machine back after the notice, whatever the job does.
                        tokio::select! {
                            _ = tokio::time::sleep(grace) => break 128 + 9,
                            signal = signals_rx.recv() => break match signal {
                                Some(Signal::SIGTERM) => 128 + 15,
                                _ => 128 + 9,
                            },
                        }
                    }
                }
            };
            // Whatever ended the instance ends its agent (a preempted worker's items go back).
            agent_stop.cancel();
            let _ = exit_tx.send(Some(Exit {
                code: exit_code,
                oom_killed: false,
                disk_full: false,
            }));
        });
        Ok(Box::pin(boot_line))
    }

    async fn signal(&self, instance: &Instance, signal: Signal) -> Result<()> {
        if let Some(signals) = self
            .instances
            .lock()
            .expect("sim lock")
            .get(&instance.id)
            .and_then(|i| i.signals.clone())
        {
            let _ = signals.send(signal);
        }
        Ok(())
    }

    async fn wait(&self, instance: &Instance) -> Result<Exit> {
        let exit = self
            .instances
            .lock()
            .expect("sim lock")
            .get(&instance.id)
            .and_then(|i| i.exit.clone());
        let Some(mut exit) = exit else {
            return Ok(Exit {
                code: -1,
                oom_killed: false,
                disk_full: false,
            });
        };
        let exit = exit
            .wait_for(Option::is_some)
            .await
            .map_err(|e| Error::Capacity(e.to_string()))?;
        Ok(exit.expect("waited for some"))
    }

    async fn outputs(&self, instance: &Instance) -> Result<Outputs> {
        match self.hosted(instance) {
            Some((host, hosted)) => host.outputs(&hosted).await,
            None => Ok(Outputs::None),
        }
    }

    async fn stats(&self, instance: &Instance) -> Result<Option<InstanceStats>> {
        match self.hosted(instance) {
            Some((host, hosted)) => host.stats(&hosted).await,
            None => Ok(None),
        }
    }

    async fn release(&self, instance: &Instance) -> Result<()> {
        let hosted = self.hosted(instance);
        if let Some(sim) = self.instances.lock().expect("sim lock").remove(&instance.id)
            && let Some(signals) = sim.signals
        {
            let _ = signals.send(Signal::SIGKILL);
        }
        match hosted {
            Some((host, hosted)) => host.release(&hosted).await,
            None => Ok(()),
        }
    }

    async fn capacity(&self) -> Result<Capacity> {
        let largest = |f: fn(&InstanceType) -> i64| self.config.instance_types.iter().map(f).max().unwrap_or(0);
        let count = i64::try_from(self.config.max_instances).unwrap_or(i64::MAX);
        Ok(Capacity {
            cpu_millis: largest(|t| t.cpu_millis).saturating_mul(count),
            memory_bytes: largest(|t| t.memory_bytes).saturating_mul(count),
            gpus: u32::try_from(largest(|t| i64::from(t.gpus)).saturating_mul(count)).unwrap_or(u32::MAX),
            disk_bytes: 0,
        })
    }

    fn offer(&self) -> Offer {
        // The biggest job the cloud takes (each resource's largest type), priced as a share of
        // the type with the most CPU: an estimate, as the catalogue mixes shapes.
        let types = &self.config.instance_types;
        let largest = types.iter().max_by_key(|t| (t.cpu_millis, t.memory_bytes));
        Offer {
            instance: Some(Capacity {
                cpu_millis: types.iter().map(|t| t.cpu_millis).max().unwrap_or(0),
                memory_bytes: types.iter().map(|t| t.memory_bytes).max().unwrap_or(0),
                gpus: types.iter().map(|t| t.gpus).max().unwrap_or(0),
                disk_bytes: 0,
            }),
            on_demand_per_hour: largest.map_or(0.0, |t| t.on_demand_per_hour),
            spot_per_hour: largest.map_or(0.0, |t| t.spot_per_hour),
            spot: self.config.spot,
            time_scale: self.config.time_scale,
        }
    }

    fn preemptions(&self) -> Option<mpsc::Receiver<Preemption>> {
        self.preemptions_rx.lock().expect("sim lock").take()
    }

    async fn recover(
        &self,
        _job_id: &str,
        _attempt: i32,
        _instance_id: &str,
        _scratch_dir: PathBuf,
    ) -> Result<Option<Instance>> {
        // A simulated cloud lives in its runner: nothing outlives a restart.
        Ok(None)
    }

    async fn release_leftovers(&self, runner_id: &str, keep: &[String]) -> Result<usize> {
        // Hosted processes of a runner that went away are the host's leftovers.
        match &self.host {
            Some(host) => host.release_leftovers(runner_id, keep).await,
            None => Ok(0),
        }
    }
}
