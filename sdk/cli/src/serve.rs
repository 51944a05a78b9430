//! `kiln serve`: inference services run by the predictor — create (packing the working
//! directory as `kiln run` does, so every worker runs that code), ls, status, update (a new
//! revision, rolled to without a failed request), scale, stop and logs (its workers' lines).
//!
//! Service names are unique per project: a command names a service as `NAME` (with
//! `--project`, or without it the one service of that name in the projects you may read) or
//! `PROJECT/NAME`, and a `--model` as `NAME...` of the service's project or `PROJECT/NAME...`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use kiln_proto::v1 as pb;
use tabled::settings::Style;

use crate::client;
use crate::format::{self, Output, out};
use crate::pack;

mod logs;
mod show;

use show::{models_text, print_status, revision_text, service_json, workers_running};

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
#[derive(Debug, clap::Args)]
pub struct ScalingArgs {
    /// The fewest workers per member; 0 lets an idle member go without (scale to zero).
    #[arg(long)]
    pub min_replicas: Option<u32>,
    /// The most workers per member.
    #[arg(long)]
    pub max_replicas: Option<u32>,
    /// In-flight requests per worker aimed at.
    #[arg(long, default_value_t = kiln_core::serving::DEFAULT_TARGET_IN_FLIGHT)]
    pub target_in_flight: f64,
    /// One more worker while the workers' mean time per request is above it (0: off).
    #[arg(long, default_value_t = 0)]
    pub target_latency_ms: u64,
    /// How long the load stays low before workers are cut (and an idle member goes to
    /// --min-replicas).
    #[arg(long, default_value_t = kiln_core::serving::DEFAULT_SCALE_DOWN_DELAY_MS)]
    pub scale_down_delay_ms: u64,
    /// How long a request that finds no worker waits for one (default: 60000 with
    /// --min-replicas 0, else none).
    #[arg(long)]
    pub cold_wait_ms: Option<u64>,
}

impl ScalingArgs {
    /// The bounds asked for; `None` when neither bound is given (fixed replicas).
    fn to_proto(&self) -> Option<pb::Scaling> {
        if self.min_replicas.is_none() && self.max_replicas.is_none() {
            return None;
        }
        let min = self.min_replicas.unwrap_or(1);
        Some(pb::Scaling {
            min_replicas: min,
            max_replicas: self.max_replicas.unwrap_or(min),
            target_in_flight: self.target_in_flight,
            target_latency_ms: self.target_latency_ms,
            scale_down_delay_ms: self.scale_down_delay_ms,
            cold_wait_ms: self.cold_wait_ms.unwrap_or(0),
        })
    }
}

/// The project of a service named without one.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServiceProject {
    /// The service's project (default: the one project you may read that has a service of
    /// that name; PROJECT/NAME names it too).
    #[arg(long)]
    pub project: Option<String>,
}

impl ServiceProject {
    fn value(&self) -> String {
        self.project.clone().unwrap_or_default()
    }
}

/// `new=N` or `N`: the percent of requests the new revision answers.
fn parse_traffic(text: &str) -> Result<u32, String> {
    let percent = text.strip_prefix("new=").unwrap_or(text);
    match percent.parse::<u32>() {
        Ok(percent) if (1..=100).contains(&percent) => Ok(percent),
        _ => Err(format!(
            "`{text}` is not new=PERCENT with PERCENT 1 to 100 (such as new=10)"
        )),
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum ServeCommand {
    /// Make a service: its workers are asked for at once; prints its URL on the last line.
    Create {
        name: String,
        #[arg(long)]
        project: Option<String>,
        #[command(flatten)]
        definition: DefinitionArgs,
    },
    /// Services you may see (running ones; --all for stopped ones too).
    Ls {
        #[arg(short, long)]
        all: bool,
        #[arg(long)]
        project: Option<String>,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// A service's revisions, members and workers (`-o json` has the URL as `url`).
    Status {
        name: String,
        #[command(flatten)]
        project: ServiceProject,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Roll to a new revision: the predictors switch once its workers are ready; with
    /// --traffic or --shadow it is tried beside the serving one instead (without --model, the
    /// revision being tried gets the new share: --traffic new=100 rolls to it).
    Update {
        name: String,
        #[command(flatten)]
        project: ServiceProject,
        #[command(flatten)]
        definition: DefinitionArgs,
        /// The share of requests the new revision answers once ready, new=PERCENT (1 to 100).
        #[arg(long, value_parser = parse_traffic)]
        traffic: Option<u32>,
        /// Send copies of every request to the new revision, compare its answers with the
        /// serving one's and count them (kiln_predictor_shadow_requests), never return them.
        #[arg(long, conflicts_with = "traffic")]
        shadow: bool,
    },
    /// Set the workers per member: a fixed number, or bounds to autoscale within.
    Scale {
        name: String,
        #[command(flatten)]
        project: ServiceProject,
        #[arg(required_unless_present_any = ["min_replicas", "max_replicas"])]
        replicas: Option<u32>,
        #[command(flatten)]
        scaling: ScalingArgs,
    },
    /// Stop a service and its workers.
    Stop {
        name: String,
        #[command(flatten)]
        project: ServiceProject,
    },
    /// The logs of the service's workers, each line prefixed with its worker (member,
    /// revision, the end of its job id); -f follows them and the workers that start later.
    Logs(logs::LogsArgs),
}

pub async fn serve(command: ServeCommand) -> Result<ExitCode> {
    let credentials = client::resolve().await?;
    let mut clients = client::connect(&credentials).await?;
    match command {
        ServeCommand::Create {
            name,
            project,
            definition,
        } => {
            let definition = definition_of(&mut clients, project.as_deref().unwrap_or_default(), definition).await?;
            let service = clients
                .serve
                .create_service(pb::CreateServiceRequest {
                    name,
                    project: project.unwrap_or_default(),
                    definition: Some(definition),
                })
                .await?
                .into_inner();
            out!(
                "service {} of project {} created (revision {}); infer at {}/v2/models/{}/{}/infer",
                service.name,
                service.project,
                service.revision,
                service.url,
                service.project,
                service.name
            );
            out!("{}", service.url);
        }
        ServeCommand::Ls { all, project, output } => {
            let services = clients
                .serve
                .list_services(pb::ListServicesRequest {
                    project: project.unwrap_or_default(),
                    all,
                })
                .await?
                .into_inner()
                .services;
            match output {
                Output::Json => format::print_json(&services.iter().map(service_json).collect::<Vec<_>>())?,
                Output::Table => {
                    let mut table = tabled::builder::Builder::default();
                    table.push_record(["NAME", "PROJECT", "STATE", "REVISION", "MODELS", "WORKERS"]);
                    for service in &services {
                        let ready = workers_running(service);
                        table.push_record([
                            service.name.clone(),
                            service.project.clone(),
                            service.state.clone(),
                            revision_text(service),
                            models_text(service),
                            ready,
                        ]);
                    }
                    out!("{}", table.build().with(Style::blank()));
                }
            }
        }
        ServeCommand::Status { name, project, output } => {
            let service = clients
                .serve
                .get_service(pb::GetServiceRequest {
                    name,
                    project: project.value(),
                })
                .await?
                .into_inner();
            match output {
                Output::Json => format::print_json(&service_json(&service))?,
                Output::Table => print_status(&service)?,
            }
        }
        ServeCommand::Update {
            name,
            project,
            definition,
            traffic,
            shadow,
        } => {
            let rollout_only = definition.models.is_empty() && definition.command.is_empty();
            if rollout_only && traffic.is_none() && !shadow {
                bail!(
                    "give the new revision (--model ... -- COMMAND), or --traffic new=PERCENT / --shadow for the one being tried"
                );
            }
            let definition = if rollout_only {
                None
            } else {
                // The code goes to the service's project.
                let home = clients
                    .serve
                    .get_service(pb::GetServiceRequest {
                        name: name.clone(),
                        project: project.value(),
                    })
                    .await?
                    .into_inner()
                    .project;
                Some(definition_of(&mut clients, &home, definition).await?)
            };
            let service = clients
                .serve
                .update_service(pb::UpdateServiceRequest {
                    name,
                    definition,
                    traffic: traffic.unwrap_or(0),
                    shadow,
                    project: project.value(),
                })
                .await?
                .into_inner();
            if service.latest_revision == service.revision {
                out!("service {} serves revision {}", service.name, service.revision);
            } else if service.shadow {
                out!(
                    "service {} tries revision {} in shadow once its workers are ready (serving {})",
                    service.name,
                    service.latest_revision,
                    service.revision
                );
            } else if service.traffic < 100 {
                out!(
                    "service {} sends {}% of requests to revision {} once its workers are ready (serving {})",
                    service.name,
                    service.traffic,
                    service.latest_revision,
                    service.revision
                );
            } else {
                out!(
                    "service {} rolling to revision {} (serving {} until its workers are ready)",
                    service.name,
                    service.latest_revision,
                    service.revision
                );
            }
        }
        ServeCommand::Scale {
            name,
            project,
            replicas,
            scaling,
        } => {
            let service = clients
                .serve
                .scale_service(pb::ScaleServiceRequest {
                    name,
                    replicas: replicas.unwrap_or(0),
                    scaling: scaling.to_proto(),
                    project: project.value(),
                })
                .await?
                .into_inner();
            let scaling = service.scaling.unwrap_or_default();
            if scaling.max_replicas > scaling.min_replicas {
                out!(
                    "service {}: {} to {} worker(s) per member, autoscaled",
                    service.name,
                    scaling.min_replicas,
                    scaling.max_replicas
                );
            } else {
                out!(
                    "service {}: {} worker(s) per member",
                    service.name,
                    scaling.min_replicas
                );
            }
        }
        ServeCommand::Stop { name, project } => {
            let service = clients
                .serve
                .stop_service(pb::StopServiceRequest {
                    name,
                    project: project.value(),
                })
                .await?
                .into_inner();
            out!("service {} {}", service.name, service.state.to_lowercase());
        }
        ServeCommand::Logs(args) => logs::logs(&mut clients, args).await?,
    }
    Ok(ExitCode::SUCCESS)
}

async fn definition_of(
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
    let mut code_digest = String::new();
    if !args.no_code {
        let root = match args.code {
            Some(dir) => dir,
            None => std::env::current_dir()?,
        };
        let bundle = tokio::task::spawn_blocking(move || pack::pack(&root)).await??;
        pack::upload(clients, &bundle, project, "uploading code").await?;
        code_digest = bundle.digest;
    }
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
                ..Default::default()
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
