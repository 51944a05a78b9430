//! Packing the working directory into a code bundle and uploading it once by digest.
//!
//! The bundle is a gzip-compressed tar of the files `.gitignore`, `.ignore` and `.kilnignore`
//! do not exclude (`.git` never goes in), in sorted order with fixed times, owners and modes, so
//! the same tree always gives the same sha256 and is stored once.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, stream};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_proto::v1 as pb;
use kiln_proto::v1::upload_artifact_request::Part;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::client::Clients;

/// Bytes per upload message.
const CHUNK: usize = 1 << 20;
/// Bundles above this size are refused: a job's code should not be a data set.
const MAX_BUNDLE_BYTES: u64 = 1 << 30;

/// A packed bundle: a temporary file (removed on drop), never held in memory.
pub struct Bundle {
    pub file: tempfile::NamedTempFile,
    pub size: u64,
    pub digest: String,
    pub files: usize,
}

/// A writer that hashes and counts what goes through it.
struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    size: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A byte progress bar on stderr when it is a terminal; hidden otherwise.
pub fn progress_bar(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let template = format!("{what} {{bar:30}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}}");
    bar.set_style(ProgressStyle::with_template(&template).expect("valid template"));
    bar
}

/// Packs `root` into a bundle, honouring the ignore files.
pub fn pack(root: &Path) -> Result<Bundle> {
    pack_with(root, true)
}

/// Packs `root` into a bundle; with `ignores`, what `.gitignore`, `.ignore` and `.kilnignore`
/// exclude stays out (a dataset takes everything, at gzip's fastest level: datasets are large
/// and often compressed already).
pub fn pack_with(root: &Path, ignores: bool) -> Result<Bundle> {
    let mut paths = Vec::new();
    let walker = ignore::WalkBuilder::new(root)
        .hidden(false)
        .ignore(ignores)
        .git_ignore(ignores)
        .git_global(false)
        .git_exclude(ignores)
        .require_git(false)
        .follow_links(false)
        .add_custom_ignore_filename(if ignores { ".kilnignore" } else { ".kiln-no-ignore-file" })
        .filter_entry(move |entry| !ignores || entry.file_name() != ".git")
        .build();
    for entry in walker {
        let entry = entry.context("cannot list the working directory")?;
        if entry.depth() == 0 {
            continue;
        }
        paths.push(entry.into_path());
    }
    paths.sort();
    let file = tempfile::NamedTempFile::new().context("cannot create a temporary file for the bundle")?;
    let hashing = Hashing {
        inner: std::io::BufWriter::with_capacity(CHUNK, file.reopen()?),
        hasher: Sha256::new(),
        size: 0,
    };
    let level = if ignores {
        flate2::Compression::default()
    } else {
        flate2::Compression::fast()
    };
    let encoder = flate2::GzBuilder::new().mtime(0).write(hashing, level);
    let mut builder = tar::Builder::new(encoder);
    builder.mode(tar::HeaderMode::Deterministic);
    builder.follow_symlinks(false);
    let mut files = 0;
    for path in &paths {
        let relative = path.strip_prefix(root).expect("walked paths are under the root");
        builder
            .append_path_with_name(path, relative)
            .with_context(|| format!("cannot pack {}", path.display()))?;
        files += 1;
        if ignores && builder.get_ref().get_ref().size > MAX_BUNDLE_BYTES {
            bail!("the working directory packs to more than {MAX_BUNDLE_BYTES} bytes; list data in .kilnignore");
        }
    }
    let mut hashing = builder.into_inner()?.finish()?;
    hashing.flush()?;
    let digest = hex::encode(hashing.hasher.finalize());
    Ok(Bundle {
        file,
        size: hashing.size,
        digest,
        files,
    })
}

/// Uploads the bundle to `project` (empty: `default`) unless that project has it. Returns true
/// when it was uploaded.
/// Packs `dir` (the working directory when none) as `kiln run` does and uploads it to
/// `project`; returns the bundle's digest, which a job or a service revision names.
pub async fn upload_code(clients: &mut Clients, dir: Option<PathBuf>, project: &str) -> Result<String> {
    let root = match dir {
        Some(dir) => dir,
        None => std::env::current_dir()?,
    };
    let bundle = tokio::task::spawn_blocking(move || pack(&root)).await??;
    let uploaded = upload(clients, &bundle, project, "uploading code").await?;
    tracing::debug!(digest = %bundle.digest, files = bundle.files, uploaded, "code bundle ready");
    Ok(bundle.digest)
}

pub async fn upload(clients: &mut Clients, bundle: &Bundle, project: &str, what: &str) -> Result<bool> {
    let stat = clients
        .artifacts
        .stat_artifact(pb::StatArtifactRequest {
            digest: bundle.digest.clone(),
            project: project.to_string(),
        })
        .await?
        .into_inner();
    if stat.exists {
        return Ok(false);
    }
    let size = bundle.size;
    let progress = progress_bar(size, what);
    let header = pb::UploadArtifactRequest {
        part: Some(Part::Header(pb::ArtifactHeader {
            digest: bundle.digest.clone(),
            size,
            project: project.to_string(),
        })),
    };
    // Streamed from the file, a chunk at a time; a read error ends the stream early (the server
    // then refuses the short upload) and is reported here.
    let file = tokio::fs::File::from_std(bundle.file.reopen().context("cannot reopen the bundle")?);
    let read_error: Arc<Mutex<Option<std::io::Error>>> = Arc::default();
    let seen = read_error.clone();
    let bar = progress.clone();
    let chunks = stream::unfold(Some(file), move |file| {
        let (seen, bar) = (seen.clone(), bar.clone());
        async move {
            let mut file = file?;
            let mut buffer = vec![0u8; CHUNK];
            match file.read(&mut buffer).await {
                Ok(0) => None,
                Ok(n) => {
                    buffer.truncate(n);
                    bar.inc(n as u64);
                    let message = pb::UploadArtifactRequest {
                        part: Some(Part::Chunk(buffer)),
                    };
                    Some((message, Some(file)))
                }
                Err(error) => {
                    *seen.lock().expect("read error lock") = Some(error);
                    None
                }
            }
        }
    });
    let messages = stream::once(async { header }).chain(chunks);
    let uploaded = clients.artifacts.upload_artifact(messages).await;
    if let Some(error) = read_error.lock().expect("read error lock").take() {
        return Err(error).context("cannot read the bundle");
    }
    let response = uploaded?.into_inner();
    progress.finish_and_clear();
    std::io::stderr().flush().ok();
    Ok(response.created)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::create_dir_all(root.join("data")).unwrap();
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join("src/train.py"), "print('hi')\n").unwrap();
        std::fs::write(root.join("data/big.bin"), vec![0u8; 1000]).unwrap();
        std::fs::write(root.join("notes.log"), "noise").unwrap();
        std::fs::write(root.join(".git/HEAD"), "ref").unwrap();
        std::fs::write(root.join(".gitignore"), "*.log\n").unwrap();
        std::fs::write(root.join(".kilnignore"), "data/\n").unwrap();
        dir
    }

    fn names(bundle: &Bundle) -> Vec<String> {
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bundle.file.reopen().unwrap()));
        archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect()
    }

    #[test]
    fn ignores_are_honoured() {
        let dir = tree();
        let bundle = pack(dir.path()).unwrap();
        let names = names(&bundle);
        assert!(names.contains(&"src/train.py".to_string()), "{names:?}");
        assert!(names.contains(&".gitignore".to_string()), "{names:?}");
        for excluded in ["notes.log", "data/big.bin", ".git/HEAD"] {
            assert!(!names.iter().any(|n| n == excluded), "{excluded} in {names:?}");
        }
    }

    #[test]
    fn same_tree_same_digest() {
        let first = pack(tree().path()).unwrap();
        let second = pack(tree().path()).unwrap();
        assert_eq!(first.digest, second.digest);
        let dir = tree();
        std::fs::write(dir.path().join("src/train.py"), "print('changed')\n").unwrap();
        assert_ne!(pack(dir.path()).unwrap().digest, first.digest);
    }
}
