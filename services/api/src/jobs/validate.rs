//! Checking a submitted spec: what a job may ask for, with a message that says what is wrong.

use std::collections::BTreeMap;

use kiln_core::auth::Principal;
use kiln_core::capacity::{DiskShmProblem, MAX_GPUS, MIN_JOB_DISK_BYTES, check_disk_and_shm};
use kiln_core::scheduling::{MarketPolicy, PRIORITY_CLASSES, priority_class};
use kiln_core::store::NewJob;
use kiln_core::subjects;
use kiln_proto::v1 as pb;

use crate::error::{Error, Result};

/// Longest command line accepted, summed over its arguments.
const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// Longest name of a job.
const MAX_NAME_CHARS: usize = 128;
/// Default CPU and memory of a job that names none.
const DEFAULT_CPU_MILLIS: u32 = 1000;
const DEFAULT_MEMORY_BYTES: u64 = 1 << 30;

/// Checks a submitted spec and turns it into a record, or says what is wrong.
pub(super) fn validate_spec(principal: &Principal, spec: Option<pb::JobSpec>) -> Result<NewJob> {
    let spec = spec.ok_or_else(|| Error::InvalidArgument("spec is required".into()))?;
    if spec.command.is_empty() || spec.command[0].trim().is_empty() {
        return Err(Error::InvalidArgument(
            "command is empty: give the program to run, e.g. `kiln run -- python train.py`".into(),
        ));
    }
    let command_bytes: usize = spec.command.iter().map(String::len).sum();
    if command_bytes > MAX_COMMAND_BYTES {
        return Err(Error::InvalidArgument(format!(
            "command is {command_bytes} bytes; the limit is {MAX_COMMAND_BYTES}"
        )));
    }
    if spec.command.iter().any(|arg| arg.contains('\0')) {
        return Err(Error::InvalidArgument(
            "command arguments must not contain NUL bytes".into(),
        ));
    }
    let resources = spec.resources.unwrap_or(pb::Resources {
        cpu_millis: DEFAULT_CPU_MILLIS,
        memory_bytes: DEFAULT_MEMORY_BYTES,
        ..Default::default()
    });
    if resources.cpu_millis == 0 {
        return Err(Error::InvalidArgument(
            "resources.cpu_millis must be greater than 0 (1000 is one core)".into(),
        ));
    }
    if resources.memory_bytes == 0 {
        return Err(Error::InvalidArgument(
            "resources.memory_bytes must be greater than 0".into(),
        ));
    }
    let memory_bytes = i64::try_from(resources.memory_bytes)
        .map_err(|_| Error::InvalidArgument("resources.memory_bytes is too large".into()))?;
    let (disk_bytes, shm_bytes) = disk_and_shm(&resources, &spec.image)?;
    let mut env = BTreeMap::new();
    for (key, value) in spec.env {
        let valid = !key.is_empty() && !key.contains('=') && !key.contains('\0');
        if !valid {
            return Err(Error::InvalidArgument(format!(
                "env name {key:?} is not valid (no '=', no NUL, not empty)"
            )));
        }
        if value.contains('\0') {
            return Err(Error::InvalidArgument(format!(
                "env {key:?} has a NUL byte in its value, which no process can be given"
            )));
        }
        if key.starts_with("KILN_") {
            return Err(Error::InvalidArgument(format!(
                "env name {key:?} is reserved: KILN_* variables are set by kiln"
            )));
        }
        env.insert(key, value);
    }
    if spec.name.chars().count() > MAX_NAME_CHARS {
        return Err(Error::InvalidArgument(format!(
            "name is longer than {MAX_NAME_CHARS} characters"
        )));
    }
    let name = if spec.name.is_empty() {
        // The program's file name, within the limit a given name has.
        spec.command[0]
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .chars()
            .take(MAX_NAME_CHARS)
            .collect()
    } else {
        spec.name
    };
    let project = if spec.project.is_empty() {
        kiln_core::authz::DEFAULT_PROJECT.to_string()
    } else {
        spec.project
    };
    subjects::validate_token("project", &project).map_err(Error::InvalidArgument)?;
    if !spec.code_digest.is_empty() && !kiln_core::objects::is_sha256_hex(&spec.code_digest) {
        return Err(Error::InvalidArgument(format!(
            "code_digest {:?} is not a lowercase hex sha256",
            spec.code_digest
        )));
    }
    if !spec.image.is_empty() && !kiln_formats::image::valid_reference(&spec.image) {
        return Err(Error::InvalidArgument(format!(
            "image {:?} is not a valid image reference",
            spec.image
        )));
    }
    if spec.gpus > MAX_GPUS {
        return Err(Error::InvalidArgument(format!(
            "gpus is {}; at most {MAX_GPUS}",
            spec.gpus
        )));
    }
    if spec.nodes > MAX_NODES {
        return Err(Error::InvalidArgument(format!(
            "nodes is {}; a gang job has at most {MAX_NODES}",
            spec.nodes
        )));
    }
    let max_runtime_secs = i64::try_from(spec.max_runtime_secs)
        .map_err(|_| Error::InvalidArgument("max_runtime_secs is too large".into()))?;
    for reference in &spec.datasets {
        validate_dataset_reference(reference)?;
    }
    let class = priority_class(&spec.priority_class).ok_or_else(|| {
        let names: Vec<&str> = PRIORITY_CLASSES.iter().map(|class| class.name).collect();
        Error::InvalidArgument(format!(
            "priority class {:?} is not one of {}",
            spec.priority_class,
            names.join(", ")
        ))
    })?;
    let market = pb::Market::try_from(spec.market)
        .map_err(|_| Error::InvalidArgument(format!("market {} is not a market", spec.market)))?;
    if !spec.pool.is_empty() {
        subjects::validate_token("pool", &spec.pool).map_err(Error::InvalidArgument)?;
    }
    let secrets = kiln_core::secrets::validate_names(&spec.secrets, env.keys()).map_err(Error::InvalidArgument)?;
    Ok(NewJob {
        owner_id: principal.user_id.clone(),
        project,
        secrets,
        name,
        command: spec.command,
        env,
        cpu_millis: i64::from(resources.cpu_millis),
        memory_bytes,
        disk_bytes,
        shm_bytes,
        nodes: i32::try_from(spec.nodes.max(1)).unwrap_or(1),
        code_digest: spec.code_digest,
        image: spec.image,
        gpus: i32::try_from(spec.gpus).unwrap_or(0),
        max_runtime_secs,
        datasets: spec.datasets,
        batch_id: String::new(),
        priority_class: class.name.to_string(),
        market_policy: MarketPolicy::from_proto(market),
        submit_key: String::new(),
        requested_pool: spec.pool,
        config: Default::default(),
        sweep_id: String::new(),
        service_id: String::new(),
    })
}

/// Longest idempotency key of a submit.
const MAX_SUBMIT_KEY_BYTES: usize = 128;

/// Checks a submit's idempotency key: empty (none), or up to 128 printable ASCII characters.
pub(super) fn validate_submit_key(key: String) -> Result<String> {
    if key.len() > MAX_SUBMIT_KEY_BYTES || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::InvalidArgument(format!(
            "idempotency_key must be at most {MAX_SUBMIT_KEY_BYTES} printable ASCII characters without spaces (a UUID is a good key)"
        )));
    }
    Ok(key)
}

/// Checks a dataset name: it becomes a directory name under /kiln/data.
/// Checks a dataset a spec names: `NAME`, or `PROJECT/NAME` for another project's.
pub(crate) fn validate_dataset_reference(reference: &str) -> Result<()> {
    match reference.split_once('/') {
        Some((project, name)) => {
            subjects::validate_token("project", project)
                .map_err(|why| Error::InvalidArgument(format!("dataset {reference:?}: {why}")))?;
            validate_dataset_name(name)
        }
        None => validate_dataset_name(reference),
    }
}

pub(crate) fn validate_dataset_name(name: &str) -> Result<()> {
    subjects::validate_token("dataset", name).map_err(Error::InvalidArgument)?;
    if name.starts_with(['-', '_']) {
        return Err(Error::InvalidArgument(format!(
            "dataset {name:?} must start with a letter or digit"
        )));
    }
    Ok(())
}

/// The most nodes of a gang job.
pub const MAX_NODES: u32 = 64;

/// Checks `resources.disk_bytes` and `resources.shm_bytes`: a disk of at least
/// [`MIN_JOB_DISK_BYTES`] for a job in a container (the docker provider makes it), shared memory at
/// most the memory it counts against.
pub fn disk_and_shm(resources: &pb::Resources, image: &str) -> Result<(i64, i64)> {
    let disk = resources.disk_bytes;
    check_disk_and_shm(disk, resources.shm_bytes, resources.memory_bytes, image).map_err(|problem| {
        Error::InvalidArgument(match problem {
            DiskShmProblem::DiskTooSmall => format!(
                "resources.disk_bytes is {disk}; a disk is at least {MIN_JOB_DISK_BYTES} bytes (16 MiB)"
            ),
            DiskShmProblem::DiskWithoutImage => "--disk needs an image: runners give a job its own disk in a container (the docker provider); give --image too".into(),
            DiskShmProblem::ShmOverMemory => format!(
                "resources.shm_bytes ({}) is more than the memory ({}): /dev/shm counts against the job's memory; ask for more --mem",
                resources.shm_bytes, resources.memory_bytes
            ),
        })
    })?;
    let disk = i64::try_from(disk).map_err(|_| Error::InvalidArgument("resources.disk_bytes is too large".into()))?;
    Ok((disk, i64::try_from(resources.shm_bytes).unwrap_or(i64::MAX)))
}

#[cfg(test)]
mod properties;

#[cfg(test)]
mod tests {
    use kiln_core::auth::Scope;

    use super::*;

    fn principal() -> Principal {
        Principal {
            user_id: "u1".into(),
            user_name: "ada".into(),
            is_admin: false,
            scope: Scope::User,
            token_id: "t1".into(),
            token_name: "cli".into(),
            roles: Default::default(),
            job_batch_id: None,
        }
    }

    fn spec(command: &[&str]) -> pb::JobSpec {
        pb::JobSpec {
            command: command.iter().map(|s| s.to_string()).collect(),
            resources: Some(pb::Resources {
                cpu_millis: 500,
                memory_bytes: 1 << 20,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn message(result: Result<NewJob>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn valid_specs_get_defaults() {
        let job = validate_spec(&principal(), Some(spec(&["/usr/bin/python3", "train.py"]))).unwrap();
        assert_eq!(job.name, "python3");
        assert_eq!(job.project, "default");
        assert_eq!(job.cpu_millis, 500);
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        assert!(message(validate_spec(&principal(), None)).contains("spec is required"));
        assert!(message(validate_spec(&principal(), Some(spec(&[])))).contains("command is empty"));
        let mut zero_cpu = spec(&["true"]);
        zero_cpu.resources = Some(pb::Resources {
            cpu_millis: 0,
            memory_bytes: 1,
            ..Default::default()
        });
        assert!(message(validate_spec(&principal(), Some(zero_cpu))).contains("cpu_millis"));
        let mut reserved = spec(&["true"]);
        reserved.env.insert("KILN_JOB_ID".into(), "x".into());
        assert!(message(validate_spec(&principal(), Some(reserved))).contains("reserved"));
        let mut digest = spec(&["true"]);
        digest.code_digest = "abc".into();
        assert!(message(validate_spec(&principal(), Some(digest))).contains("sha256"));
    }
}
