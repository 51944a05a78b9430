//! The change feed of a list of jobs (`JobService/WatchJobs`) as the web UI reads it, server-sent
//! events from a real `kiln up`: the list, then only what changed, resumed after the last event
//! id, and none of another tenant's changes.

use std::io::{BufRead, BufReader};

use reqwest::StatusCode;
use serde_json::{Value, json};

mod common;

use common::http::{Auth, client, json_of, rpc};
use common::{Up, last_line};

/// An open event stream, read an event at a time.
struct Events(BufReader<reqwest::blocking::Response>);

impl Events {
    fn open(up: &Up, auth: &Auth, last_event_id: Option<&str>) -> Events {
        let request = json!({"list": {"all": true, "everyone": true, "limit": 10000}}).to_string();
        let mut call = auth.apply(
            client()
                .get(format!("{}/api/v1/stream/JobService/WatchJobs", up.ui_url()))
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
