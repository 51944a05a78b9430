//! `kiln serve`: inference services run by the predictor — create (packing the working
//! directory as `kiln run` does, so every worker runs that code), ls, status, update (a new
//! revision, rolled to without a failed request), scale, stop and logs (its workers' lines).
//!
//! Service names are unique per project: a command names a service as `NAME` (with
//! `--project`, or without it the one service of that name in the projects you may read) or
//! `PROJECT/NAME`, and a `--model` as `NAME...` of the service's project or `PROJECT/NAME...`.

use std::process::ExitCode;

use anyhow::{Result, bail};
use kiln_proto::v1 as pb;
use tabled::settings::Style;

use crate::client;
use crate::format::{self, Output, out};

mod definition;
mod logs;
mod show;

pub use definition::DefinitionArgs;
use definition::definition_of;
use show::{models_text, print_status, revision_text, service_json, workers_running};

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
