//! A hosted instance's life: an inference worker's real process (run by the host's process
//! provider) on a simulated instance, until the process ends or the cloud takes the instance
//! back.

use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::super::process::ProcessProvider;
use super::super::{Exit, Instance, Preemption, Provider};

/// Runs until the process of `hosted` exits: signals sent to the simulated instance are the
/// process's; once `notice_due` is ready, `notice` is sent and, `grace` later, the process is
/// SIGKILLed, as a cloud ends a preempted machine whatever runs on it.
pub(super) async fn live(
    host: Arc<ProcessProvider>,
    hosted: Instance,
    mut signals: mpsc::UnboundedReceiver<Signal>,
    notice_due: impl Future<Output = ()>,
    notices: mpsc::Sender<Preemption>,
    notice: Preemption,
    grace: Duration,
) -> Exit {
    let exit = host.wait(&hosted);
    tokio::pin!(exit, notice_due);
    let mut notice = Some(notice);
    let mut taken_at: Option<Instant> = None;
    let mut signalled = true;
    loop {
        let taken = async {
            match taken_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            exit = &mut exit => {
                return exit.unwrap_or(Exit {
                    code: -1,
                    oom_killed: false,
                    disk_full: false,
                });
            }
            signal = signals.recv(), if signalled => {
                // No sender left: the instance was released, and the process goes with it.
                let signal = signal.unwrap_or(Signal::SIGKILL);
                signalled = signal != Signal::SIGKILL || !signals.is_closed();
                let _ = host.signal(&hosted, signal).await;
            }
            _ = &mut notice_due, if notice.is_some() => {
                let _ = notices.send(notice.take().expect("checked")).await;
                taken_at = Some(Instant::now() + grace);
            }
            _ = taken => {
                taken_at = None;
                let _ = host.signal(&hosted, Signal::SIGKILL).await;
            }
        }
    }
}
