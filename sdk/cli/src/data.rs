//! `kiln artifacts` (a job's synced outputs) and `kiln dataset` (named read-only data).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use kiln_proto::v1 as pb;
use tabled::settings::Style;
use tokio::io::AsyncWriteExt;

use crate::client;
use crate::format::{self, Output, bytes, out};
use crate::pack;

#[derive(Debug, clap::Subcommand)]
pub enum ArtifactsCommand {
    /// List the files a job wrote to /kiln/outputs.
    Ls {
        job: String,
        /// Only files under this path.
        prefix: Option<String>,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Download a job's outputs (all, or the files under PATH).
    Get {
        job: String,
        path: Option<String>,
        /// Directory to write into (default: the current directory).
        #[arg(long, default_value = ".")]
        dest: PathBuf,
    },
    /// List the artifacts a run saved with `kiln.save` (all, or one by name).
    Saved {
        job: String,
        name: Option<String>,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Download an artifact a run saved: a file to DEST/NAME, a directory to DEST/NAME/.
    GetSaved {
        job: String,
        name: String,
        #[arg(long, default_value = ".")]
        dest: PathBuf,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum DatasetCommand {
    /// Upload a directory as a dataset (immutable; jobs mount it with --dataset NAME).
    Create {
        name: String,
        #[arg(long)]
        from: PathBuf,
        /// The project it belongs to (default: `default`).
        #[arg(long)]
        project: Option<String>,
    },
    /// List datasets.
    Ls {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Delete a dataset (its creator or a maintainer; refused while a queued or running job names it).
    Rm {
        name: String,
        /// The project it belongs to (default: `default`).
        #[arg(long)]
        project: Option<String>,
    },
}

pub async fn artifacts(command: ArtifactsCommand) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    match command {
        ArtifactsCommand::Saved { job, name, output } => return crate::saved::list(job, name, output).await,
        ArtifactsCommand::GetSaved { job, name, dest } => return crate::saved::get(job, name, dest).await,
        ArtifactsCommand::Ls { job, prefix, output } => {
            let request = pb::ListOutputsRequest {
                job_id: job,
                prefix: prefix.unwrap_or_default(),
            };
            let files = clients.artifacts.list_outputs(request).await?.into_inner().files;
            if output == Output::Json {
                let files: Vec<_> = files
                    .iter()
                    .map(|file| serde_json::json!({"path": file.path, "size": file.size}))
                    .collect();
                format::print_json(&files)?;
                return Ok(ExitCode::SUCCESS);
            }
            for file in files {
                out!("{:>10}  {}", bytes(file.size), file.path);
            }
        }
        ArtifactsCommand::Get { job, path, dest } => {
            let request = pb::ListOutputsRequest {
                job_id: job.clone(),
                prefix: path.clone().unwrap_or_default(),
            };
            let files = clients.artifacts.list_outputs(request).await?.into_inner().files;
            if files.is_empty() {
                bail!(
                    "job {job} has no outputs{}",
                    path.map(|p| format!(" under {p}")).unwrap_or_default()
                );
            }
            let total: u64 = files.iter().map(|f| f.size).sum();
            let progress = pack::progress_bar(total, "downloading");
            for file in &files {
                let target = safe_join(&dest, &file.path)?;
                if let Some(parent) = target.parent() {
                    tokio::fs::create_dir_all(parent).await?;
                }
                let mut out = tokio::fs::File::create(&target)
                    .await
                    .with_context(|| format!("cannot write {}", target.display()))?;
                let request = pb::GetOutputRequest {
                    job_id: job.clone(),
                    path: file.path.clone(),
                };
                let mut chunks = clients.artifacts.get_output(request).await?.into_inner();
                while let Some(chunk) = chunks.next().await {
                    let chunk = chunk?;
                    out.write_all(&chunk.data).await?;
                    progress.inc(chunk.data.len() as u64);
                }
                out.flush().await?;
            }
            progress.finish_and_clear();
            eprintln!("{} files, {} written to {}", files.len(), bytes(total), dest.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Joins a server-given relative path to `dest`, refusing anything that would leave it.
pub(crate) fn safe_join(dest: &Path, relative: &str) -> Result<PathBuf> {
    let mut path = dest.to_path_buf();
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => bail!("refusing output path {relative:?}"),
            part => path.push(part),
        }
    }
    Ok(path)
}

pub async fn dataset(command: DatasetCommand) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    match command {
        DatasetCommand::Create { name, from, project } => {
            if !from.is_dir() {
                bail!("{} is not a directory", from.display());
            }
            let bundle = tokio::task::spawn_blocking(move || pack::pack_with(&from, false)).await??;
            pack::upload(
                &mut clients,
                &bundle,
                project.as_deref().unwrap_or_default(),
                "uploading dataset",
            )
            .await?;
            let request = pb::CreateDatasetRequest {
                name,
                digest: bundle.digest.clone(),
                project: project.unwrap_or_default(),
            };
            let dataset = clients.datasets.create_dataset(request).await?.into_inner();
            out!(
                "dataset {} created: {} files, {}",
                dataset.name,
                bundle.files,
                bytes(dataset.size)
            );
        }
        DatasetCommand::Rm { name, project } => {
            let request = pb::DeleteDatasetRequest {
                name: name.clone(),
                project: project.unwrap_or_default(),
            };
            let deleted = clients.datasets.delete_dataset(request).await?.into_inner();
            if deleted.archive_deleted {
                out!("dataset {name} deleted");
            } else {
                out!("dataset {name} deleted (its archive stays: another dataset names it)");
            }
        }
        DatasetCommand::Ls { output } => {
            let datasets = clients
                .datasets
                .list_datasets(pb::ListDatasetsRequest::default())
                .await?
                .into_inner()
                .datasets;
            if output == Output::Json {
                let datasets: Vec<_> = datasets
                    .iter()
                    .map(|dataset| {
                        serde_json::json!({
                            "name": dataset.name,
                            "size": dataset.size,
                            "created_by": dataset.created_by,
                            "created_at_ms": dataset.created_at_ms,
                            "digest": dataset.digest,
                        })
                    })
                    .collect();
                format::print_json(&datasets)?;
                return Ok(ExitCode::SUCCESS);
            }
            let mut builder = tabled::builder::Builder::default();
            builder.push_record(["NAME", "SIZE", "CREATED BY", "AGE", "DIGEST"]);
            for dataset in datasets {
                builder.push_record([
                    dataset.name,
                    bytes(dataset.size),
                    dataset.created_by,
                    format::age(dataset.created_at_ms),
                    dataset.digest.chars().take(12).collect(),
                ]);
            }
            out!("{}", builder.build().with(Style::blank()));
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_paths_stay_in_dest() {
        assert_eq!(safe_join(Path::new("/d"), "a/b.txt").unwrap(), Path::new("/d/a/b.txt"));
        assert!(safe_join(Path::new("/d"), "../x").is_err());
    }

    proptest::proptest! {
        /// Whatever path the server sends, the file lands under dest, or the path is refused
        /// (exactly when it climbs).
        #[test]
        fn any_output_path_lands_under_dest_or_is_refused(relative in "[a./\\\x00-]{0,12}|.{0,16}") {
            let dest = Path::new("/d/out");
            let climbs = relative.split('/').any(|part| part == "..");
            match safe_join(dest, &relative) {
                Ok(path) => {
                    proptest::prop_assert!(!climbs);
                    let rest = path.strip_prefix(dest).unwrap();
                    proptest::prop_assert!(
                        rest.components().all(|c| matches!(c, std::path::Component::Normal(_))),
                        "{:?} -> {:?}", relative, path
                    );
                }
                Err(error) => {
                    proptest::prop_assert!(climbs);
                    proptest::prop_assert!(error.to_string().contains("refusing output path"));
                }
            }
        }
    }
}
