//! Every JetStream stream, subject, consumer and KV bucket name, declared once.
//!
//! | stream | subjects | retention | producer → consumer |
//! |---|---|---|---|
//! | `KILN_JOBS` | `kiln.job.queued`, `kiln.job.event.<job>` | limits | api, scheduler, runner → scheduler, watchers |
//! | `KILN_LAUNCH` | `kiln.launch.<pool>[.<runner>]` | work queue | scheduler → runner |
//! | `KILN_CONTROL` | `kiln.control.<job>` | interest | api → runner |
//! | `KILN_METRICS` | `kiln.metrics.<job>` | limits (short) | log-ingest → log-ingest writers |
//! | `KILN_LOGS` | `kiln.logs.<job>`, `kiln.logs.item.<batch>` | limits (short) | runner, agent → log-ingest |
//! | `KILN_ITEMS` | `kiln.items.<batch>` | work queue | item-batch → kiln-agent |
//! | `KILN_ITEM_RESULTS` | `kiln.itemres.<batch>` | limits | item-batch's sessions (agents' outcomes, grouped) → item-batch, log-ingest |
//! | `KILN_CHANGES` | `kiln.changes.<list>` | limits (a day) | item-batch, advisor, predictor → their list watchers |
//!
//! Core NATS (no stream): [`instance_notice`], a runner on a spot instance → the provisioner
//! (and anyone watching): its cloud's rebalance recommendation or interruption notice.
//!
//! Request/reply on core NATS (no stream): [`SCHEDULER_EXPLAIN`], api → scheduler leader;
//! [`INGEST_LATEST_VALUES`], the model registry → log-ingest; [`serve`], the predictor → the
//! relays of inference workers (queue group [`QUEUE_SERVE`]).

pub const STREAM_JOBS: &str = "KILN_JOBS";
pub const STREAM_LAUNCH: &str = "KILN_LAUNCH";
pub const STREAM_CONTROL: &str = "KILN_CONTROL";
pub const STREAM_METRICS: &str = "KILN_METRICS";
pub const STREAM_LOGS: &str = "KILN_LOGS";
pub const STREAM_ITEMS: &str = "KILN_ITEMS";
pub const STREAM_ITEM_RESULTS: &str = "KILN_ITEM_RESULTS";
pub const STREAM_CHANGES: &str = "KILN_CHANGES";

/// Published when a job enters QUEUED (submit, re-queue).
pub const JOB_QUEUED: &str = "kiln.job.queued";
/// Every subject of `KILN_JOBS`.
pub const JOB_ALL: &str = "kiln.job.>";
pub const JOB_EVENT_ALL: &str = "kiln.job.event.>";
pub const LAUNCH_ALL: &str = "kiln.launch.>";
pub const CONTROL_ALL: &str = "kiln.control.>";
pub const METRICS_ALL: &str = "kiln.metrics.>";
pub const LOGS_ALL: &str = "kiln.logs.>";
pub const ITEMS_ALL: &str = "kiln.items.>";
pub const ITEM_RESULTS_ALL: &str = "kiln.itemres.>";
pub const CHANGES_ALL: &str = "kiln.changes.>";
/// The ids of batches changed (`ListChanged`), for WatchBatches.
pub const CHANGES_BATCHES: &str = "kiln.changes.batches";
/// The ids of sweeps changed, for WatchSweeps.
pub const CHANGES_SWEEPS: &str = "kiln.changes.sweeps";
/// The ids of services changed, for WatchServices.
pub const CHANGES_SERVICES: &str = "kiln.changes.services";

/// Request/reply: the api asks the scheduler leader why a queued job waits (`ExplainRequest`,
/// answered with an `ExplainReply`). Only the leader subscribes, so standbys stay silent.
pub const SCHEDULER_EXPLAIN: &str = "kiln.scheduler.explain";

/// Request/reply: the model registry asks log-ingest for a job's latest value of every metric
/// key (`LatestValuesRequest`, answered with a `LatestValuesReply`), for a version's lineage.
/// Outside `kiln.metrics.>`, so no stream captures the requests.
pub const INGEST_LATEST_VALUES: &str = "kiln.ingest.latest-values";
/// Queue group of the log-ingest replicas answering [`INGEST_LATEST_VALUES`]: one answers each.
pub const QUEUE_INGEST_LATEST_VALUES: &str = "log-ingest-latest-values";

/// The lease in `kiln_leases` whose holder is the leading scheduler.
pub const LEASE_SCHEDULER: &str = "scheduler";
/// The lease in `kiln_leases` whose holder is the item-batch replica running the autoscaler.
pub const LEASE_ITEM_BATCH_SCALER: &str = "item-batch-scaler";
/// The lease in `kiln_leases` held by the log-ingest whose stores are embedded (SQLite): the
/// only one a NATS account may have.
pub const LEASE_LOG_INGEST: &str = "log-ingest";
/// Durable consumer of the log writers on `KILN_LOGS`, shared by all log-ingest replicas.
pub const CONSUMER_LOG_INGEST: &str = "log-ingest";

/// Durable consumer of the metric writers on `KILN_METRICS`, shared by all log-ingest replicas.
pub const CONSUMER_METRICS: &str = "log-ingest-metrics";

/// Durable consumer of item-batch on `KILN_ITEM_RESULTS`, shared by all its replicas.
pub const CONSUMER_ITEM_RESULTS: &str = "item-batch-results";

/// Durable consumer of log-ingest on `KILN_ITEM_RESULTS`: the items' kept lines into the log
/// store, shared by all log-ingest replicas.
pub const CONSUMER_ITEM_LINES: &str = "log-ingest-item-lines";

/// The lease in `kiln_leases` whose holder is the predictor replica keeping the services'
/// workers (the controller).
pub const LEASE_PREDICTOR_CONTROLLER: &str = "predictor-controller";

/// The lease in `kiln_leases` whose holder is the advisor replica running the sweeps.
pub const LEASE_ADVISOR: &str = "advisor";
/// Lease name of the provisioning leader (launches, reconciles and releases machines).
pub const LEASE_PROVISIONER: &str = "provisioner";
/// Durable consumer of the advisor leader on `KILN_METRICS` (trials' objective points).
pub const CONSUMER_ADVISOR_METRICS: &str = "advisor-metrics";
/// Durable consumer of the advisor leader on `KILN_JOBS` (trials' state changes wake it).
pub const CONSUMER_ADVISOR_JOBS: &str = "advisor-jobs";

/// KV bucket holding the leader leases.
pub const BUCKET_LEASES: &str = "kiln_leases";
/// KV bucket holding each runner's capacity report, keyed by runner id.
pub const BUCKET_CAPACITY: &str = "kiln_capacity";
/// KV bucket holding each runner's liveness lease, keyed by runner id.
pub const BUCKET_RUNNERS: &str = "kiln_runners";
/// KV bucket holding each inference service's live definition
/// ([`crate::serving::ServiceSpec`], JSON), keyed by `PROJECT.NAME`
/// ([`crate::serving::service_key`]; service names are unique per project): the predictor
/// holding the controller lease writes it, every predictor watches it.
pub const BUCKET_SERVICES: &str = "kiln_services";
/// KV bucket holding what the scheduling leader learnt and its successor takes over.
pub const BUCKET_SCHEDULER: &str = "kiln_scheduler";
/// Key in [`BUCKET_SCHEDULER`]: the pools' spot preemption rates, as JSON.
pub const KEY_PREEMPTION_RATES: &str = "preemption-rates";
/// KV bucket the scheduling leader writes after each pass: the jobs no live runner holds
/// ([`crate::provisioning::Demand`]), read by the provisioner.
pub const BUCKET_DEMAND: &str = "kiln_demand";
/// Key in [`BUCKET_DEMAND`]: the newest snapshot.
pub const KEY_DEMAND: &str = "demand";
/// KV bucket the provisioning leader writes after each cycle, keyed by pool
/// ([`crate::provisioning::PoolStatus`]), read by the scheduler and `kiln explain`.
pub const BUCKET_PROVISIONER: &str = "kiln_provisioner";

pub fn job_event(job_id: &str) -> String {
    format!("kiln.job.event.{job_id}")
}

/// Request/reply: one inference request for `member` of revision `revision` of `service` of
/// `project`, answered by one of the relays of that member's workers (queue group
/// [`QUEUE_SERVE`]). Project, service and member names are NATS tokens
/// ([`validate_token`], [`crate::serving::check_name`]).
pub fn serve(project: &str, service: &str, revision: u64, member: &str) -> String {
    format!("kiln.serve.{project}.{service}.{revision}.{member}")
}

/// The queue group of the relays on a [`serve`] subject: each request reaches one worker.
pub const QUEUE_SERVE: &str = "workers";

/// Core NATS: a relay's load report ([`crate::serving::LoadReport`], JSON) for `service` of
/// `project`, read by the predictor holding the controller lease.
pub fn serve_load(project: &str, service: &str) -> String {
    format!("kiln.serving.load.{project}.{service}")
}
pub const SERVE_LOAD_ALL: &str = "kiln.serving.load.*.*";

/// Core NATS: a predictor holding a request for `service` of `project` found no worker of a
/// member (the payload names the revision); the controller asks for one when the service scales
/// to zero.
pub fn serve_demand(project: &str, service: &str) -> String {
    format!("kiln.serving.demand.{project}.{service}")
}
pub const SERVE_DEMAND_ALL: &str = "kiln.serving.demand.*.*";

/// The launches of a pool any of its runners may take (a job placed on no runner in particular).
/// Where a gang job's node keeps its log lines: the job's id for rank 0, `<job>/node<rank>` for
/// the others (their own sequence and end record; readers name the node).
pub fn node_log_id(job_id: &str, rank: u32) -> String {
    if rank == 0 {
        job_id.to_string()
    } else {
        format!("{job_id}/node{rank}")
    }
}

pub fn launch(pool: &str) -> String {
    format!("kiln.launch.{pool}")
}

/// The launches of jobs placed on one runner; only that runner's consumer reads them.
pub fn launch_on(pool: &str, runner_id: &str) -> String {
    format!("kiln.launch.{pool}.{runner_id}")
}

/// A runner's instance was warned by its cloud (`kiln_core::capacity::InstanceNotice`, JSON):
/// `kiln.instance.notice.<pool>`. Core NATS, not a stream: the runner's cordon (in its capacity
/// report) and its jobs' PREEMPTED events are the durable record; this is the early word.
pub fn instance_notice(pool: &str) -> String {
    format!("kiln.instance.notice.{pool}")
}

/// Every pool's [`instance_notice`]s.
pub const INSTANCE_NOTICE_ALL: &str = "kiln.instance.notice.*";

pub fn control(job_id: &str) -> String {
    format!("kiln.control.{job_id}")
}

pub fn logs(job_id: &str) -> String {
    format!("kiln.logs.{job_id}")
}

pub fn item_logs(batch_id: &str) -> String {
    format!("kiln.logs.item.{batch_id}")
}

pub fn items(batch_id: &str) -> String {
    format!("kiln.items.{batch_id}")
}

pub fn item_results(batch_id: &str) -> String {
    format!("kiln.itemres.{batch_id}")
}

/// Durable consumer of one batch on `KILN_ITEMS`, shared by all its workers' sessions.
pub fn consumer_items(batch_id: &str) -> String {
    format!("items-{batch_id}")
}

/// JetStream message id of an item (in a RetryFailed round) on `KILN_ITEMS`.
pub fn item_msg_id(batch_id: &str, key: &str, round: u32) -> String {
    format!("{batch_id}:{key}:{round}")
}

/// JetStream message id of an attempt's outcome on `KILN_ITEM_RESULTS` recorded on its own
/// (an item lost too often).
pub fn item_result_msg_id(batch_id: &str, key: &str, round: u32, attempt: u32) -> String {
    format!("{batch_id}:{key}:{round}:{attempt}")
}

/// JetStream message id of a group of outcomes on `KILN_ITEM_RESULTS`: the `group`th a worker's
/// session (`session`, an id of its own) recorded.
pub fn item_results_msg_id(batch_id: &str, session: &str, group: u64) -> String {
    format!("{batch_id}:{session}:{group}")
}

pub fn metrics(job_id: &str) -> String {
    format!("kiln.metrics.{job_id}")
}

/// Durable consumer of the runners of one pool on `KILN_LAUNCH` (a work queue: each launch goes
/// to one runner).
pub fn consumer_launch(pool: &str) -> String {
    format!("runner-{pool}")
}

/// Durable consumer of one runner on `KILN_LAUNCH`, reading [`launch_on`] its own subject.
pub fn consumer_launch_on(runner_id: &str) -> String {
    format!("launch-{runner_id}")
}

/// Durable consumer of one runner on `KILN_CONTROL`.
pub fn consumer_control(runner_id: &str) -> String {
    format!("control-{runner_id}")
}

/// The kind of a consumer, the label its lag is exported under: consumers of one batch or one
/// runner are summed as `items`, `control` and `launch`; a pool's launch consumer and the shared ones keep
/// their names; anything else (an ephemeral consumer) is `ephemeral`.
pub fn consumer_kind(name: &str) -> &str {
    if name.starts_with("items-") {
        "items"
    } else if name.starts_with("control-") {
        "control"
    } else if name.starts_with("launch-") {
        "launch"
    } else if name.starts_with("runner-")
        || [
            CONSUMER_LOG_INGEST,
            CONSUMER_METRICS,
            CONSUMER_ITEM_RESULTS,
            CONSUMER_ITEM_LINES,
            CONSUMER_ADVISOR_METRICS,
            CONSUMER_ADVISOR_JOBS,
        ]
        .contains(&name)
    {
        name
    } else {
        "ephemeral"
    }
}

/// Checks that a pool or runner name can be used as a subject token and consumer name.
pub fn validate_token(what: &str, name: &str) -> Result<(), String> {
    let valid =
        !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{what} {name:?} must be 1 to 64 characters of letters, digits, '-' or '_'"
        ))
    }
}

/// JetStream message id of a job's state change, for de-duplication.
pub fn job_msg_id(job_id: &str, version: i64) -> String {
    format!("{job_id}:{version}")
}
