//! Model versions on the runner's disk, for inference workers: a version's files (its manifest
//! in the registry, each file a content-addressed blob) are copied once per runner into
//! `<work-dir>/.models/<version digest>/` and handed to every worker serving that version,
//! read-only.
//!
//! A version is built in a `.part-` directory and renamed into place only when complete, so a
//! crash leaves nothing that looks staged; two workers staging one version at once both build,
//! and the second rename finds the first's and keeps it. Staged versions are not evicted yet.

use std::path::{Path, PathBuf};

use futures::StreamExt;
use kiln_core::objects::{artifact_path, relative_path};
use object_store::ObjectStoreExt;
use tokio::io::AsyncWriteExt;

use crate::Context;
use crate::error::{Error, Result};

/// The directory holding `model` (`name:version`) staged on this runner.
pub(crate) async fn stage(ctx: &Context, model: &str) -> Result<PathBuf> {
    let bad = |why: String| Error::Model(format!("{model}: {why}"));
    let (name, version) = model
        .rsplit_once(':')
        .and_then(|(name, version)| Some((name, version.parse::<i64>().ok()?)))
        .ok_or_else(|| bad("not a NAME:VERSION".into()))?;
    let record = ctx
        .store
        .model_version(name, version)
        .await?
        .ok_or_else(|| bad("no such version in the registry".into()))?;
    let root = ctx.config.work_dir.join(".models");
    let staged = root.join(&record.digest);
    if tokio::fs::try_exists(&staged).await.unwrap_or(false) {
        return Ok(absolute(&staged));
    }
    let part = root.join(format!(".part-{}-{}", record.digest, kiln_core::ids::new_id()));
    let files = ctx.store.model_files(name, version).await?;
    let built = async {
        tokio::fs::create_dir_all(&part)
            .await
            .map_err(Error::io(format!("cannot create {}", part.display())))?;
        for file in &files {
            let relative =
                relative_path(&file.path).ok_or_else(|| bad(format!("file path {:?} is not relative", file.path)))?;
            let dest = part.join(relative.as_ref());
            if let Some(dir) = dest.parent() {
                tokio::fs::create_dir_all(dir)
                    .await
                    .map_err(Error::io(format!("cannot create {}", dir.display())))?;
            }
            let mut out = tokio::fs::File::create(&dest)
                .await
                .map_err(Error::io(format!("cannot write {}", dest.display())))?;
            let mut chunks = ctx.objects.get(&artifact_path(&file.sha256)).await?.into_stream();
            while let Some(chunk) = chunks.next().await {
                out.write_all(&chunk?)
                    .await
                    .map_err(Error::io(format!("cannot write {}", dest.display())))?;
            }
            out.flush()
                .await
                .map_err(Error::io(format!("cannot write {}", dest.display())))?;
        }
        Ok::<(), Error>(())
    }
    .await;
    if let Err(error) = built {
        let _ = tokio::fs::remove_dir_all(&part).await;
        return Err(error);
    }
    if tokio::fs::rename(&part, &staged).await.is_err() {
        // Staged meanwhile by another worker of the same version.
        let _ = tokio::fs::remove_dir_all(&part).await;
    }
    tracing::info!(model, files = files.len(), dir = %staged.display(), "model version staged");
    Ok(absolute(&staged))
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}
