//! The runner's incremental outputs sync (issue 28) beside `aws s3 sync`, the tool SkyPilot and
//! most training scripts use to push checkpoints to S3, on the same directory and the same
//! S3 server in the same run.
//!
//! ```text
//! cargo run --release -p kiln-bench --bin outputs-sync-bench -- [--mib 2048] [--files 64]
//!     [--aws /path/to/aws]
//! ```
//!
//! The S3 server is the one of `KILN_TEST_S3_*` (versitygw, which scripts/bench.sh starts). An
//! outputs directory of `--files` files of random bytes, `--mib` in all, is synced three times,
//! each time by kiln (`kiln_runner::outputs::sync` on the directory, as a process job's outputs,
//! and on the engine's tar of it, as a container's) and by `aws s3 sync`: the first sync (all of
//! it), a sync with nothing changed, and a sync after one file was rewritten whole.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use clap::Parser;
use kiln_runner::outputs::{Manifest, SyncReport, sync};
use kiln_runner::provider::Outputs;
use object_store::{ObjectStore, ObjectStoreExt};
use rand::{RngCore, SeedableRng};

#[derive(Parser)]
struct Args {
    /// Size of the outputs directory, in MiB.
    #[arg(long, default_value_t = 2048)]
    mib: u64,
    /// Files it holds, of equal size.
    #[arg(long, default_value_t = 64)]
    files: u64,
    /// The AWS CLI to compare with (`pip install awscli`); skipped, and said so, when absent.
    #[arg(long)]
    aws: Option<PathBuf>,
}

/// In the third round, one file is rewritten whole, a second after the last sync (so its time
/// moves as a checkpoint written later would).
async fn rewrite_if(round: usize, outputs: &Path, file_bytes: u64, seed: u64) -> Result<()> {
    if round == 2 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        fill(&outputs.join("shard-000.bin"), file_bytes, seed)?;
    }
    Ok(())
}

/// Deletes what a pass stored: kiln's objects, and the peer's prefix.
async fn remove(objects: &Arc<dyn ObjectStore>, aws: &Option<PathBuf>, peer_url: &str) -> Result<()> {
    use futures::TryStreamExt;
    let listed: Vec<object_store::ObjectMeta> = objects.list(None).try_collect().await?;
    for meta in listed {
        objects.delete(&meta.location).await?;
    }
    if let Some(aws) = aws {
        let status = aws_s3(aws, &["rm", "--recursive"])?.arg(peer_url).status()?;
        ensure!(status.success(), "aws s3 rm failed: {status}");
    }
    Ok(())
}

/// One round's times: kiln on the directory, kiln on the tar, aws s3 sync.
struct Round<'a> {
    name: &'a str,
    dir: (Duration, SyncReport),
    tar: (Duration, SyncReport),
    aws: Option<Duration>,
}

fn fill(path: &Path, bytes: u64, seed: u64) -> Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut buffer = vec![0u8; 1 << 20];
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buffer.len() as u64) as usize;
        rng.fill_bytes(&mut buffer[..n]);
        std::io::Write::write_all(&mut file, &buffer[..n])?;
        left -= n as u64;
    }
    std::io::Write::flush(&mut file)?;
    Ok(())
}

/// The directory as the engine's archive API gives it: everything under `outputs/`.
fn engine_tar(dir: &Path, tar_path: &Path) -> Result<()> {
    let mut builder = tar::Builder::new(std::fs::File::create(tar_path)?);
    builder.append_dir_all("outputs", dir)?;
    builder.finish()?;
    Ok(())
}

/// `aws s3 <action>` against the bench's S3 server, with its keys.
fn aws_s3(aws: &Path, action: &[&str]) -> Result<Command> {
    let var = |name: &str| std::env::var(name).with_context(|| format!("{name} is not set"));
    let mut command = Command::new(aws);
    command
        .arg("s3")
        .args(action)
        .args(["--only-show-errors", "--endpoint-url", &var("KILN_TEST_S3_ENDPOINT")?])
        .env("AWS_ACCESS_KEY_ID", var("KILN_TEST_S3_ACCESS_KEY_ID")?)
        .env("AWS_SECRET_ACCESS_KEY", var("KILN_TEST_S3_SECRET_ACCESS_KEY")?)
        .env("AWS_DEFAULT_REGION", "us-east-1");
    Ok(command)
}

fn aws_sync(aws: &Path, dir: &Path, url: &str) -> Result<Duration> {
    let started = Instant::now();
    let status = aws_s3(aws, &["sync"])?.arg(dir).arg(url).status()?;
    ensure!(status.success(), "aws s3 sync failed: {status}");
    Ok(started.elapsed())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(args.files > 0 && args.mib > 0, "--files and --mib must be positive");
    let work = tempfile::tempdir()?;
    let outputs = work.path().join("outputs");
    std::fs::create_dir(&outputs)?;
    let file_bytes = args.mib * (1 << 20) / args.files;
    for n in 0..args.files {
        fill(&outputs.join(format!("shard-{n:03}.bin")), file_bytes, n)?;
    }
    let config = kiln_core::testing::s3_objects_config("outputs-sync-bench");
    let objects: Arc<dyn ObjectStore> = kiln_core::objects::connect(&config).await?;
    let peer_url = format!(
        "s3://{}/aws-{}/",
        std::env::var("KILN_TEST_S3_BUCKET")?,
        kiln_core::ids::new_id()
    );
    let tar_path = work.path().join("outputs.tar");
    let names = ["first sync (everything)", "nothing changed", "one file rewritten"];
    // Two passes over the same three rounds, each cleaned up after, so the store never holds
    // more than two copies: the directory synced by kiln and by aws s3 sync, then the engine's
    // tar of it synced by kiln.
    let mut dir_rounds = Vec::new();
    let mut manifest = Manifest::default();
    for round in 0..names.len() {
        rewrite_if(round, &outputs, file_bytes, 1_000).await?;
        let started = Instant::now();
        let (report, kept) = sync(objects.clone(), "bench-dir", Outputs::Dir(outputs.clone()), manifest).await?;
        manifest = kept;
        let kiln = (started.elapsed(), report);
        let aws = match &args.aws {
            Some(aws) => Some(aws_sync(aws, &outputs, &peer_url)?),
            None => None,
        };
        dir_rounds.push((kiln, aws));
    }
    remove(&objects, &args.aws, &peer_url).await?;
    let mut tar_rounds = Vec::new();
    let mut manifest = Manifest::default();
    for round in 0..names.len() {
        rewrite_if(round, &outputs, file_bytes, 2_000).await?;
        // The tar is what the engine would hand over; making it is part of a container's sync.
        let started = Instant::now();
        engine_tar(&outputs, &tar_path)?;
        let (report, kept) = sync(objects.clone(), "bench-tar", Outputs::Tar(tar_path.clone()), manifest).await?;
        manifest = kept;
        tar_rounds.push((started.elapsed(), report));
        std::fs::remove_file(&tar_path)?;
    }
    remove(&objects, &None, &peer_url).await?;
    let rounds: Vec<Round> = names
        .iter()
        .zip(dir_rounds)
        .zip(tar_rounds)
        .map(|((name, (dir, aws)), tar)| Round { name, dir, tar, aws })
        .collect();
    println!(
        "outputs sync, {} MiB in {} files of {} MiB, to versitygw (S3) on 127.0.0.1 (release build)",
        args.mib,
        args.files,
        file_bytes >> 20
    );
    println!("| sync | kiln, directory (process job) | kiln, engine tar (container) | aws s3 sync |");
    println!("|---|---|---|---|");
    let secs = |d: Duration| format!("{:.2} s", d.as_secs_f64());
    let sent = |r: &SyncReport| format!("{} files, {} MiB sent", r.written.files, r.written.bytes >> 20);
    for round in &rounds {
        println!(
            "| {} | {} ({}) | {} ({}) | {} |",
            round.name,
            secs(round.dir.0),
            sent(&round.dir.1),
            secs(round.tar.0),
            sent(&round.tar.1),
            round.aws.map(secs).unwrap_or_else(|| "not run (no --aws)".into()),
        );
    }
    Ok(())
}
