//! Packing the working directory into a code bundle and uploading it once by digest.
//!
//! The bundle is a gzip-compressed tar of the files `.gitignore`, `.ignore` and `.kilnignore`
//! do not exclude (`.git` never goes in), in sorted order with fixed times, owners and modes, so
//! the same tree always gives the same sha256 and is stored once. It is written to a temp file
//! and hashed on the way, then uploaded from that file a chunk at a time: a dataset of any size
//! never sits in memory.

use std::io::{IsTerminal, Write};
use std::path::Path;
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

/// A packed bundle.
pub struct Bundle {
    /// The tar.gz, in a temp file removed when the bundle is dropped.
    pub file: tempfile::NamedTempFile,
    pub size: u64,
    pub digest: String,
    pub files: usize,
}

/// Writes through to a file, hashing and counting what goes by.
struct HashingWriter {
    file: std::io::BufWriter<std::fs::File>,
    hasher: Sha256,
    size: u64,
}

impl Write for HashingWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.file.write(bytes)?;
        self.hasher.update(&bytes[..written]);
        self.size += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
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
/// exclude stays out (a dataset takes everything).
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
    let file = tempfile::NamedTempFile::new().context("cannot create a temp file for the bundle")?;
    let writer = HashingWriter {
        file: std::io::BufWriter::new(file.reopen().context("cannot write the bundle")?),
        hasher: Sha256::new(),
        size: 0,
    };
    let encoder = flate2::GzBuilder::new()
        .mtime(0)
        .write(writer, flate2::Compression::default());
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
    }
    let mut writer = builder.into_inner()?.finish()?;
    writer.flush().context("cannot write the bundle")?;
    if ignores && writer.size > MAX_BUNDLE_BYTES {
        bail!(
            "the working directory packs to {} bytes (limit {MAX_BUNDLE_BYTES}); list data in .kilnignore",
            writer.size
        );
    }
    let digest = hex::encode(writer.hasher.finalize());
    Ok(Bundle {
        file,
        size: writer.size,
        digest,
        files,
    })
}

/// Uploads the bundle unless the server has it. Returns true when it was uploaded.
pub async fn upload(clients: &mut Clients, bundle: &Bundle, what: &str) -> Result<bool> {
    let stat = clients
        .artifacts
        .stat_artifact(pb::StatArtifactRequest {
            digest: bundle.digest.clone(),
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
        })),
    };
    // Chunks read from the file as the upload asks for them; a read error ends the stream and
    // is reported instead of the server's complaint about a short upload.
    let file = tokio::fs::File::open(bundle.file.path())
        .await
        .context("cannot read the bundle")?;
    let read_error: Arc<Mutex<Option<std::io::Error>>> = Arc::default();
    let failed = read_error.clone();
    let bar = progress.clone();
    let chunks = stream::unfold(file, move |mut file| {
        let failed = failed.clone();
        let bar = bar.clone();
        async move {
            let mut chunk = Vec::with_capacity(CHUNK);
            match (&mut file).take(CHUNK as u64).read_to_end(&mut chunk).await {
                Ok(0) => None,
                Ok(read) => {
                    bar.inc(read as u64);
                    let message = pb::UploadArtifactRequest {
                        part: Some(Part::Chunk(chunk)),
                    };
                    Some((message, file))
                }
                Err(error) => {
                    *failed.lock().expect("read error slot") = Some(error);
                    None
                }
            }
        }
    });
    let messages = stream::iter([header]).chain(chunks);
    let response = clients.artifacts.upload_artifact(messages).await;
    if let Some(error) = read_error.lock().expect("read error slot").take() {
        return Err(anyhow::Error::new(error).context("cannot read the bundle"));
    }
    let response = response?.into_inner();
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
        let file = std::fs::File::open(bundle.file.path()).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
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
        let bytes = std::fs::read(first.file.path()).unwrap();
        assert_eq!(bytes.len() as u64, first.size);
        assert_eq!(
            hex::encode(Sha256::digest(&bytes)),
            first.digest,
            "the digest is of the file"
        );
        let dir = tree();
        std::fs::write(dir.path().join("src/train.py"), "print('changed')\n").unwrap();
        assert_ne!(pack(dir.path()).unwrap().digest, first.digest);
    }
}
