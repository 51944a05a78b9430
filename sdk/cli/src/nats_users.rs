//! `kiln nats-users`: the NATS users of a deployment of separate services (compose, AWS): one
//! NKey seed per service in `--seeds-dir` (`<service>.nk`, mode 0600 in a 0700 directory; made
//! once, kept after), and the nats-server `authorization` block that admits them, each with
//! the subjects of `kiln_core::nats_auth`, written to `--out` (a file the servers' configs
//! `include`) or printed. The block holds public keys only; the seeds are the secrets.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use kiln_core::nats_auth::{self, NatsUser};

#[derive(Debug, clap::Args)]
pub struct NatsUsersArgs {
    /// Where each service's seed is made (kept when it exists).
    #[arg(long)]
    pub seeds_dir: PathBuf,
    /// Where the `authorization` block is written (default: printed).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn nats_users(args: NatsUsersArgs) -> Result<ExitCode> {
    let seeds = nats_auth::ensure_seed_files(&args.seeds_dir)?;
    let users: Vec<NatsUser> = seeds
        .iter()
        .map(|(service, _, public)| NatsUser::service(*service, public.clone()))
        .collect();
    let block = nats_auth::authorization_block(&users);
    match &args.out {
        Some(path) => {
            std::fs::write(path, block).with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!(
                "kiln: {} NATS users (seeds in {}) written to {}",
                users.len(),
                args.seeds_dir.display(),
                path.display()
            );
        }
        None => print!("{block}"),
    }
    Ok(ExitCode::SUCCESS)
}
