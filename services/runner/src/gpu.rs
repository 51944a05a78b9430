//! GPUs: how many a runner has, which a job holds, how busy they are, and the idle-GPU
//! watchdog.
//!
//! [`GpuSampler`] reads utilisation; [`NvmlSampler`] is the real one, on machines where NVML
//! (the NVIDIA driver's library) loads. The watchdog only sees the trait, so it is tested with a
//! scripted sampler.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::IdleGpuConfig;

/// Reads the utilisation of GPUs by index.
#[async_trait::async_trait]
pub trait GpuSampler: Send + Sync + 'static {
    /// How many GPUs the machine has.
    fn count(&self) -> u32;
    /// Mean utilisation, in percent, of these devices now; `None` when it cannot be read.
    async fn utilization(&self, devices: &[u32]) -> Option<f64>;
}

/// The sampler on machines with the NVIDIA driver.
pub struct NvmlSampler {
    nvml: nvml_wrapper::Nvml,
    count: u32,
}

/// Where the NVIDIA kernel driver says it is loaded.
const DRIVER_VERSION_FILE: &str = "/proc/driver/nvidia/version";

static NVML_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether NVML failed to load on a machine whose NVIDIA driver is loaded (the runner then
/// reports no GPUs: `kiln_runner_nvml_load_failed`).
pub fn nvml_failed() -> bool {
    NVML_FAILED.load(std::sync::atomic::Ordering::Relaxed)
}

impl NvmlSampler {
    /// Loads NVML; `None` on machines without it. Without the NVIDIA driver that is quiet (a
    /// machine with no GPU); with the driver loaded it is an error in the log and
    /// [`nvml_failed`], never a silent zero: a static (musl) runner cannot `dlopen` NVML, so a
    /// GPU machine runs the glibc build (README, "GPUs").
    pub fn load() -> Option<Arc<dyn GpuSampler>> {
        let loaded = nvml_wrapper::Nvml::init()
            .map_err(|error| error.to_string())
            .and_then(|nvml| {
                let count = nvml.device_count().map_err(|error| error.to_string())?;
                Ok(NvmlSampler { nvml, count })
            });
        match loaded {
            Ok(sampler) => {
                tracing::info!(gpus = sampler.count, "NVML loaded");
                Some(Arc::new(sampler))
            }
            Err(why) if std::path::Path::new(DRIVER_VERSION_FILE).try_exists().unwrap_or(false) => {
                NVML_FAILED.store(true, std::sync::atomic::Ordering::Relaxed);
                tracing::error!(
                    why,
                    "the NVIDIA driver is loaded but NVML is not: this runner reports no GPUs and watches none (run the glibc build of kiln-runner, with libnvidia-ml.so.1 on the library path)"
                );
                None
            }
            Err(why) => {
                tracing::info!(why, "no NVIDIA driver: no GPUs");
                None
            }
        }
    }
}

#[async_trait::async_trait]
impl GpuSampler for NvmlSampler {
    fn count(&self) -> u32 {
        self.count
    }

    async fn utilization(&self, devices: &[u32]) -> Option<f64> {
        let mut sum = 0.0;
        for &index in devices {
            let device = self.nvml.device_by_index(index).ok()?;
            sum += f64::from(device.utilization_rates().ok()?.gpu);
        }
        (!devices.is_empty()).then(|| sum / devices.len() as f64)
    }
}

/// Hands out GPU indices to jobs.
#[derive(Debug, Default)]
pub struct GpuPool {
    free: Vec<u32>,
}

impl GpuPool {
    pub fn new(count: u32) -> GpuPool {
        GpuPool {
            free: (0..count).rev().collect(),
        }
    }

    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Takes `count` GPUs, or none when there are not enough.
    pub fn take(&mut self, count: u32) -> Option<Vec<u32>> {
        let count = count as usize;
        if count > self.free.len() {
            return None;
        }
        let mut taken = self.free.split_off(self.free.len() - count);
        taken.sort_unstable();
        Some(taken)
    }

    pub fn give_back(&mut self, devices: &[u32]) {
        self.free.extend_from_slice(devices);
        self.free.sort_unstable_by(|a, b| b.cmp(a));
    }
}

/// Decides from samples whether a job's GPUs have been idle for the whole window.
pub struct IdleWindow {
    threshold: f64,
    window: Duration,
    started: Instant,
    samples: VecDeque<(Instant, f64)>,
}

impl IdleWindow {
    pub fn new(config: &IdleGpuConfig, started: Instant) -> IdleWindow {
        IdleWindow {
            threshold: config.threshold_percent,
            window: Duration::from_secs(config.window_secs),
            started,
            samples: VecDeque::new(),
        }
    }

    /// Adds a sample; returns true when a full window has passed and its mean is under the
    /// threshold.
    pub fn observe(&mut self, at: Instant, utilization: f64) -> bool {
        self.samples.push_back((at, utilization));
        while let Some(&(oldest, _)) = self.samples.front() {
            if at.duration_since(oldest) > self.window {
                self.samples.pop_front();
            } else {
                break;
            }
        }
        if at.duration_since(self.started) < self.window || self.samples.is_empty() {
            return false;
        }
        let mean = self.samples.iter().map(|(_, u)| u).sum::<f64>() / self.samples.len() as f64;
        mean < self.threshold
    }
}

/// Resolves when the devices have been idle for the configured window; never when the
/// watchdog is off or utilisation cannot be read.
pub async fn idle(sampler: Arc<dyn GpuSampler>, devices: Vec<u32>, config: IdleGpuConfig) {
    if config.window_secs == 0 || devices.is_empty() {
        return std::future::pending().await;
    }
    let mut window = IdleWindow::new(&config, Instant::now());
    let interval = Duration::from_millis(config.sample_interval_ms);
    loop {
        tokio::time::sleep(interval).await;
        if let Some(utilization) = sampler.utilization(&devices).await
            && window.observe(Instant::now(), utilization)
        {
            return;
        }
    }
}

/// A sampler that plays back a script, for tests.
#[cfg(any(test, feature = "test-util"))]
pub struct ScriptedSampler {
    pub count: u32,
    pub utilization: f64,
}

#[cfg(any(test, feature = "test-util"))]
#[async_trait::async_trait]
impl GpuSampler for ScriptedSampler {
    fn count(&self) -> u32 {
        self.count
    }

    async fn utilization(&self, _devices: &[u32]) -> Option<f64> {
        Some(self.utilization)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(window_secs: u64) -> IdleGpuConfig {
        IdleGpuConfig {
            threshold_percent: 10.0,
            window_secs,
            sample_interval_ms: 1000,
        }
    }

    #[test]
    fn a_full_idle_window_trips_and_a_busy_one_does_not() {
        let start = Instant::now();
        let mut idle = IdleWindow::new(&config(60), start);
        let mut busy = IdleWindow::new(&config(60), start);
        for second in 1..=59 {
            let at = start + Duration::from_secs(second);
            assert!(!idle.observe(at, 1.0), "not before the window is full");
            assert!(!busy.observe(at, if second % 2 == 0 { 0.0 } else { 90.0 }));
        }
        assert!(idle.observe(start + Duration::from_secs(61), 2.0));
        assert!(!busy.observe(start + Duration::from_secs(61), 0.0));
    }

    #[test]
    fn old_samples_leave_the_window() {
        let start = Instant::now();
        let mut window = IdleWindow::new(&config(10), start);
        // Busy at first, then idle for a whole window.
        for second in 0..10 {
            window.observe(start + Duration::from_secs(second), 100.0);
        }
        let mut tripped = false;
        for second in 10..=25 {
            tripped |= window.observe(start + Duration::from_secs(second), 0.0);
        }
        assert!(tripped);
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_fires_on_scripted_idle_samples_only() {
        let idle_sampler = Arc::new(ScriptedSampler {
            count: 1,
            utilization: 0.0,
        });
        let fired = tokio::time::timeout(Duration::from_secs(120), idle(idle_sampler, vec![0], config(60))).await;
        assert!(fired.is_ok());
        let busy_sampler = Arc::new(ScriptedSampler {
            count: 1,
            utilization: 80.0,
        });
        let fired = tokio::time::timeout(Duration::from_secs(600), idle(busy_sampler, vec![0], config(60))).await;
        assert!(fired.is_err());
        let off = tokio::time::timeout(
            Duration::from_secs(600),
            idle(
                Arc::new(ScriptedSampler {
                    count: 1,
                    utilization: 0.0,
                }),
                vec![0],
                config(0),
            ),
        )
        .await;
        assert!(off.is_err());
    }

    #[test]
    fn gpus_are_handed_out_once() {
        let mut pool = GpuPool::new(3);
        assert_eq!(pool.take(2), Some(vec![0, 1]));
        assert_eq!(pool.take(2), None);
        assert_eq!(pool.take(1), Some(vec![2]));
        pool.give_back(&[0, 1]);
        assert_eq!(pool.available(), 2);
        assert_eq!(pool.take(2), Some(vec![0, 1]));
    }
}
