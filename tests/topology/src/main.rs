//! kiln-topology: starts the topology ([`kiln_topology::Topology`]) and keeps it running until
//! SIGTERM or SIGINT; `scripts/cluster.sh up|down` drives it for a person.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(about = "every kiln service as separate processes on Postgres, a NATS cluster, Scylla and S3")]
struct Args {
    /// Where to keep configs, logs and data.
    #[arg(long)]
    dir: PathBuf,
    /// Written once everything listens: the `export` lines for the CLI and the SDK.
    #[arg(long)]
    exports_file: Option<PathBuf>,
    /// TLS only: gRPC with client certificates, NATS with TLS (NKey users per service either way).
    #[arg(long)]
    tls: bool,
}

fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    let mut options = kiln_topology::Options::from_env();
    let options_dir = args.dir.clone();
    options.dir = Some(args.dir);
    options.lease_ttl_ms = 10_000;
    options.tls = args.tls;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut topology = runtime.block_on(kiln_topology::Topology::start(options));
    let exports = topology.exports();
    println!("{exports}");
    // Every instance's gRPC URL by name (`item-batch-2`), for what must reach one replica.
    let urls: std::collections::BTreeMap<String, String> = topology
        .instances()
        .into_iter()
        .map(|name| {
            let url = topology.url(&name);
            (name, url)
        })
        .collect();
    std::fs::write(options_dir.join("instances.json"), serde_json::to_string_pretty(&urls)?)?;
    if let Some(path) = &args.exports_file {
        std::fs::write(path, format!("{exports}\n"))?;
    }
    runtime.block_on(async { kiln_core::shutdown::on_signal().cancelled().await });
    eprintln!("kiln-topology: stopping");
    topology.stop();
    Ok(ExitCode::SUCCESS)
}
