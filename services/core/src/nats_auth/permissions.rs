//! The permission table: what each service may publish and subscribe to.
//!
//! Derived from every use of [`crate::subjects`] (publish, subscribe, request, stream consumers,
//! KV buckets) in the services. Kiln's own subjects are granted exactly (one `*` per id token);
//! the JetStream API is granted per stream:
//!
//! - every service: read-only metadata (`$JS.API.INFO`, `STREAM.INFO|LIST|NAMES`,
//!   `CONSUMER.INFO|LIST|NAMES` on every stream; what `kiln_nats_*` lag metrics and
//!   `get_key_value` read), and subscribing under its own inbox prefix;
//! - every service but the runner: creating and updating kiln's streams and buckets (each
//!   service makes sure they exist at start; the runner, which shares a machine with tenants'
//!   jobs, only finds them);
//! - a stream a service consumes: its consumers' API (`$JS.API.CONSUMER.*.<S>[.>]`: create,
//!   info, delete; `$JS.API.CONSUMER.MSG.NEXT.<S>.>`: pull), acks (`$JS.ACK.<S>.>`) and flow
//!   control (`$JS.FC.<S>.>`);
//! - a KV bucket a service reads: direct gets on its stream; one it lists or watches: also
//!   its consumers; one it writes: publishing on the keys it owns (`$KV.<bucket>.<key>`), one
//!   exact key for a leader lease.
//!
//! Replies: a service that answers requests (scheduler explain, log-ingest latest values, the
//! runner's inference relays) has `allow_responses`, which lets it publish on the reply subject
//! of a request it received, once, and nowhere else under `_INBOX`.

use crate::nats_auth::Service;
use crate::streams::{BUCKETS, bucket_stream};
use crate::subjects::*;

/// What one NATS user may publish and subscribe to (nats-server `permissions`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Permissions {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
    /// May publish once on the reply subject of each message it received.
    pub allow_responses: bool,
}

impl Permissions {
    fn publish(&mut self, subject: impl Into<String>) -> &mut Self {
        let subject = subject.into();
        if !self.publish.contains(&subject) {
            self.publish.push(subject);
        }
        self
    }

    fn subscribe(&mut self, subject: impl Into<String>) -> &mut Self {
        let subject = subject.into();
        if !self.subscribe.contains(&subject) {
            self.subscribe.push(subject);
        }
        self
    }

    /// Pull or push consumers of `stream`: their API, acks and flow control.
    fn consume(&mut self, stream: &str) -> &mut Self {
        self.publish(format!("$JS.API.CONSUMER.CREATE.{stream}"))
            .publish(format!("$JS.API.CONSUMER.*.{stream}.>"))
            // Two tokens before the stream's name: `*` does not cover them.
            .publish(format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.>"))
            .publish(format!("$JS.ACK.{stream}.>"))
            .publish(format!("$JS.FC.{stream}.>"))
    }

    /// Reads single keys of `bucket` (direct get, or the stream's message get).
    fn kv_read(&mut self, bucket: &str) -> &mut Self {
        let stream = bucket_stream(bucket);
        self.publish(format!("$JS.API.DIRECT.GET.{stream}"))
            .publish(format!("$JS.API.DIRECT.GET.{stream}.>"))
            .publish(format!("$JS.API.STREAM.MSG.GET.{stream}"))
    }

    /// Reads `bucket` whole: its keys and a watch of it.
    fn kv_list(&mut self, bucket: &str) -> &mut Self {
        self.kv_read(bucket).consume(&bucket_stream(bucket))
    }

    /// Writes (puts, creates, updates, deletes) `key` of `bucket`; `*` for any key.
    fn kv_write(&mut self, bucket: &str, key: &str) -> &mut Self {
        self.kv_read(bucket).publish(format!("$KV.{bucket}.{key}"))
    }

    /// Takes and renews the leader lease `name` in `kiln_leases`.
    fn lease(&mut self, name: &str) -> &mut Self {
        self.kv_write(BUCKET_LEASES, name)
    }

    /// Publishes the job state changes a service makes (`kiln.job.queued`, `kiln.job.event.*`).
    fn job_changes(&mut self) -> &mut Self {
        self.publish(JOB_QUEUED).publish(JOB_EVENT_ANY)
    }
}

/// `kiln.job.event.<job>`: one job id token.
const JOB_EVENT_ANY: &str = "kiln.job.event.*";
/// `kiln.launch.<pool>` and `kiln.launch.<pool>.<runner>`.
const LAUNCH_ANY: &str = "kiln.launch.>";
const CONTROL_ANY: &str = "kiln.control.*";
const METRICS_ANY: &str = "kiln.metrics.*";
/// `kiln.logs.<job>` (not `kiln.logs.item.<batch>`, which no service publishes).
const LOGS_ANY: &str = "kiln.logs.*";
const ITEMS_ANY: &str = "kiln.items.*";
const ITEM_RESULTS_ANY: &str = "kiln.itemres.*";
/// `kiln.serve.<project>.<service>.<revision>.<member>`.
const SERVE_ANY: &str = "kiln.serve.*.*.*.*";

/// Every stream kiln keeps: its own and those of its KV buckets.
fn kiln_streams() -> Vec<String> {
    let mut streams: Vec<String> = [
        STREAM_JOBS,
        STREAM_LAUNCH,
        STREAM_CONTROL,
        STREAM_METRICS,
        STREAM_LOGS,
        STREAM_ITEMS,
        STREAM_ITEM_RESULTS,
        STREAM_CHANGES,
    ]
    .map(str::to_string)
    .into();
    streams.extend(BUCKETS.iter().map(|(bucket, _)| bucket_stream(bucket)));
    streams
}

/// What every service may do: subscribe under its inbox, read JetStream metadata.
fn common(service: Service) -> Permissions {
    let mut permissions = Permissions::default();
    permissions
        .subscribe(format!("{}.>", service.inbox_prefix()))
        .publish("$JS.API.INFO")
        .publish("$JS.API.STREAM.INFO.*")
        .publish("$JS.API.STREAM.LIST")
        .publish("$JS.API.STREAM.NAMES")
        .publish("$JS.API.CONSUMER.LIST.*")
        .publish("$JS.API.CONSUMER.NAMES.*")
        .publish("$JS.API.CONSUMER.INFO.*.*");
    if service != Service::Runner {
        for stream in kiln_streams() {
            permissions
                .publish(format!("$JS.API.STREAM.CREATE.{stream}"))
                .publish(format!("$JS.API.STREAM.UPDATE.{stream}"));
        }
    }
    permissions
}

/// The permissions of `service`.
pub(super) fn of(service: Service) -> Permissions {
    let mut p = common(service);
    match service {
        Service::Api => {
            // Submit, stop, external runs; explain asks the scheduler, model registration asks
            // log-ingest; WatchJob follows a job's events, WatchJobs reads them from KILN_JOBS.
            p.job_changes()
                .publish(CONTROL_ANY)
                .publish(SCHEDULER_EXPLAIN)
                .publish(INGEST_LATEST_VALUES)
                .subscribe(JOB_EVENT_ANY)
                .consume(STREAM_JOBS);
        }
        Service::Scheduler => {
            p.job_changes()
                .publish(LAUNCH_ANY)
                .publish(CONTROL_ANY)
                .consume(STREAM_JOBS)
                .subscribe(SCHEDULER_EXPLAIN)
                .lease(LEASE_SCHEDULER)
                .kv_write(BUCKET_SCHEDULER, KEY_PREEMPTION_RATES)
                .kv_write(BUCKET_DEMAND, KEY_DEMAND)
                .kv_list(BUCKET_PROVISIONER)
                .kv_list(BUCKET_CAPACITY)
                .kv_list(BUCKET_RUNNERS);
            p.allow_responses = true;
        }
        Service::Runner => {
            // Launches and stop requests in; job changes, logs, metrics, its capacity and
            // liveness out; inference requests through its relays.
            // kiln.launch.>: after a restart a runner republishes the unpublished changes of
            // its jobs, a SCHEDULED one's launch included (the launch is a hint: the record's
            // state decides, and the scheduler republishes it too).
            p.job_changes()
                .publish(LAUNCH_ANY)
                .publish(METRICS_ANY)
                .publish(LOGS_ANY)
                .consume(STREAM_LAUNCH)
                .consume(STREAM_CONTROL)
                .kv_write(BUCKET_CAPACITY, "*")
                .kv_write(BUCKET_RUNNERS, "*")
                // Its instance's price, from its pool's status.
                .kv_read(BUCKET_PROVISIONER)
                .subscribe(SERVE_ANY)
                .publish(SERVE_LOAD_ALL)
                // Its instance's spot notices (rebalance, interruption), for the provisioner.
                .publish(INSTANCE_NOTICE_ALL);
            p.allow_responses = true;
        }
        Service::LogIngest => {
            p.publish(METRICS_ANY)
                .publish(LOGS_ANY)
                .consume(STREAM_LOGS)
                .consume(STREAM_METRICS)
                // The items' kept lines, into the log store.
                .consume(STREAM_ITEM_RESULTS)
                .subscribe(JOB_EVENT_ANY)
                .subscribe(INGEST_LATEST_VALUES)
                .lease(LEASE_LOG_INGEST);
            p.allow_responses = true;
        }
        Service::ItemBatch => {
            p.job_changes()
                .publish(CONTROL_ANY)
                .publish(ITEMS_ANY)
                .publish(ITEM_RESULTS_ANY)
                .consume(STREAM_ITEMS)
                .consume(STREAM_ITEM_RESULTS)
                .publish(format!("$JS.API.STREAM.PURGE.{STREAM_ITEMS}"))
                .lease(LEASE_ITEM_BATCH_SCALER)
                // Its batches' changes, and WatchBatches reading them.
                .publish(CHANGES_BATCHES)
                .consume(STREAM_CHANGES);
        }
        Service::Advisor => {
            // Registering a sweep's best trial as a model version asks log-ingest for its
            // latest metric values (kiln_core::models::Registry).
            p.job_changes()
                .publish(CONTROL_ANY)
                .publish(INGEST_LATEST_VALUES)
                .consume(STREAM_JOBS)
                .consume(STREAM_METRICS)
                .lease(LEASE_ADVISOR)
                .publish(CHANGES_SWEEPS)
                .consume(STREAM_CHANGES);
        }
        Service::Predictor => {
            p.job_changes()
                .publish(CONTROL_ANY)
                .publish(SERVE_ANY)
                .publish(SERVE_DEMAND_ALL)
                .subscribe(SERVE_LOAD_ALL)
                .subscribe(SERVE_DEMAND_ALL)
                // Keys are `PROJECT.NAME`; a one-token key is a definition written before names
                // were per project, which the controller deletes.
                .kv_write(BUCKET_SERVICES, "*.*")
                .kv_write(BUCKET_SERVICES, "*")
                .kv_list(BUCKET_SERVICES)
                .lease(LEASE_PREDICTOR_CONTROLLER)
                .publish(CHANGES_SERVICES)
                .consume(STREAM_CHANGES);
        }
        Service::Provisioner => {
            // Reads the scheduler's demand and the runners' reports and leases; writes its
            // pools' status. It holds the cloud credentials; no job subject is its.
            p.kv_list(BUCKET_DEMAND)
                .subscribe(INSTANCE_NOTICE_ALL)
                .kv_write(BUCKET_PROVISIONER, "*")
                .kv_list(BUCKET_PROVISIONER)
                .kv_list(BUCKET_CAPACITY)
                .kv_list(BUCKET_RUNNERS)
                .lease(LEASE_PROVISIONER);
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn can_publish(service: Service, subject: &str) -> bool {
        service
            .permissions()
            .publish
            .iter()
            .any(|allowed| matches(allowed, subject))
    }

    fn can_subscribe(service: Service, subject: &str) -> bool {
        service
            .permissions()
            .subscribe
            .iter()
            .any(|allowed| matches(allowed, subject))
    }

    /// NATS subject matching: `*` is one token, `>` one or more at the end.
    fn matches(pattern: &str, subject: &str) -> bool {
        let mut subject_tokens = subject.split('.');
        for token in pattern.split('.') {
            match (token, subject_tokens.next()) {
                (">", Some(_)) => return true,
                ("*", Some(_)) => {}
                (literal, Some(actual)) if literal == actual => {}
                _ => return false,
            }
        }
        subject_tokens.next().is_none()
    }

    #[test]
    fn subject_matching_follows_nats() {
        assert!(matches("kiln.logs.*", "kiln.logs.j1"));
        assert!(!matches("kiln.logs.*", "kiln.logs.item.b1"));
        assert!(matches(
            "$JS.API.CONSUMER.*.KILN_LAUNCH.>",
            "$JS.API.CONSUMER.INFO.KILN_LAUNCH.runner-local"
        ));
        // A pull's subject has two tokens before the stream.
        assert!(!matches(
            "$JS.API.CONSUMER.*.KILN_LAUNCH.>",
            "$JS.API.CONSUMER.MSG.NEXT.KILN_LAUNCH.runner-local"
        ));
        assert!(!matches(
            "$JS.API.CONSUMER.*.KILN_LAUNCH.>",
            "$JS.API.CONSUMER.CREATE.KILN_LAUNCH"
        ));
    }

    #[test]
    fn each_service_may_do_what_its_code_does() {
        assert!(can_publish(Service::Api, &job_event("j1")));
        assert!(can_publish(Service::Api, &control("j1")));
        assert!(can_publish(Service::Scheduler, &launch("local")));
        assert!(can_publish(Service::Scheduler, &launch_on("local", "runner-1")));
        assert!(can_publish(Service::Runner, &launch_on("local", "runner-1")));
        assert!(can_publish(Service::Runner, &logs("j1")));
        assert!(can_publish(Service::Runner, &metrics("j1")));
        assert!(can_publish(Service::Runner, "$KV.kiln_capacity.runner-1"));
        assert!(can_publish(Service::Runner, "$KV.kiln_runners.runner-1"));
        assert!(can_publish(Service::Runner, &serve_load("p", "svc")));
        assert!(can_publish(Service::Runner, &instance_notice("spot-cpu")));
        assert!(can_subscribe(Service::Runner, &serve("p", "svc", 3, "m1")));
        assert!(can_publish(Service::Predictor, &serve("p", "svc", 3, "m1")));
        assert!(can_publish(Service::ItemBatch, &items("b1")));
        assert!(can_publish(Service::ItemBatch, "$KV.kiln_leases.item-batch-scaler"));
        assert!(can_publish(
            Service::LogIngest,
            "$JS.ACK.KILN_LOGS.log-ingest.1.2.3.4.5.6"
        ));
        assert!(can_publish(
            Service::Runner,
            "$JS.API.CONSUMER.MSG.NEXT.KILN_LAUNCH.runner-local"
        ));
        assert!(can_publish(Service::Scheduler, "$JS.API.CONSUMER.CREATE.KILN_JOBS"));
        assert!(can_publish(
            Service::Predictor,
            "$JS.API.CONSUMER.CREATE.KV_kiln_services.w1.$KV.kiln_services.>"
        ));
        assert!(can_subscribe(Service::Scheduler, SCHEDULER_EXPLAIN));
        assert!(can_publish(Service::Advisor, INGEST_LATEST_VALUES));
        for service in Service::ALL {
            assert!(can_subscribe(service, &format!("{}.abc.1", service.inbox_prefix())));
            assert!(can_publish(service, "$JS.API.STREAM.INFO.KILN_JOBS"));
        }
    }

    #[test]
    fn each_service_may_not_do_what_another_does() {
        // A runner (the machine tenants' jobs share) reads no logs, metrics or replies of
        // others, stops no job, takes no lease, creates no stream.
        for subject in [LOGS_ALL, METRICS_ALL, "_INBOX.>", "_INBOX.api.>", "kiln.job.>"] {
            assert!(!can_subscribe(Service::Runner, subject), "{subject}");
        }
        assert!(!can_publish(Service::Runner, &control("j1")));
        assert!(!can_publish(Service::Runner, "$KV.kiln_leases.scheduler"));
        assert!(!can_publish(Service::Runner, "$JS.API.CONSUMER.CREATE.KILN_LOGS"));
        assert!(!can_publish(
            Service::Runner,
            "$JS.API.CONSUMER.MSG.NEXT.KILN_LOGS.log-ingest"
        ));
        assert!(!can_publish(Service::Runner, "$JS.API.STREAM.CREATE.KILN_LOGS"));
        assert!(!can_publish(Service::Runner, "$JS.API.STREAM.DELETE.KILN_LOGS"));
        // Leases: each service its own.
        assert!(!can_publish(Service::ItemBatch, "$KV.kiln_leases.scheduler"));
        assert!(!can_publish(Service::Advisor, "$KV.kiln_leases.predictor-controller"));
        // Only the runners' relays report load; only the scheduler launches.
        assert!(!can_publish(Service::Predictor, &serve_load("p", "svc")));
        assert!(!can_publish(Service::Api, &launch("local")));
        assert!(!can_publish(Service::Api, &launch_on("local", "runner-1")));
        // Only runners tell of their instances' notices.
        for service in Service::ALL.into_iter().filter(|s| *s != Service::Runner) {
            assert!(!can_publish(service, &instance_notice("spot-cpu")), "{service}");
        }
        // No one deletes a stream.
        for service in Service::ALL {
            assert!(!can_publish(service, "$JS.API.STREAM.DELETE.KILN_JOBS"), "{service}");
            assert!(!can_subscribe(service, ">"), "{service}");
        }
    }
}
