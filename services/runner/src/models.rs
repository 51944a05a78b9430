//! Model versions on the runner's disk, for inference workers: a version's files (its manifest
//! in the registry, each file a content-addressed blob) are copied once per runner into
//! `<work-dir>/.models/<version digest>/` (under the work root's part of the runner when
//! process jobs are isolated: see `provider::process::isolation`) and handed to every worker serving that version,
//! read-only.
//!
//! A version is built in a `.part-` directory and renamed into place only when complete, so a
//! crash leaves nothing that looks staged; two workers staging one version at once both build,
//! and the second rename finds the first's and keeps it. Staged versions are not evicted yet.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use futures::StreamExt;
use kiln_core::authz::ObjectRef;
use kiln_core::objects::{artifact_path, relative_path};
use kiln_core::store::ModelKey;
use object_store::ObjectStoreExt;
use tokio::io::AsyncWriteExt;

use crate::Context;
use crate::error::{Error, Result};

/// The directory holding `model` staged on this runner: `NAME:VERSION` of the worker's
/// project `home`, or `PROJECT/NAME:VERSION` of another (the controller checked, when the
/// revision was made, that the service's owner may read it).
pub(crate) async fn stage(ctx: &Context, home: &str, model: &str) -> Result<PathBuf> {
    let bad = |why: String| Error::Model(format!("{model}: {why}"));
    let (named, version) = model
        .rsplit_once(':')
        .and_then(|(name, version)| Some((ObjectRef::parse(name)?, version.parse::<i64>().ok()?)))
        .ok_or_else(|| bad("not a NAME:VERSION or PROJECT/NAME:VERSION".into()))?;
    let key = ModelKey::new(named.project_in(home).unwrap_or(home), &named.name);
    let record = ctx
        .store
        .model_version(&key, version)
        .await?
        .ok_or_else(|| bad("no such version in the registry".into()))?;
    let root = ctx.models_dir.clone();
    let staged = root.join(&record.digest);
    if tokio::fs::try_exists(&staged).await.unwrap_or(false) {
        return Ok(absolute(&staged));
    }
    let part = root.join(format!(".part-{}-{}", record.digest, kiln_core::ids::new_id()));
    let files = ctx.store.model_files(&key, version).await?;
    let built = async {
        tokio::fs::create_dir_all(&part)
            .await
            .map_err(Error::io(format!("cannot create {}", part.display())))?;
        // Traversable, not listable: a worker reaches its version, not the digests of others.
        tokio::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o711))
            .await
            .map_err(Error::io(format!("cannot set the mode of {}", root.display())))?;
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
        // Readable by the workers, whatever uid they run as; written by no one.
        let sealed = part.clone();
        tokio::task::spawn_blocking(move || crate::datasets::fetch::seal(&sealed))
            .await
            .map_err(|e| bad(format!("sealing failed: {e}")))?
            .map_err(Error::io(format!("cannot seal {}", part.display())))?;
        Ok::<(), Error>(())
    }
    .await;
    let remove_part = || {
        let part = part.clone();
        tokio::task::spawn_blocking(move || crate::datasets::fetch::remove_tree(&part))
    };
    if let Err(error) = built {
        let _ = remove_part().await;
        return Err(error);
    }
    if tokio::fs::rename(&part, &staged).await.is_err() {
        // Staged meanwhile by another worker of the same version.
        let _ = remove_part().await;
    }
    tracing::info!(model, files = files.len(), dir = %staged.display(), "model version staged");
    Ok(absolute(&staged))
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}
