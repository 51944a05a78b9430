//! The change feeds of lists (`JobService/WatchJobs`, `BatchService/WatchBatches`,
//! `SweepService/WatchSweeps`, `ServeService/WatchServices`) as the web UI reads them,
//! server-sent events from a real `kiln up`: the list, then only what changed, resumed after the
//! last event id, and none of another tenant's changes.

use std::io::{BufRead, BufReader};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common;

use common::http::{Auth, client, json_of, rpc};
use common::{Up, last_line};

/// An open event stream, read an event at a time.
struct Events(BufReader<reqwest::blocking::Response>);

impl Events {
    /// WatchJobs of every run.
    fn open(up: &Up, auth: &Auth, last_event_id: Option<&str>) -> Events {
        let request = json!({"list": {"all": true, "everyone": true, "limit": 10000}});
        Events::watch(up, auth, "JobService/WatchJobs", request, last_event_id)
    }

    fn watch(up: &Up, auth: &Auth, method: &str, request: Value, last_event_id: Option<&str>) -> Events {
        let request = request.to_string();
        let mut call = auth.apply(
            client()
                .get(format!("{}/api/v1/stream/{method}", up.ui_url()))
                .query(&[("request", request.as_str())]),
        );
        if let Some(id) = last_event_id {
            call = call.header("last-event-id", id);
        }
        let response = call.send().unwrap();
        if response.status() != StatusCode::OK {
            panic!("{}: {}", response.status(), response.text().unwrap());
        }
        Events(BufReader::new(response))
    }

    /// The next `message` event: its id and its JobChanges.
    fn next(&mut self) -> (Option<String>, Value) {
        let (mut id, mut data, mut kind) = (None, String::new(), "message".to_string());
        loop {
            let mut line = String::new();
            assert!(self.0.read_line(&mut line).unwrap() > 0, "the stream ended");
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if !data.is_empty() {
                    assert_eq!(kind, "message", "{data}");
                    return (id, serde_json::from_str(&data).unwrap());
                }
                continue;
            }
            if let Some(value) = line.strip_prefix("id:") {
                id = Some(value.trim().to_string());
            } else if let Some(value) = line.strip_prefix("data:") {
                data.push_str(value.trim());
            } else if let Some(value) = line.strip_prefix("event:") {
                kind = value.trim().to_string();
            }
        }
    }
}

impl Events {
    /// Events until one whose `field` list holds a record for which `found` holds; that
    /// event's id and the record.
    fn until(&mut self, field: &str, found: impl Fn(&Value) -> bool) -> (Option<String>, Value) {
        loop {
            let (id, changes) = self.next();
            if let Some(record) = changes[field].as_array().unwrap().iter().find(|r| found(r)) {
                return (id, record.clone());
            }
        }
    }
}

fn ids_and_states(changes: &Value) -> Vec<(String, String)> {
    changes["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| {
            (
                job["id"].as_str().unwrap().into(),
                job["state"].as_str().unwrap().into(),
            )
        })
        .collect()
}

fn run(up: &Up, auth: &Auth, name: &str) -> String {
    let (status, job) = json_of(rpc(up, auth, "JobService/CreateRun", json!({"name": name})));
    assert_eq!(status, StatusCode::OK, "{job}");
    job["id"].as_str().unwrap().to_string()
}

fn finish(up: &Up, auth: &Auth, job: &str) {
    let (status, answer) = json_of(rpc(up, auth, "JobService/FinishRun", json!({"jobId": job})));
    assert_eq!(status, StatusCode::OK, "{answer}");
}

#[test]
fn a_watched_list_receives_what_changed_resumes_after_its_last_event_and_sees_no_other_tenant() {
    let up = Up::start();
    let admin = Auth::Bearer(up.admin_token());
    let runs: Vec<String> = (0..3).map(|n| run(&up, &admin, &format!("r{n}"))).collect();

    let mut events = Events::open(&up, &admin, None);
    let (id, first) = events.next();
    assert_eq!(first["reset"], true, "the list first: {first}");
    let listed: Vec<String> = ids_and_states(&first).into_iter().map(|(id, _)| id).collect();
    let newest_first: Vec<String> = runs.iter().rev().cloned().collect();
    assert_eq!(listed, newest_first);
    let listed_at = id.expect("the list's last page carries its seq as the event id");
    assert_eq!(first["seq"].to_string(), listed_at);

    finish(&up, &admin, &runs[0]);
    let (id, changed) = events.next();
    assert_eq!(changed["reset"], false);
    assert_eq!(
        ids_and_states(&changed),
        [(runs[0].clone(), "JOB_STATE_SUCCEEDED".to_string())]
    );
    let seen = id.unwrap();
    assert!(seen.parse::<u64>().unwrap() > listed_at.parse::<u64>().unwrap());
    drop(events);

    // Gone, then back with the last event id: only what changed meanwhile.
    finish(&up, &admin, &runs[1]);
    let mut events = Events::open(&up, &admin, Some(&seen));
    let (_, resumed) = events.next();
    assert_eq!(resumed["reset"], false, "no second list: {resumed}");
    assert_eq!(
        ids_and_states(&resumed),
        [(runs[1].clone(), "JOB_STATE_SUCCEEDED".to_string())]
    );

    // A member of another project lists nothing and hears nothing of the admin's runs, but
    // their own.
    let vic = Auth::Bearer(last_line(&up.kiln(&["user", "create", "vic"])));
    assert!(up.kiln(&["project", "create", "vics"]).status.success());
    let added = up.kiln(&["project", "add-member", "vics", "vic", "--role", "member"]);
    assert!(added.status.success());
    let mut theirs = Events::open(&up, &vic, None);
    let (_, empty) = theirs.next();
    assert_eq!(
        (empty["reset"].as_bool(), ids_and_states(&empty).len()),
        (Some(true), 0)
    );
    finish(&up, &admin, &runs[2]);
    let (_, admin_saw) = events.next();
    assert_eq!(
        ids_and_states(&admin_saw)[0].0,
        runs[2],
        "the control: the change happened"
    );
    let (status, own) = json_of(rpc(
        &up,
        &vic,
        "JobService/CreateRun",
        json!({"name": "own", "project": "vics"}),
    ));
    assert_eq!(status, StatusCode::OK, "{own}");
    let own = own["id"].as_str().unwrap().to_string();
    let (_, heard) = theirs.next();
    assert_eq!(
        ids_and_states(&heard),
        [(own, "JOB_STATE_RUNNING".to_string())],
        "the first change vic hears is their own run"
    );
}

fn called(up: &Up, auth: &Auth, method: &str, body: Value) -> Value {
    let (status, answer) = json_of(rpc(up, auth, method, body));
    assert_eq!(status, StatusCode::OK, "{method}: {answer}");
    answer
}

fn batch(up: &Up, auth: &Auth, name: &str, project: &str) -> String {
    let spec = json!({"spec": {"name": name, "project": project, "command": ["kiln:noop"]}});
    called(up, auth, "BatchService/CreateBatch", spec)["id"]
        .as_str()
        .unwrap()
        .to_string()
}

fn sweep(up: &Up, auth: &Auth, name: &str, project: &str) -> String {
    let yaml = format!(
        "name: {name}\nobjective: {{metric: loss, goal: minimize}}\nalgorithm: {{name: random, seed: 1}}\n\
         budget: {{max-trials: 1, max-parallel: 1}}\nparameters:\n  x: {{type: float, min: 0.0, max: 1.0}}\n\
         trial: {{command: [sleep, '600'], cpu: 0.1, mem: 64M}}\n"
    );
    let created = called(
        up,
        auth,
        "SweepService/CreateSweep",
        json!({"specYaml": yaml, "project": project}),
    );
    created["id"].as_str().unwrap().to_string()
}

/// A service `name` in `project` of a model made by a run there, as the caller `env` names.
fn service(up: &Up, env: &[(&str, &str)], project: &str, name: &str) {
    let ok = |args: &[&str]| {
        let output = up.kiln_env(args, env);
        assert!(
            output.status.success(),
            "kiln {args:?}: {}",
            common::text(&output.stderr)
        );
        last_line(&output)
    };
    let job = ok(&[
        "run",
        "--no-code",
        "--project",
        project,
        "--cpu",
        "0.1",
        "--mem",
        "64M",
        "--",
        "sh",
        "-c",
        "mkdir -p $KILN_OUTPUTS/model && echo 3 > $KILN_OUTPUTS/model/factor.txt",
    ]);
    up.wait_for_state(&job, "SUCCEEDED");
    let from = format!("{job}:model/");
    ok(&["model", "register", name, "--from", &from]);
    ok(&[
        "serve",
        "create",
        name,
        "--project",
        project,
        "--model",
        name,
        "--cpu",
        "0.1",
        "--mem",
        "64M",
        "--input",
        "x:FP64:-1",
        "--output",
        "y:FP64:-1",
        "--",
        "sleep",
        "600",
    ]);
}

fn named(id: &str) -> impl Fn(&Value) -> bool + '_ {
    move |record| record["id"] == id
}

#[test]
fn lists_of_batches_sweeps_and_services_are_fed_as_they_change_and_to_their_tenants_only() {
    let up = Up::start();
    let admin = Auth::Bearer(up.admin_token());
    let every = json!({"list": {"all": true}});

    // Batches: the list, a change, a resume after the last event id.
    let first_batch = batch(&up, &admin, "fed", "default");
    let mut batches = Events::watch(&up, &admin, "BatchService/WatchBatches", every.clone(), None);
    let (_, listed) = batches.next();
    assert_eq!(listed["reset"], true, "{listed}");
    assert_eq!(listed["batches"][0]["id"], first_batch.as_str());
    called(&up, &admin, "BatchService/CancelBatch", json!({"batchId": first_batch}));
    let (seen, cancelled) = batches.until("batches", named(&first_batch));
    assert_eq!(cancelled["state"], "BATCH_STATE_CANCELLED", "{cancelled}");
    drop(batches);
    let second_batch = batch(&up, &admin, "fed-2", "default");
    let mut batches = Events::watch(&up, &admin, "BatchService/WatchBatches", every.clone(), seen.as_deref());
    let (_, resumed) = batches.next();
    assert_eq!(resumed["reset"], false, "no second list: {resumed}");
    assert_eq!(resumed["batches"][0]["id"], second_batch.as_str(), "{resumed}");

    // Sweeps: the list, then the sweep as it stops.
    let admins_sweep = sweep(&up, &admin, "fed", "default");
    let mut sweeps = Events::watch(&up, &admin, "SweepService/WatchSweeps", every.clone(), None);
    let (_, listed) = sweeps.next();
    assert_eq!(listed["sweeps"][0]["id"], admins_sweep.as_str(), "{listed}");
    called(&up, &admin, "SweepService/StopSweep", json!({"sweepId": admins_sweep}));
    sweeps.until("sweeps", |s| {
        s["id"] == admins_sweep.as_str() && s["state"] != "RUNNING"
    });

    // Services: the list, then the service as it is scaled.
    service(&up, &[], "default", "fed");
    let mut services = Events::watch(&up, &admin, "ServeService/WatchServices", every.clone(), None);
    let (_, listed) = services.next();
    assert_eq!(listed["services"][0]["name"], "fed", "{listed}");
    called(
        &up,
        &admin,
        "ServeService/ScaleService",
        json!({"name": "fed", "project": "default", "replicas": 2}),
    );
    services.until("services", |s| s["name"] == "fed" && s["definition"]["replicas"] == 2);

    // A member of another project: empty lists, and of each list only their own changes.
    let vic = Auth::Bearer(last_line(&up.kiln(&["user", "create", "vic"])));
    assert!(up.kiln(&["project", "create", "vics"]).status.success());
    let added = up.kiln(&["project", "add-member", "vics", "vic", "--role", "member"]);
    assert!(added.status.success());
    let mut theirs = [
        ("batches", "BatchService/WatchBatches"),
        ("sweeps", "SweepService/WatchSweeps"),
        ("services", "ServeService/WatchServices"),
    ]
    .map(|(field, method)| {
        let mut events = Events::watch(&up, &vic, method, every.clone(), None);
        let (_, empty) = events.next();
        assert_eq!(empty["reset"], true);
        assert_eq!(
            empty[field].as_array().map(Vec::len).unwrap_or(0),
            0,
            "{field}: {empty}"
        );
        events
    });
    // The admin's changes (each heard by the admin's own watch: the control) ...
    called(
        &up,
        &admin,
        "BatchService/CancelBatch",
        json!({"batchId": second_batch}),
    );
    batches.until("batches", |b| {
        b["id"] == second_batch.as_str() && b["state"] == "BATCH_STATE_CANCELLED"
    });
    let another_sweep = sweep(&up, &admin, "fed-2", "default");
    sweeps.until("sweeps", named(&another_sweep));
    called(
        &up,
        &admin,
        "ServeService/StopService",
        json!({"name": "fed", "project": "default"}),
    );
    services.until("services", |s| s["name"] == "fed" && s["state"] == "STOPPED");
    // ... are not vic's: the first batch, sweep and service vic hears of are their own.
    let own_batch = batch(&up, &vic, "own", "vics");
    let own_sweep = sweep(&up, &vic, "own", "vics");
    let Auth::Bearer(vics_token) = &vic else { unreachable!() };
    service(&up, &[("KILN_TOKEN", vics_token)], "vics", "own");
    let heard: Vec<Vec<String>> = theirs
        .iter_mut()
        .zip(["batches", "sweeps", "services"])
        .map(|(events, field)| {
            let (_, heard) = events.next();
            let records = heard[field].as_array().unwrap().iter();
            records
                .map(|r| r["id"].as_str().or(r["name"].as_str()).unwrap().to_string())
                .collect()
        })
        .collect();
    assert_eq!(
        heard,
        [vec![own_batch], vec![own_sweep.clone()], vec!["own".to_string()]]
    );
    called(&up, &vic, "SweepService/StopSweep", json!({"sweepId": own_sweep}));
    called(&up, &admin, "SweepService/StopSweep", json!({"sweepId": another_sweep}));
}
