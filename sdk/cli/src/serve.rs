//! `kiln serve`: inference services run by the predictor — create (packing the working
//! directory as `kiln run` does, so every worker runs that code), ls, status, update (a new
//! revision, rolled to without a failed request), scale and stop.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use kiln_proto::v1 as pb;
use serde_json::json;
use tabled::settings::Style;

use crate::client;
use crate::format::{self, Output, out, state_name};
use crate::pack;

/// What a revision is made of (create and update take the same).
#[derive(Debug, clap::Args)]
pub struct DefinitionArgs {
    /// A registered model: NAME@ALIAS, NAME:VERSION or NAME (its latest version); repeat for an
    /// ensemble.
    #[arg(long = "model", required = true)]
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
    /// Workers per member.
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
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
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
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
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Roll to a new revision: the predictors switch once its workers are ready.
    Update {
        name: String,
        #[command(flatten)]
        definition: DefinitionArgs,
    },
    /// Set the workers per member.
    Scale { name: String, replicas: u32 },
    /// Stop a service and its workers.
    Stop { name: String },
}

pub async fn serve(command: ServeCommand) -> Result<ExitCode> {
    let credentials = client::resolve()?;
    let mut clients = client::connect(&credentials).await?;
    match command {
        ServeCommand::Create {
            name,
            project,
            definition,
        } => {
            let definition = definition_of(&mut clients, definition).await?;
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
                "service {} created (revision {}); infer at {}/v2/models/{}/infer",
                service.name,
                service.revision,
                service.url,
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
        ServeCommand::Status { name, output } => {
            let service = clients
                .serve
                .get_service(pb::GetServiceRequest { name })
                .await?
                .into_inner();
            match output {
                Output::Json => format::print_json(&service_json(&service))?,
                Output::Table => print_status(&service)?,
            }
        }
        ServeCommand::Update { name, definition } => {
            let definition = definition_of(&mut clients, definition).await?;
            let service = clients
                .serve
                .update_service(pb::UpdateServiceRequest {
                    name,
                    definition: Some(definition),
                })
                .await?
                .into_inner();
            out!(
                "service {} rolling to revision {} (serving {} until its workers are ready)",
                service.name,
                service.latest_revision,
                service.revision
            );
        }
        ServeCommand::Scale { name, replicas } => {
            let service = clients
                .serve
                .scale_service(pb::ScaleServiceRequest { name, replicas })
                .await?
                .into_inner();
            out!("service {}: {} worker(s) per member", service.name, replicas.max(1));
        }
        ServeCommand::Stop { name } => {
            let service = clients
                .serve
                .stop_service(pb::StopServiceRequest { name })
                .await?
                .into_inner();
            out!("service {} {}", service.name, service.state.to_lowercase());
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn definition_of(clients: &mut client::Clients, args: DefinitionArgs) -> Result<pb::ServiceDefinition> {
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
        pack::upload(clients, &bundle, "uploading code").await?;
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
        worker: Some(pb::JobSpec {
            command: args.command,
            env: args.env.into_iter().collect(),
            resources: Some(pb::Resources {
                cpu_millis: args.cpu,
                memory_bytes: args.mem,
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
        .map(|dim| dim.trim().parse::<i64>().map_err(|_| format!("`{dim}` in `{text}` is not a size or -1")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(pb::TensorMetadata {
        name: name.into(),
        datatype: datatype.to_uppercase(),
        shape,
    })
}

fn revision_text(service: &pb::Service) -> String {
    if service.latest_revision > service.revision {
        format!("{} → {}", service.revision, service.latest_revision)
    } else {
        service.revision.to_string()
    }
}

fn models_text(service: &pb::Service) -> String {
    service
        .members
        .iter()
        .filter(|member| member.revision == service.revision)
        .map(|member| member.model_version.clone())
        .collect::<Vec<_>>()
        .join(",")
}

fn workers_running(service: &pb::Service) -> String {
    let (running, wanted) = service
        .members
        .iter()
        .filter(|member| member.revision == service.revision)
        .fold((0, 0), |(running, wanted), member| {
            let up = member
                .workers
                .iter()
                .filter(|worker| worker.state == pb::JobState::Running as i32)
                .count();
            (running + up, wanted + member.wanted as usize)
        });
    format!("{running}/{wanted}")
}

fn print_status(service: &pb::Service) -> Result<()> {
    out!("service   {} ({})", service.name, service.state);
    out!("project   {}", service.project);
    out!("url       {}/v2/models/{}/infer", service.url, service.name);
    out!("revision  {}", revision_text(service));
    if let Some(definition) = &service.definition {
        out!(
            "ensemble  {}, deadline {} ms, quorum {}",
            definition.ensemble,
            definition.deadline_ms,
            definition.quorum
        );
    }
    if !service.reason.is_empty() {
        out!("reason    {}", service.reason);
    }
    let mut table = tabled::builder::Builder::default();
    table.push_record(["REVISION", "MEMBER", "MODEL", "WEIGHT", "WORKER", "STATE"]);
    for member in &service.members {
        if member.workers.is_empty() {
            table.push_record([
                member.revision.to_string(),
                member.member.clone(),
                member.model_version.clone(),
                member.weight.to_string(),
                String::new(),
                "(none yet)".into(),
            ]);
        }
        for worker in &member.workers {
            table.push_record([
                member.revision.to_string(),
                member.member.clone(),
                member.model_version.clone(),
                member.weight.to_string(),
                worker.job_id.clone(),
                state_name(worker.state),
            ]);
        }
    }
    out!("{}", table.build().with(Style::blank()));
    Ok(())
}

fn service_json(service: &pb::Service) -> serde_json::Value {
    json!({
        "name": service.name,
        "project": service.project,
        "owner": service.owner,
        "state": service.state,
        "reason": service.reason,
        "url": service.url,
        "revision": service.revision,
        "latest_revision": service.latest_revision,
        "ensemble": service.definition.as_ref().map(|definition| definition.ensemble.clone()),
        "deadline_ms": service.definition.as_ref().map(|definition| definition.deadline_ms),
        "quorum": service.definition.as_ref().map(|definition| definition.quorum),
        "members": service.members.iter().map(|member| json!({
            "member": member.member,
            "model_version": member.model_version,
            "weight": member.weight,
            "revision": member.revision,
            "wanted": member.wanted,
            "workers": member.workers.iter().map(|worker| json!({
                "job_id": worker.job_id,
                "state": state_name(worker.state),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "created_at_ms": service.created_at_ms,
        "updated_at_ms": service.updated_at_ms,
    })
}
