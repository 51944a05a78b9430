//! The `kiln` command: client commands, and `kiln up`.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod batch;
mod client;
mod commands;
mod data;
mod doctor;
mod format;
mod job_logs;
mod metrics;
mod model;
mod nats_child;
mod nats_users;
mod pack;
mod project;
mod quota;
mod runs;
mod saved;
mod secret;
mod serve;
mod sweep;
mod tenancy;
mod tools;
mod ui;
mod up;

use format::Output;

/// The exit code after stdout was closed under us: 128 + SIGPIPE, what a shell reports for a
/// program killed by SIGPIPE (the default end of `ls | head`).
const BROKEN_PIPE_EXIT: u8 = 141;

#[derive(Parser)]
#[command(name = "kiln", version, about = "Run machine-learning jobs on rented machines")]
struct Cli {
    #[command(flatten)]
    tls: client::TlsFlags,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start every kiln service in this process, on embedded defaults.
    Up(Box<up::UpArgs>),
    /// Submit a job: pack the working directory, upload it, run the command.
    Run(commands::RunArgs),
    /// List your jobs (active ones; --all for every job, --everyone for other users' too).
    Ps {
        #[arg(long)]
        all: bool,
        /// Only this project's jobs.
        #[arg(long)]
        project: Option<String>,
        /// Jobs of every user in the projects you can read, not only yours.
        #[arg(long)]
        everyone: bool,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Show a job.
    Status {
        job: String,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Print a job's logs (-f to follow until it ends, --tail N for the last lines, --grep to
    /// search them).
    Logs {
        job: String,
        #[arg(short, long)]
        follow: bool,
        /// Only the last N lines (then new ones, with -f).
        #[arg(short = 'n', long, value_name = "N", conflicts_with = "grep", value_parser = clap::value_parser!(u32).range(1..=100_000))]
        tail: Option<u32>,
        /// Only lines containing PATTERN.
        #[arg(long, conflicts_with = "follow")]
        grep: Option<String>,
        /// Read --grep as a regular expression.
        #[arg(long, requires = "grep")]
        regex: bool,
        /// For a gang job: only this node's lines (0 is rank 0); without it every node's,
        /// each line after `[node K] `.
        #[arg(long, value_name = "K", conflicts_with = "grep")]
        node: Option<u32>,
    },
    /// Jobs' metrics: the latest value of each key, or --series (of several jobs at once).
    Metrics(metrics::MetricsArgs),
    /// Tables of runs: config, state, duration, latest and best metric values; --where, --sort.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
    /// Compare runs side by side: the table of `kiln runs ls` for the jobs named.
    Compare {
        #[arg(required = true, num_args = 1..)]
        jobs: Vec<String>,
        #[command(flatten)]
        table: runs::TableArgs,
    },
    /// Stop a job: SIGTERM, the grace period, then SIGKILL.
    Stop { job: String },
    /// Why a queued job waits: a quota, no capacity in a pool, or the jobs ahead of it.
    Explain {
        job: String,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Quotas on CPU, memory, GPUs, running and queued jobs, by scope (global, project:NAME,
    /// user:NAME). A project's maintainers set its quota; users' and the global one need the admin.
    #[command(subcommand)]
    Quota(quota::QuotaCommand),
    /// Project secrets, which `kiln run --secret NAME` and batches get as environment variables.
    #[command(subcommand)]
    Secret(secret::SecretCommand),
    /// A job's outputs: the files it wrote to /kiln/outputs.
    #[command(subcommand)]
    Artifacts(data::ArtifactsCommand),
    /// Datasets: named, immutable data that jobs mount read-only.
    #[command(subcommand)]
    Dataset(data::DatasetCommand),
    /// The model registry: versions of a job's outputs with lineage, aliases, tags, downloads.
    #[command(subcommand)]
    Model(model::ModelCommand),
    /// Batches: a command run once per item, by workers that scale with the backlog.
    #[command(subcommand)]
    Batch(batch::BatchCommand),
    /// Hyper-parameter sweeps: trials as jobs, suggested by the advisor (random, grid, TPE),
    /// stopped early (ASHA, median), within a budget.
    #[command(subcommand)]
    Sweep(sweep::SweepCommand),
    /// Inference services: registered models served by workers behind the predictor's Open
    /// Inference Protocol endpoint (ensembles, deadlines, rolling updates).
    #[command(subcommand)]
    Serve(serve::ServeCommand),
    /// Users (admin): create, list, disable.
    #[command(subcommand)]
    User(tenancy::UserCommand),
    /// Your tokens: create (optionally expiring, narrowed to a project and role), list, revoke.
    #[command(subcommand)]
    Token(tenancy::TokenCommand),
    /// Projects and their members in roles (viewer, member, maintainer).
    #[command(subcommand)]
    Project(project::ProjectCommand),
    /// Who the token in use is, and its projects.
    Whoami {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Store a token (read from stdin) and the addresses in KILN_HOME/credentials.toml.
    Login(tenancy::LoginArgs),
    /// Check each service this client uses: reachable (TLS included), the right service
    /// answering, the token accepted, the api's version; one line each, exit 1 if any is wrong.
    Doctor,
    /// Sign a browser in to the web UI as the token in use: opens its login page and approves
    /// the code it shows (--approve CODE approves a code without asking).
    Ui(ui::UiArgs),
    /// Make one NKey seed per service (once) and the nats-server `authorization` block that
    /// admits them with their subjects, for deployments of separate services (compose, AWS).
    NatsUsers(nats_users::NatsUsersArgs),
    /// Print a shell completion script: `source <(kiln completions bash)`, or save it where the
    /// shell loads completions from (see the README).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    client::set_tls_flags(cli.tls.into());
    if let Command::Completions { shell } = cli.command {
        return finish(completions(shell));
    }
    let command = match cli.command {
        Command::NatsUsers(args) => return finish(nats_users::nats_users(args)),
        command => command,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match command {
            Command::Up(args) => up::up(*args).await,
            Command::Run(args) => commands::run(args).await,
            Command::Ps {
                all,
                project,
                everyone,
                output,
            } => commands::ps(all, project, everyone, output).await,
            Command::Status { job, output } => commands::status(job, output).await,
            Command::Logs {
                job,
                grep: Some(pattern),
                regex,
                ..
            } => job_logs::grep(job, pattern, regex).await,
            Command::Logs {
                job,
                follow,
                tail,
                grep: None,
                node,
                ..
            } => job_logs::logs(job, follow, tail, node).await,
            Command::Metrics(args) => metrics::metrics(args).await,
            Command::Runs(command) => runs::runs(command).await,
            Command::Compare { jobs, table } => runs::compare(jobs, table).await,
            Command::Stop { job } => commands::stop(job).await,
            Command::Explain { job, output } => commands::explain(job, output).await,
            Command::Quota(command) => quota::quota(command).await,
            Command::Secret(command) => secret::secret(command).await,
            Command::Artifacts(command) => data::artifacts(command).await,
            Command::Dataset(command) => data::dataset(command).await,
            Command::Model(command) => model::model(command).await,
            Command::Batch(command) => batch::batch(command).await,
            Command::Sweep(command) => sweep::sweep(command).await,
            Command::Serve(command) => serve::serve(command).await,
            Command::User(command) => tenancy::user(command).await,
            Command::Token(command) => tenancy::token(command).await,
            Command::Project(command) => project::project(command).await,
            Command::Whoami { output } => tenancy::whoami(output).await,
            Command::Login(args) => tenancy::login(args).await,
            Command::Doctor => doctor::doctor().await,
            Command::Ui(args) => ui::ui(args).await,
            Command::Completions { .. } | Command::NatsUsers(_) => {
                unreachable!("answered before the runtime starts")
            }
        }
    });
    finish(result)
}

/// Writes the completion script of `shell` to stdout.
fn completions(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    // Into a buffer first: `generate` panics on a write error, and stdout may be a closed pipe.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "kiln", &mut script);
    std::io::stdout().lock().write_all(&script)?;
    Ok(ExitCode::SUCCESS)
}

/// The exit code of a command's result; errors are printed, except a closed stdout (`kiln ps |
/// head`), which ends the command quietly as it would end `ls` or `git log`.
fn finish(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(error) if format::is_broken_pipe(&error) => ExitCode::from(BROKEN_PIPE_EXIT),
        Err(error) => {
            match error.downcast_ref::<tonic::Status>() {
                Some(status) => {
                    // A refused TLS client certificate shows only in the transport error under it.
                    let cause = std::error::Error::source(status)
                        .map(|source| format!(": {}", kiln_formats::error::with_sources(source)))
                        .unwrap_or_default();
                    eprintln!("error: {} ({:?}){cause}", status.message(), status.code())
                }
                None => eprintln!("error: {error:#}"),
            }
            ExitCode::FAILURE
        }
    }
}
