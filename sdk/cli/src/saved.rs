//! `kiln artifacts saved` / `kiln artifacts get-saved`: the artifacts a run saved with
//! `kiln.save` (files and directories, each file a content-addressed blob).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use kiln_proto::v1 as pb;
use tokio::io::AsyncWriteExt;

use crate::client::{self, Clients};
use crate::format::{self, Output, bytes, out};

pub async fn list(job: String, name: Option<String>, output: Output) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    let files = saved_files(&mut clients, &job, name.as_deref().unwrap_or_default()).await?;
    if output == Output::Json {
        format::print_json(&files_json(&files))?;
        return Ok(ExitCode::SUCCESS);
    }
    for file in files {
        let path = if file.path.is_empty() {
            file.name
        } else {
            format!("{}/{}", file.name, file.path)
        };
        out!(
            "{:>10}  {}  {path}",
            bytes(file.size),
            &file.digest[..12.min(file.digest.len())]
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn saved_files(clients: &mut Clients, job: &str, name: &str) -> Result<Vec<pb::RunArtifactFile>> {
    let request = pb::ListRunArtifactsRequest {
        job_id: job.to_string(),
        name: name.to_string(),
    };
    Ok(clients.artifacts.list_run_artifacts(request).await?.into_inner().files)
}

pub fn files_json(files: &[pb::RunArtifactFile]) -> Vec<serde_json::Value> {
    files
        .iter()
        .map(|f| serde_json::json!({"name": f.name, "path": f.path, "digest": f.digest, "size": f.size}))
        .collect()
}

/// Writes artifact `name` under `dest`: a file as DEST/NAME, a directory's files as
/// DEST/NAME/PATH.
pub async fn get(job: String, name: String, dest: PathBuf) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    let files = saved_files(&mut clients, &job, &name).await?;
    if files.is_empty() {
        bail!("job {job} saved no artifact {name}; `kiln artifacts saved {job}` lists what it saved");
    }
    let root = crate::data::safe_join(&dest, &name)?;
    let mut total = 0;
    for file in &files {
        let target = if file.path.is_empty() {
            root.clone()
        } else {
            crate::data::safe_join(&root, &file.path)?
        };
        if let Some(parent) = target.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        let mut out = tokio::fs::File::create(&target)
            .await
            .with_context(|| format!("cannot write {}", target.display()))?;
        let request = pb::GetRunArtifactRequest {
            job_id: job.clone(),
            name: name.clone(),
            path: file.path.clone(),
        };
        let mut chunks = clients.artifacts.get_run_artifact(request).await?.into_inner();
        while let Some(chunk) = chunks.next().await {
            out.write_all(&chunk?.data).await?;
        }
        out.flush().await?;
        total += file.size;
    }
    eprintln!("{} files, {} written to {}", files.len(), bytes(total), root.display());
    Ok(ExitCode::SUCCESS)
}
