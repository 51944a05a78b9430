//! `kiln model get NAME[@ALIAS|:V] --dest DIR`: downloads each file of a version, checks its
//! sha256 and size against the manifest, and the manifest against the version's digest, so
//! what lands in DIR is exactly what was registered.

use std::path::Path;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use kiln_proto::v1 as pb;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::VersionArg;
use crate::client::Clients;
use crate::format::bytes;
use crate::pack;

pub async fn get(clients: &mut Clients, version: VersionArg, project: &str, dest: &Path) -> Result<()> {
    let request = pb::GetModelVersionRequest {
        name: version.name,
        version: version.version,
        alias: version.alias,
        project: project.to_string(),
    };
    let version = clients.models.get_model_version(request).await?.into_inner();
    check_manifest(&version)?;
    let total: u64 = version.files.iter().map(|f| f.size).sum();
    let progress = pack::progress_bar(total, "downloading");
    for file in &version.files {
        let target = crate::data::safe_join(dest, &file.path)?;
        if let Some(parent) = target.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        // Into a temporary name first: a file that fails its check never appears complete.
        let partial = target.with_extension("kiln-partial");
        let mut out = tokio::fs::File::create(&partial)
            .await
            .with_context(|| format!("cannot write {}", partial.display()))?;
        // The version found, in its project, whatever the name it was asked by.
        let request = pb::GetModelFileRequest {
            name: version.model.clone(),
            project: version.project.clone(),
            version: version.version,
            path: file.path.clone(),
        };
        let mut chunks = clients.models.get_model_file(request).await?.into_inner();
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk?;
            hasher.update(&chunk.data);
            size += chunk.data.len() as u64;
            out.write_all(&chunk.data).await?;
            progress.inc(chunk.data.len() as u64);
        }
        out.flush().await?;
        let sha256 = hex::encode(hasher.finalize());
        if sha256 != file.sha256 || size != file.size {
            let _ = tokio::fs::remove_file(&partial).await;
            bail!(
                "{} arrived as {size} bytes with sha256 {sha256}, not the registered {} bytes with {}",
                file.path,
                file.size,
                file.sha256
            );
        }
        tokio::fs::rename(&partial, &target).await?;
    }
    progress.finish_and_clear();
    eprintln!(
        "{}:{} ({} files, {}) written to {}, every sha256 checked",
        version.model,
        version.version,
        version.files.len(),
        bytes(total),
        dest.display()
    );
    Ok(())
}

/// Checks that the manifest the server sent is the one the version's digest names.
fn check_manifest(version: &pb::ModelVersion) -> Result<()> {
    let entries: Vec<kiln_core::models::ManifestEntry> = version
        .files
        .iter()
        .map(|f| kiln_core::models::ManifestEntry {
            path: f.path.clone(),
            sha256: f.sha256.clone(),
            size: f.size,
        })
        .collect();
    let digest = kiln_core::models::manifest_digest(&entries);
    if digest != version.digest {
        bail!(
            "the manifest of {}:{} digests to {digest}, not its recorded {}",
            version.model,
            version.version,
            version.digest
        );
    }
    Ok(())
}
