//! A stack with two projects and a caller of every kind: `alpha` (a running job, a batch, a
//! sweep, a dataset, a model and an inference service of its maintainer's, a viewer and a member
//! who own none of them) and `beta` (a viewer, member and maintainer, a running job whose token
//! its runner issued, and a model and a service named as alpha's: names are per project), plus
//! no token, a wrong, a revoked and an expired token. The authorisation matrix (tests/authz.rs)
//! and the tenancy tests (tests/tenancy.rs) run on it.

use std::net::SocketAddr;
use std::time::Duration;

use kiln_proto::v1 as pb;

use crate::rpc::Targets;
use crate::{PATIENCE, ServiceHandle, Stack, spec, wait_for_line};

/// The services of the stack, by the gRPC services each serves.
pub struct Addresses {
    pub api: SocketAddr,
    pub logs: SocketAddr,
    pub batches: SocketAddr,
    pub scheduler: SocketAddr,
    pub runner: SocketAddr,
    pub advisor: SocketAddr,
    pub predictor: SocketAddr,
}

impl Addresses {
    /// Where a gRPC service is served; NodeService is everywhere.
    pub fn of(&self, service: &str) -> Vec<SocketAddr> {
        match service {
            "JobService" | "QuotaService" | "ArtifactService" | "DatasetService" | "UserService" | "ProjectService"
            | "SecretService" | "ModelService" | "DiscoveryService" => vec![self.api],
            "LogService" | "BatchLogService" => vec![self.logs],
            "BatchService" | "ItemWorkService" => vec![self.batches],
            "SweepService" => vec![self.advisor],
            "ServeService" => vec![self.predictor],
            "NodeService" => vec![
                self.api,
                self.logs,
                self.batches,
                self.scheduler,
                self.runner,
                self.advisor,
                self.predictor,
            ],
            other => panic!("{other} is served by no service this test knows: add it to Addresses::of"),
        }
    }
}

/// The objects of project `alpha` the requests name.
pub type Alpha = Targets;

/// A caller who must be refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    NoToken,
    WrongToken,
    Revoked,
    Expired,
    /// A viewer, member or maintainer of project `beta` only.
    Outsider(pb::Role),
    /// The token of a job of project `beta`.
    OtherJob,
    /// A viewer or member of `alpha` who owns none of its objects, or its maintainer.
    Alpha(pb::Role),
}

/// What the cross-project matrix (tests/authz.rs) names: alpha's objects that a request made in
/// beta may not reach, and beta's own of the same kinds.
pub struct References {
    /// The archive of alpha's dataset `alpha-data`, uploaded to alpha only.
    pub alpha_digest: String,
    pub beta_job_id: String,
    pub beta_batch_id: String,
    /// A blob uploaded to beta, also the archive of beta's dataset `beta-data`.
    pub beta_digest: String,
}

pub struct World {
    pub stack: Stack,
    pub addresses: Addresses,
    pub alpha: Alpha,
    pub references: References,
    pub tokens: Vec<(Caller, Option<String>)>,
    _runner: ServiceHandle,
    _predictor: ServiceHandle,
}

/// Runs `script` as a job of `project` by `token`'s owner, and returns it.
async fn submit(stack: &Stack, token: &str, project: &str, script: &str) -> pb::Job {
    stack
        .jobs_as(token)
        .await
        .submit_job(pb::SubmitJobRequest {
            spec: Some(pb::JobSpec {
                project: project.into(),
                ..spec(&["sh", "-c", script])
            }),
            ..Default::default()
        })
        .await
        .expect("submit")
        .into_inner()
        .job
        .expect("job")
}

pub async fn world() -> World {
    let mut stack = Stack::start_without_runner().await;
    let runner = kiln_runner::Runner::bind(stack.runner_config("runner-1"))
        .await
        .expect("runner binds");
    let runner_addr = runner.local_addr();
    let runner = ServiceHandle::spawn(|token| runner.serve(token));
    stack.start_item_batch(stack.item_batch_config()).await;
    stack.start_advisor(stack.advisor_config("advisor-1")).await;
    for project in ["alpha", "beta"] {
        stack.create_project(project).await;
    }
    let alpha_token = stack.create_user("alpha-maintainer").await;
    stack
        .add_member("alpha", "alpha-maintainer", pb::Role::Maintainer)
        .await;
    stack.create_user("bystander").await;
    let mut alpha_callers = Vec::new();
    for (role, name) in [(pb::Role::Viewer, "alpha-viewer"), (pb::Role::Member, "alpha-member")] {
        let token = stack.create_user(name).await;
        stack.add_member("alpha", name, role).await;
        alpha_callers.push((Caller::Alpha(role), Some(token)));
    }
    let mut tokens = vec![
        (Caller::NoToken, None),
        (
            Caller::WrongToken,
            Some(format!("kiln_{}_{}", "a".repeat(16), "b".repeat(64))),
        ),
    ];
    for (role, name) in [
        (pb::Role::Viewer, "beta-viewer"),
        (pb::Role::Member, "beta-member"),
        (pb::Role::Maintainer, "beta-maintainer"),
    ] {
        let token = stack.create_user(name).await;
        stack.add_member("beta", name, role).await;
        tokens.push((Caller::Outsider(role), Some(token)));
    }
    // alpha's objects: a running job and a batch.
    let job = submit(&stack, &alpha_token, "alpha", "echo up; sleep 120").await;
    let batch = stack
        .batches_client_at(stack.batches_addr.expect("item-batch"))
        .await
        .create_batch(pb::CreateBatchRequest {
            spec: Some(pb::BatchSpec {
                project: "alpha".into(),
                command: vec!["echo".into(), "{uri}".into()],
                ..Default::default()
            }),
        })
        .await
        .expect("create batch")
        .into_inner();
    // A sweep of one trial that runs `true`.
    let sweep = stack
        .sweeps_as(&alpha_token)
        .await
        .create_sweep(pb::CreateSweepRequest {
            spec_yaml: "name: alpha-sweep\nobjective: {metric: loss, goal: minimize}\nalgorithm: {name: random}\n\
                        budget: {max-trials: 1}\nparameters: {x: {type: float, min: 0, max: 1}}\n\
                        trial: {command: [\"true\"]}\n"
                .into(),
            project: "alpha".into(),
            ..Default::default()
        })
        .await
        .expect("create sweep")
        .into_inner();
    let (archive, digest) = crate::bundle(&[("data.txt", "alpha's")]);
    let mut artifacts = stack.artifacts_as(&alpha_token).await;
    crate::upload_to(&mut artifacts, &archive, &digest, "alpha")
        .await
        .expect("upload");
    stack
        .datasets_as(&alpha_token)
        .await
        .create_dataset(pb::CreateDatasetRequest {
            name: "alpha-data".into(),
            digest: digest.clone(),
            project: "alpha".into(),
        })
        .await
        .expect("create dataset");
    let alpha_digest = digest;
    // A model of alpha (named as the matrix names what it addresses), recorded directly: its
    // job is still running.
    stack
        .store
        .insert_model_version(kiln_core::store::NewModelVersion {
            model: "matrix".into(),
            project: "alpha".into(),
            created_by: "alpha-maintainer".into(),
            job_id: job.id.clone(),
            lineage_json: "{}".into(),
            digest: format!("sha256:{}", "0".repeat(64)),
            ..Default::default()
        })
        .await
        .expect("record a model of alpha");
    // An inference service of alpha serving that model, scaled to zero (so no worker is started
    // for a version whose files are not there), named as the matrix names what it addresses.
    let (predictor, _, predictor_addr) = crate::serving::spawn_predictor_with_api(&stack).await;
    crate::serving::serve_client(predictor_addr, &alpha_token)
        .await
        .create_service(pb::CreateServiceRequest {
            name: "matrix".into(),
            project: "alpha".into(),
            definition: Some(pb::ServiceDefinition {
                models: vec![pb::ServiceModel {
                    model: "matrix".into(),
                    ..Default::default()
                }],
                scaling: Some(pb::Scaling {
                    min_replicas: 0,
                    max_replicas: 1,
                    ..Default::default()
                }),
                worker: Some(spec(&["true"])),
                ..Default::default()
            }),
        })
        .await
        .expect("create a service of alpha");
    // A revoked and an expired token of alpha's maintainer.
    let mut users = stack.users_as(&alpha_token).await;
    let revoked = users
        .create_token(pb::CreateTokenRequest {
            name: "to-revoke".into(),
            ..Default::default()
        })
        .await
        .expect("token")
        .into_inner()
        .secret;
    users
        .revoke_token(pb::RevokeTokenRequest {
            token: "to-revoke".into(),
        })
        .await
        .expect("revoke");
    let expired = users
        .create_token(pb::CreateTokenRequest {
            name: "short".into(),
            expires_in_secs: 1,
            ..Default::default()
        })
        .await
        .expect("token")
        .into_inner()
        .secret;
    tokens.push((Caller::Revoked, Some(revoked)));
    // The token a job of beta runs with, read from its log as the runner handed it over.
    let beta_member = tokens[3].1.clone().expect("beta member");
    let beta_job = submit(&stack, &beta_member, "beta", "echo token=$KILN_TOKEN; sleep 120").await;
    wait_for_line(&stack, &beta_job.id, "token=").await;
    let lines = stack.log_lines(&beta_job.id, false).await;
    let job_token = lines
        .iter()
        .find_map(|line| line.text.strip_prefix("token="))
        .expect("the job's token")
        .to_string();
    tokens.push((Caller::OtherJob, Some(job_token)));
    // beta's own objects of the kinds the cross-project matrix names: a batch, a blob and a
    // dataset of it, and an object among each project's job's outputs.
    let beta_maintainer = tokens[4].1.clone().expect("beta maintainer");
    let beta_batch = stack
        .batches_client_at(stack.batches_addr.expect("item-batch"))
        .await
        .create_batch(pb::CreateBatchRequest {
            spec: Some(pb::BatchSpec {
                project: "beta".into(),
                command: vec!["echo".into(), "{uri}".into()],
                ..Default::default()
            }),
        })
        .await
        .expect("create a batch of beta")
        .into_inner();
    let (beta_archive, beta_digest) = crate::bundle(&[("data.txt", "beta's")]);
    crate::upload_to(
        &mut stack.artifacts_as(&beta_maintainer).await,
        &beta_archive,
        &beta_digest,
        "beta",
    )
    .await
    .expect("upload to beta");
    stack
        .datasets_as(&beta_maintainer)
        .await
        .create_dataset(pb::CreateDatasetRequest {
            name: "beta-data".into(),
            digest: beta_digest.clone(),
            project: "beta".into(),
        })
        .await
        .expect("create a dataset of beta");
    // beta's own model and service, named as alpha's (names are unique per project).
    stack
        .store
        .insert_model_version(kiln_core::store::NewModelVersion {
            model: "matrix".into(),
            project: "beta".into(),
            created_by: "beta-maintainer".into(),
            job_id: beta_job.id.clone(),
            lineage_json: "{}".into(),
            digest: format!("sha256:{}", "1".repeat(64)),
            ..Default::default()
        })
        .await
        .expect("record a model of beta");
    crate::serving::serve_client(predictor_addr, &beta_maintainer)
        .await
        .create_service(pb::CreateServiceRequest {
            name: "matrix".into(),
            project: "beta".into(),
            definition: Some(pb::ServiceDefinition {
                models: vec![pb::ServiceModel {
                    model: "matrix".into(),
                    ..Default::default()
                }],
                scaling: Some(pb::Scaling {
                    min_replicas: 0,
                    max_replicas: 1,
                    ..Default::default()
                }),
                worker: Some(spec(&["true"])),
                ..Default::default()
            }),
        })
        .await
        .expect("create a service of beta named as alpha's");
    for job_id in [&job.id, &beta_job.id] {
        let inbox = stack.objects_dir().join("outputs").join(job_id).join("in");
        std::fs::create_dir_all(&inbox).expect("outputs dir");
        std::fs::write(inbox.join("item.txt"), "an item\n").expect("an output object");
    }
    wait_for_line(&stack, &job.id, "up").await;
    // By now the short token has expired (it lived one second).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while stack
        .node_as(stack.api_addr, &expired)
        .await
        .who_am_i(pb::WhoAmIRequest {})
        .await
        .is_ok()
    {
        assert!(tokio::time::Instant::now() < deadline, "the short token never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokens.push((Caller::Expired, Some(expired)));
    tokens.extend(alpha_callers);
    // Last: the maintainer's calls change things (stop the job, cancel the batch).
    tokens.push((Caller::Alpha(pb::Role::Maintainer), Some(alpha_token)));
    World {
        addresses: Addresses {
            api: stack.api_addr,
            logs: stack.logs_addr,
            batches: stack.batches_addr.expect("item-batch"),
            scheduler: stack.scheduler_addr,
            runner: runner_addr,
            advisor: stack.advisor_addr.expect("advisor"),
            predictor: predictor_addr,
        },
        alpha: Alpha {
            job_id: job.id,
            batch_id: batch.id,
            sweep_id: sweep.id,
        },
        references: References {
            alpha_digest,
            beta_job_id: beta_job.id,
            beta_batch_id: beta_batch.id,
            beta_digest,
        },
        stack,
        tokens,
        _runner: runner,
        _predictor: predictor,
    }
}
