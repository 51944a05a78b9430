//! What a service's revision is made of, from the flags `kiln serve create` and `update` share:
//! its models, the worker's command (with the working directory packed), resources and tensors.

use std::path::PathBuf;

use anyhow::{Result, bail};
use kiln_proto::v1 as pb;

use crate::client;
use crate::format;
use crate::pack;

use super::ScalingArgs;

/// What a revision is made of (create and update take the same).
#[derive(Debug, clap::Args)]
pub struct DefinitionArgs {
    /// A registered model: NAME@ALIAS, NAME:VERSION or NAME (its latest version), of the
    /// service's project or, as PROJECT/NAME..., of another; repeat for an ensemble.
    #[arg(long = "model")]
    pub models: Vec<String>,
    /// How the members' answers combine: mean, weighted-mean, vote or first.
    #[arg(long, default_value = "mean")]
    pub ensemble: String,
    /// The members' weights, in --model order (weighted-mean and vote), such as 2,1.
    #[arg(long, value_delimiter = ',')]
    pub weights: Vec<f64>,
    /// The deadline of a request that gives none, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub deadline_ms: u64,
    /// The fewest members whose answers make an answer.
    #[arg(long, default_value_t = 1)]
    pub quorum: u32,
    /// Workers per member (without --min-replicas/--max-replicas).
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    #[command(flatten)]
    pub scaling: ScalingArgs,
    /// An input requests must give, NAME:DATATYPE:SHAPE with -1 for any size (such as
    /// x:FP32:-1,64); repeatable. The predictor checks requests against them, serves them as
    /// the model's metadata, and /predict feeds the first.
    #[arg(long = "input", value_parser = parse_tensor)]
    pub inputs: Vec<pb::TensorMetadata>,
    /// An output the service gives, NAME:DATATYPE:SHAPE; repeatable (/predict answers with the
    /// first).
    #[arg(long = "output", value_parser = parse_tensor)]
    pub outputs: Vec<pb::TensorMetadata>,
    /// CPU cores per worker (0.5 is half a core).
    #[arg(long, default_value = "1", value_parser = format::parse_cpu)]
    pub cpu: u32,
    /// Memory per worker, such as 512M or 4G.
    #[arg(long, default_value = "1G", value_parser = format::parse_size)]
    pub mem: u64,
    /// Each worker's own disk, such as 20G (needs --image), as `kiln run --disk`.
    #[arg(long, value_parser = format::parse_size)]
    pub disk: Option<u64>,
    /// Size of each worker's /dev/shm, such as 1G (Docker's default is 64M); counts against --mem.
    #[arg(long, value_parser = format::parse_size)]
    pub shm: Option<u64>,
    /// GPUs per worker.
    #[arg(long, default_value_t = 0)]
    pub gpus: u32,
    /// Container image of the workers (default: a local process, when kiln runs one).
    #[arg(long)]
    pub image: Option<String>,
    /// Environment variable of the workers, KEY=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_parser = format::parse_env)]
    pub env: Vec<(String, String)>,
    /// Spot instances only.
    #[arg(long, conflicts_with = "on_demand")]
    pub spot: bool,
    /// On-demand instances only (the default, auto, lets the scheduler choose).
    #[arg(long)]
    pub on_demand: bool,
    /// Directory to pack as the workers' code (default: the current directory).
    #[arg(long)]
    pub code: Option<PathBuf>,
    /// Do not pack and upload any code.
    #[arg(long, conflicts_with = "code")]
    pub no_code: bool,
    /// The worker's command, after `--` (it calls `kiln.serve(predict, load)`).
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// Autoscaling: workers per member between the bounds, from their load.
pub(super) async fn definition_of(
    clients: &mut client::Clients,
    project: &str,
    args: DefinitionArgs,
) -> Result<pb::ServiceDefinition> {
    if args.models.is_empty() {
        bail!("give the service's model(s): --model NAME@ALIAS, NAME:VERSION or NAME (repeat for an ensemble)");
    }
    if args.command.is_empty() {
        bail!("give the worker's command after `--` (it calls kiln.serve(predict, load))");
    }
    if !args.weights.is_empty() && args.weights.len() != args.models.len() {
        bail!(
            "--weights gives {} weight(s) for {} model(s); give one per --model, in order",
            args.weights.len(),
            args.models.len()
        );
    }
    let code_digest = if args.no_code {
        String::new()
    } else {
        pack::upload_code(clients, args.code, project).await?
    };
    Ok(pb::ServiceDefinition {
        models: args
            .models
            .iter()
            .enumerate()
            .map(|(at, model)| pb::ServiceModel {
                model: model.clone(),
                weight: args.weights.get(at).copied().unwrap_or(0.0),
                member: String::new(),
            })
            .collect(),
        ensemble: args.ensemble,
        deadline_ms: args.deadline_ms,
        quorum: args.quorum,
        replicas: args.replicas,
        scaling: args.scaling.to_proto(),
        worker: Some(pb::JobSpec {
            command: args.command,
            env: args.env.into_iter().collect(),
            resources: Some(pb::Resources {
                cpu_millis: args.cpu,
                memory_bytes: args.mem,
                disk_bytes: args.disk.unwrap_or(0),
                shm_bytes: args.shm.unwrap_or(0),
            }),
            code_digest,
            image: args.image.unwrap_or_default(),
            gpus: args.gpus,
            market: match (args.spot, args.on_demand) {
                (true, _) => pb::Market::Spot,
                (_, true) => pb::Market::OnDemand,
                _ => pb::Market::Unspecified,
            } as i32,
            ..Default::default()
        }),
        inputs: args.inputs,
        outputs: args.outputs,
    })
}

/// `NAME:DATATYPE:D1,D2,...` (the datatype is checked by the predictor).
fn parse_tensor(text: &str) -> Result<pb::TensorMetadata, String> {
    let mut parts = text.splitn(3, ':');
    let (Some(name), Some(datatype), Some(shape)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("`{text}` is not NAME:DATATYPE:SHAPE (such as x:FP32:-1,64)"));
    };
    let shape = shape
        .split(',')
        .filter(|dim| !dim.is_empty())
        .map(|dim| {
            dim.trim()
                .parse::<i64>()
                .map_err(|_| format!("`{dim}` in `{text}` is not a size or -1"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(pb::TensorMetadata {
        name: name.into(),
        datatype: datatype.to_uppercase(),
        shape,
    })
}
