//! What an attempt's instance is given: the checked code, the datasets (from the runner's
//! cache), the outputs earlier
//! attempts synced (for a resumed attempt), kiln-agent for batch workers, and the environment
//! with the job's token and its secrets (opened here, never logged: the returned [`Masker`]
//! hides their values in the lines shipped).

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::StreamExt;
use kiln_core::auth::Scope;
use kiln_core::objects::artifact_path;
use kiln_core::secrets::{self, Masker, SecretsError};
use kiln_core::store::JobRecord;
use object_store::ObjectStoreExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::end::market_of;
use super::remove_file;
use crate::Context;
use crate::bundle::{LIMITS, MAX_UNPACKED_BYTES};
use crate::datasets::DatasetLease;
use crate::error::{Error, Result};
use crate::provider::{DATA_DIR, InstanceSpec, OUTPUTS_DIR, PullAuth};
use kiln_core::serving::{ENV_MODEL, ENV_MODEL_DIR, ENV_PORT};

/// The dataset name an inference worker's model files are mounted under (a name no dataset
/// can have: dataset names start with a letter).
pub(crate) const MODEL_DATASET: &str = "_model";

/// A port on 127.0.0.1 free a moment ago, for an inference worker to listen on.
fn free_port() -> Result<u16> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(Error::io("cannot find a free port for the inference worker"))
}

/// The restored outputs of a resumed attempt, in its scratch dir until the instance is provisioned.
const RESTORE_ARCHIVE: &str = "restore.tar.gz";

/// Streams the archive with this sha256 from object storage into `dest` (never whole in
/// memory), checking its digest on the way, then checks the file before any engine unpacks it.
async fn fetch_archive(ctx: &Context, digest: &str, dest: PathBuf, what: &str) -> Result<PathBuf> {
    let mut chunks = ctx.objects.get(&artifact_path(digest)).await?.into_stream();
    if let Some(dir) = dest.parent() {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(Error::io(format!("cannot create {}", dir.display())))?;
    }
    let cannot_write = || Error::io(format!("cannot write {}", dest.display()));
    let mut file = tokio::fs::File::create(&dest).await.map_err(cannot_write())?;
    let mut hasher = Sha256::new();
    let mut size: u64 = 0;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        size += chunk.len() as u64;
        if size > MAX_UNPACKED_BYTES {
            return Err(Error::BadBundle(format!(
                "{what}: larger than {MAX_UNPACKED_BYTES} bytes"
            )));
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(cannot_write())?;
    }
    file.flush().await.map_err(cannot_write())?;
    drop(file);
    let actual = hex::encode(hasher.finalize());
    if actual != digest {
        return Err(Error::BadBundle(format!(
            "{what}: the stored archive has sha256 {actual}, not {digest}"
        )));
    }
    let checked = dest.clone();
    let what = what.to_string();
    tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&checked).map_err(Error::io(format!("cannot read {}", checked.display())))?;
        crate::bundle::check(std::io::BufReader::new(file), LIMITS)
    })
    .await
    .map_err(|e| Error::BadBundle(e.to_string()))?
    .map_err(|error| match error {
        Error::BadBundle(why) => Error::BadBundle(format!("{what}: {why}")),
        other => other,
    })?;
    Ok(dest)
}

/// Everything the instance needs: code, datasets, environment (with the job's token and
/// secrets), and the masker of the secrets' values. The datasets' cache entries are held in
/// `leases` until the instance is released.
pub(super) async fn instance_spec(
    ctx: &Context,
    job: &JobRecord,
    rank: i32,
    gpu_devices: &[u32],
    scratch_dir: &Path,
    leases: &mut Vec<DatasetLease>,
) -> Result<(InstanceSpec, Masker)> {
    let code = if job.code_digest.is_empty() {
        None
    } else {
        let dest = scratch_dir.join("code.tar.gz");
        Some(fetch_archive(ctx, &job.code_digest, dest, "code bundle").await?)
    };
    let mut datasets = Vec::new();
    for reference in job.datasets()? {
        // Checked against the submitter's roles when the job was submitted.
        let dataset = ctx
            .store
            .dataset_named(&job.project, &reference)
            .await?
            .ok_or_else(|| Error::Dataset(format!("{reference} does not exist")))?;
        let name = dataset.name;
        let lease = ctx
            .datasets
            .acquire(&dataset.digest)
            .await
            .map_err(|error| match error {
                Error::Dataset(message) => Error::Dataset(format!("{name}: {message}")),
                other => other,
            })?;
        datasets.push((name.clone(), lease.path().to_path_buf()));
        leases.push(lease);
    }
    let restore = if job.resume_from.is_empty() {
        None
    } else {
        restore_archive(ctx, job, scratch_dir).await?
    };
    let token = ctx
        .store
        .create_token(&job.owner_id, &format!("job {}", job.id), Scope::Job(job.id.clone()))
        .await?;
    let mut env = job.env()?;
    if let Some(model) = env.get(ENV_MODEL).cloned() {
        // An inference worker: its model version's files, and the port its relay calls.
        let staged = crate::models::stage(ctx, &job.project, &model).await?;
        let dir = if job.image.is_empty() {
            staged.display().to_string()
        } else {
            format!("{DATA_DIR}/{MODEL_DATASET}")
        };
        datasets.push((MODEL_DATASET.to_string(), staged));
        env.insert(ENV_MODEL_DIR.into(), dir);
        env.insert(ENV_PORT.into(), free_port()?.to_string());
    }
    let mut masked = open_secrets(ctx, job, &mut env).await?;
    let pull = registry_credentials(ctx, job).await?;
    if let Some(pull) = &pull {
        masked.push(pull.credentials.password.clone());
    }
    let masker = Masker::new(masked.iter().map(String::as_str));
    env.insert("KILN_JOB_ID".into(), job.id.clone());
    if !job.resume_from.is_empty() {
        // Where the instance finds the restored outputs; providers whose outputs directory is
        // elsewhere (`process`) point it at theirs.
        env.insert("KILN_RESUME_FROM".into(), OUTPUTS_DIR.into());
    }
    env.insert("KILN_ATTEMPT".into(), job.attempt.to_string());
    if job.nodes > 1 {
        gang_env(job, rank, &mut env)?;
    }
    env.insert("KILN_API".into(), ctx.config.api_url.clone());
    env.insert("KILN_LOGS".into(), ctx.config.logs_url.clone());
    env.insert("KILN_TOKEN".into(), token.token);
    for (name, pem) in ctx.config.job_tls.job_env()? {
        env.insert(name.into(), pem);
    }
    let spec = InstanceSpec {
        job_id: job.id.clone(),
        attempt: job.attempt,
        runner_id: ctx.config.runner_id.clone(),
        owner_id: job.owner_id.clone(),
        project: job.project.clone(),
        image: job.image.clone(),
        pull,
        command: job.command()?,
        env,
        cpu_millis: job.cpu_millis,
        memory_bytes: job.memory_bytes,
        gpus: u32::try_from(job.gpus).unwrap_or(0),
        disk_bytes: job.disk_bytes,
        shm_bytes: job.shm_bytes,
        market: market_of(ctx, job),
        gpu_devices: gpu_devices.to_vec(),
        code,
        datasets,
        agent: if job.batch_id.is_empty() || job.image.is_empty() {
            None
        } else {
            Some(agent_archive(ctx).await?)
        },
        scratch_dir: PathBuf::from(scratch_dir),
        restore,
    };
    Ok((spec, masker))
}

/// The rendezvous of a gang's node `rank`: kiln's names and the ones `torchrun` reads (a world
/// of one process per GPU, at least one per node).
fn gang_env(job: &JobRecord, rank: i32, env: &mut std::collections::BTreeMap<String, String>) -> Result<()> {
    let (host, port) = job
        .gang_master
        .rsplit_once(':')
        .ok_or_else(|| Error::Gang(format!("the gang has no rendezvous address ({:?})", job.gang_master)))?;
    let local = job.gpus.max(1);
    for (name, value) in [
        ("KILN_NODE_RANK", rank.to_string()),
        ("KILN_NUM_NODES", job.nodes.to_string()),
        ("KILN_MASTER_ADDR", host.to_string()),
        ("KILN_MASTER_PORT", port.to_string()),
        ("NODE_RANK", rank.to_string()),
        ("MASTER_ADDR", host.to_string()),
        ("MASTER_PORT", port.to_string()),
        ("WORLD_SIZE", (job.nodes * local).to_string()),
        ("LOCAL_WORLD_SIZE", local.to_string()),
    ] {
        env.insert(name.into(), value);
    }
    Ok(())
}

/// Opens the secrets the job names into `env` and names them in [`secrets::NAMES_VAR`] (for
/// kiln-agent's masking); returns their values, to be masked.
async fn open_secrets(
    ctx: &Context,
    job: &JobRecord,
    env: &mut std::collections::BTreeMap<String, String>,
) -> Result<Vec<String>> {
    let names = job.secrets()?;
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let key = secrets_key(ctx)?;
    let mut values = Vec::with_capacity(names.len());
    for name in &names {
        let missing = || Error::SecretMissing {
            project: job.project.clone(),
            name: name.clone(),
        };
        let record = ctx.store.secret(&job.project, name).await?.ok_or_else(missing)?;
        let opened = key.open(&job.project, name, &record.sealed)?;
        let value = String::from_utf8(opened).map_err(|_| SecretsError::Open {
            project: job.project.clone(),
            name: name.clone(),
        })?;
        values.push(value.clone());
        env.insert(name.clone(), value);
    }
    env.insert(secrets::NAMES_VAR.into(), names.join(","));
    Ok(values)
}

fn secrets_key(ctx: &Context) -> Result<&secrets::SecretsKey> {
    Ok(ctx
        .secrets_key
        .as_deref()
        .ok_or(SecretsError::NoKey { service: "this runner" })?)
}

/// The job's project's credentials for the registry its image comes from (`kiln secret set
/// --registry`), when it has some, else the instance role's ECR token when `[ecr]` names the
/// registry. They never reach the job: only the engine's pull sees them.
async fn registry_credentials(ctx: &Context, job: &JobRecord) -> Result<Option<PullAuth>> {
    if job.image.is_empty() {
        return Ok(None);
    }
    let registry = secrets::image_registry(&job.image);
    let Ok(name) = secrets::registry_secret_name(&registry) else {
        return Ok(None);
    };
    let Some(record) = ctx.store.secret(&job.project, &name).await? else {
        return match &ctx.ecr {
            Some(ecr) if ecr.covers(&registry) => {
                let credentials = ecr.credentials(&registry).await?;
                Ok(Some(PullAuth { registry, credentials }))
            }
            _ => Ok(None),
        };
    };
    let opened = secrets_key(ctx)?.open(&job.project, &name, &record.sealed)?;
    let credentials = serde_json::from_slice(&opened).map_err(|_| SecretsError::Open {
        project: job.project.clone(),
        name: name.clone(),
    })?;
    Ok(Some(PullAuth { registry, credentials }))
}

/// Packs the outputs the earlier attempts synced (under `job.resume_from`) into a tar.gz in the
/// scratch dir; `None` when there is nothing to restore. The archive needs no second check:
/// `pack_synced` writes only regular files under paths `relative_path` accepted, within the
/// limit (and the process provider's unpack refuses escapes anyway).
async fn restore_archive(ctx: &Context, job: &JobRecord, scratch_dir: &Path) -> Result<Option<PathBuf>> {
    let prefix = object_store::path::Path::parse(&job.resume_from)
        .map_err(|e| Error::Restore(format!("bad prefix {:?}: {e}", job.resume_from)))?;
    let archive = scratch_dir.join(RESTORE_ARCHIVE);
    let owner = ctx.config.docker.owner();
    let packed =
        crate::outputs::pack_synced(ctx.objects.clone(), prefix, archive.clone(), MAX_UNPACKED_BYTES, owner).await?;
    if packed.files == 0 {
        // The previous attempts synced nothing (or only paths that were skipped).
        remove_file(&archive).await;
        return Ok(None);
    }
    tracing::info!(job_id = %job.id, files = packed.files, bytes = packed.bytes, "outputs to restore packed");
    Ok(Some(archive))
}

/// A tar holding the static kiln-agent at `kiln/bin/kiln-agent`, for batch workers' containers:
/// read and packed once per runner.
async fn agent_archive(ctx: &Context) -> Result<Bytes> {
    ctx.agent_archive
        .get_or_try_init(|| pack_agent(ctx.config.agent_binary.clone()))
        .await
        .cloned()
}

async fn pack_agent(path: PathBuf) -> Result<Bytes> {
    if path.as_os_str().is_empty() {
        return Err(Error::BadBundle(
            "this runner has no agent-binary: it cannot start batch workers in containers".into(),
        ));
    }
    tokio::task::spawn_blocking(move || {
        let binary = std::fs::read(&path)
            .map_err(|e| Error::BadBundle(format!("cannot read the agent binary {}: {e}", path.display())))?;
        let mut archive = tar::Builder::new(Vec::new());
        for dir in ["kiln/", "kiln/bin/"] {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
            header.set_size(0);
            header.set_cksum();
            archive
                .append_data(&mut header, dir, std::io::empty())
                .map_err(|e| Error::BadBundle(e.to_string()))?;
        }
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o755);
        header.set_size(binary.len() as u64);
        header.set_cksum();
        archive
            .append_data(&mut header, "kiln/bin/kiln-agent", binary.as_slice())
            .map_err(|e| Error::BadBundle(e.to_string()))?;
        let bytes = archive.into_inner().map_err(|e| Error::BadBundle(e.to_string()))?;
        Ok(Bytes::from(bytes))
    })
    .await
    .map_err(|e| Error::BadBundle(format!("packing the agent failed: {e}")))?
}
