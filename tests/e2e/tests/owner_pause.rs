//! Controllers stop with their owner (issue 26): when a user is disabled, or removed from a
//! project, their sweeps, inference services and batches there are paused with the reason in
//! their status, the jobs those controllers made stop (running ones too), and no controller
//! makes another job as them. One stack on the `sim` provider serves the three controllers
//! for two owners: `alice`, disabled, and `eve`, removed from `default` but still a member of
//! `beta`, whose batch there goes on.

use std::time::Duration;

use kiln_core::store::JobRecord;
use kiln_e2e::serve_world::register_factor;
use kiln_e2e::serving::{serve_client, spawn_predictor_with_api};
use kiln_e2e::sim::{cloud, cpu_box, sim_runner};
use kiln_e2e::{PATIENCE, Stack, batch_now, spec};
use kiln_proto::v1 as pb;
use tonic::Code;

/// A sweep of one trial at a time whose trials run for ten minutes.
fn sweep_spec(name: &str) -> String {
    format!(
        r#"
name: {name}
objective: {{metric: val/loss, goal: minimize}}
algorithm: {{name: random, seed: 7}}
budget: {{max-trials: 50, max-parallel: 1}}
parameters:
  lr: {{type: float, min: 1.0e-4, max: 1.0, log: true}}
trial: {{command: [sleep, '600'], cpu: 0.5, mem: 256M}}
"#
    )
}

/// What one owner runs: a sweep, a service and a batch in `default`.
struct Controllers {
    owner_id: String,
    sweep_id: String,
    service: String,
    batch_id: String,
}

/// Which controller made a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Maker {
    Sweep,
    Service,
    Batch,
}

fn maker(job: &JobRecord) -> Maker {
    if !job.sweep_id.is_empty() {
        Maker::Sweep
    } else if !job.service_id.is_empty() {
        Maker::Service
    } else {
        Maker::Batch
    }
}

async fn create_batch(stack: &Stack, token: &str, name: &str, project: &str) -> String {
    let mut batches = stack.batches_as(token).await;
    let spec = pb::BatchSpec {
        name: name.into(),
        project: project.into(),
        // Each item keeps its worker busy for ten minutes.
        command: vec!["kiln:sleep".into(), "600000".into()],
        cpu_millis: 500,
        memory_mb: 64,
        max_workers: 1,
        ..Default::default()
    };
    let batch = batches
        .create_batch(pb::CreateBatchRequest { spec: Some(spec) })
        .await
        .expect("create batch")
        .into_inner();
    let items = pb::AddItemsRequest {
        batch_id: batch.id.clone(),
        items: (0..3)
            .map(|n| pb::Item {
                key: format!("item-{n}"),
                uri: format!("mem://{n}"),
                ..Default::default()
            })
            .collect(),
    };
    batches
        .add_items(futures::stream::iter([items]))
        .await
        .expect("add items");
    batch.id
}

impl Controllers {
    async fn start(
        stack: &Stack,
        predictor: std::net::SocketAddr,
        token: &str,
        user: &str,
        model: &str,
    ) -> Controllers {
        let sweep = stack
            .sweeps_as(token)
            .await
            .create_sweep(pb::CreateSweepRequest {
                spec_yaml: sweep_spec(&format!("sweep-{user}")),
                ..Default::default()
            })
            .await
            .expect("create sweep")
            .into_inner();
        let service = format!("svc-{user}");
        let serving = pb::ServiceDefinition {
            models: vec![pb::ServiceModel {
                model: model.into(),
                ..Default::default()
            }],
            deadline_ms: 2_000,
            worker: Some(spec(&["sleep", "600"])),
            replicas: 1,
            ..Default::default()
        };
        serve_client(predictor, token)
            .await
            .create_service(pb::CreateServiceRequest {
                name: service.clone(),
                project: String::new(),
                definition: Some(serving),
            })
            .await
            .expect("create service");
        let batch_id = create_batch(stack, token, &format!("batch-{user}"), "default").await;
        let owner_id = stack.store.user_by_name(user).await.unwrap().expect("the user").id;
        Controllers {
            owner_id,
            sweep_id: sweep.id,
            service,
            batch_id,
        }
    }

    /// Jobs the owner's controllers in `default` made, by maker: (all, live).
    async fn jobs(&self, stack: &Stack) -> Vec<(Maker, bool)> {
        stack
            .store
            .list_jobs(Some(&self.owner_id), &kiln_core::authz::Visible::All, true, 100_000)
            .await
            .expect("list jobs")
            .into_iter()
            .filter(|job| job.project == "default")
            .map(|job| {
                let state = job.state().expect("a state");
                (
                    maker(&job),
                    !state.is_terminal() || state == kiln_core::JobState::Preempted,
                )
            })
            .collect()
    }

    /// Waits until each controller has a job running.
    async fn until_each_runs(&self, stack: &Stack) {
        until("each controller runs a job", || async {
            let running = stack
                .store
                .list_jobs(Some(&self.owner_id), &kiln_core::authz::Visible::All, false, 100)
                .await
                .expect("list jobs")
                .into_iter()
                .filter(|job| job.state == kiln_core::JobState::Running.as_str())
                .map(|job| maker(&job))
                .collect::<Vec<_>>();
            [Maker::Sweep, Maker::Service, Maker::Batch]
                .iter()
                .all(|kind| running.contains(kind))
        })
        .await;
    }

    /// The paused reasons of the sweep, the service and the batch, with the sweep's and the
    /// service's states.
    async fn status(&self, stack: &Stack, predictor: std::net::SocketAddr) -> [String; 5] {
        let sweep = stack.sweep(&self.sweep_id).await;
        let service = serve_client(predictor, &stack.token)
            .await
            .get_service(pb::GetServiceRequest {
                project: Default::default(),
                name: self.service.clone(),
            })
            .await
            .expect("get service")
            .into_inner();
        let batch = batch_now(stack, &self.batch_id).await;
        [
            sweep.paused_reason,
            sweep.state,
            service.paused_reason,
            service.state,
            batch.paused_reason,
        ]
    }

    /// Waits until the three are paused with `reason`, and none has a live job left.
    async fn until_paused(&self, stack: &Stack, predictor: std::net::SocketAddr, reason: &str) {
        let paused = format!("paused: {reason}");
        let expected = [
            paused.clone(),
            "stopped".to_string(),
            paused.clone(),
            "STOPPED".to_string(),
            paused,
        ];
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let status = self.status(stack, predictor).await;
            let live: Vec<Maker> = self
                .jobs(stack)
                .await
                .into_iter()
                .filter(|(_, live)| *live)
                .map(|(kind, _)| kind)
                .collect();
            if status == expected && live.is_empty() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not paused with {reason:?} after {PATIENCE:?}: status {status:?}, live jobs of {live:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_disabled_owner_and_a_removed_member_have_their_sweeps_services_and_batches_paused() {
    let mut stack = Stack::start().await;
    // The model the services serve, made by a job on the stack's process runner; from here on
    // jobs run on a simulated cloud (trials and batch workers sleep there; a service worker's
    // `sleep` runs as a local process).
    let version = register_factor(&stack, 3).await;
    stack.runner.take().expect("the stack's runner").stop().await;
    stack.runner = Some(
        stack
            .spawn_runner(sim_runner(&stack, cloud(cpu_box(), 16, false)))
            .await,
    );
    stack.start_advisor(stack.advisor_config("advisor-1")).await;
    stack.start_item_batch(stack.item_batch_config()).await;
    let (_predictor, _, predictor) = spawn_predictor_with_api(&stack).await;
    let alice = stack.member("alice").await;
    let eve = stack.member("eve").await;
    stack.create_project("beta").await;
    stack.add_member("beta", "eve", pb::Role::Member).await;
    let model = format!("scale:{version}");
    let alices = Controllers::start(&stack, predictor, &alice, "alice", &model).await;
    let eves = Controllers::start(&stack, predictor, &eve, "eve", &model).await;
    let eves_beta_batch = create_batch(&stack, &eve, "batch-eve-beta", "beta").await;
    alices.until_each_runs(&stack).await;
    eves.until_each_runs(&stack).await;

    stack
        .users_as(&stack.token)
        .await
        .disable_user(pb::UserRef { name: "alice".into() })
        .await
        .expect("disable alice");
    stack
        .projects_as(&stack.token)
        .await
        .remove_member(pb::RemoveMemberRequest {
            project: "default".into(),
            user: "eve".into(),
        })
        .await
        .expect("remove eve from default");

    alices.until_paused(&stack, predictor, "owner alice was disabled").await;
    eves.until_paused(&stack, predictor, "owner eve is no longer a member of project default")
        .await;
    // Paused stays paused: over many passes of every controller, no job is made as them.
    let before = (alices.jobs(&stack).await.len(), eves.jobs(&stack).await.len());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = (alices.jobs(&stack).await.len(), eves.jobs(&stack).await.len());
    assert_eq!(before, after, "a paused controller made a job");
    alices.until_paused(&stack, predictor, "owner alice was disabled").await;
    // The removal is scoped to its project: eve's batch in beta goes on.
    let beta = batch_now(&stack, &eves_beta_batch).await;
    assert_eq!(beta.paused_reason, "", "{beta:?}");
    until("eve's batch in beta keeps a worker", || async {
        stack
            .store
            .live_batch_workers(&eves_beta_batch)
            .await
            .expect("workers")
            .iter()
            .any(|job| job.state == kiln_core::JobState::Running.as_str())
    })
    .await;

    // Resuming is refused while the owner may not run jobs, and works once they may again.
    let refused = stack
        .sweeps()
        .await
        .resume_sweep(pb::GetSweepRequest {
            sweep_id: alices.sweep_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("owner alice was disabled"), "{refused:?}");
    let retry = pb::BatchRef {
        batch_id: eves.batch_id.clone(),
    };
    let refused = stack
        .batches_client()
        .await
        .retry_failed(retry.clone())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    stack.add_member("default", "eve", pb::Role::Member).await;
    stack
        .batches_client()
        .await
        .retry_failed(retry)
        .await
        .expect("retry a paused batch once its owner is back");
    assert_eq!(batch_now(&stack, &eves.batch_id).await.paused_reason, "");
    until("eve's resumed batch asks for a worker again", || async {
        !stack
            .store
            .live_batch_workers(&eves.batch_id)
            .await
            .expect("workers")
            .is_empty()
    })
    .await;
}
