//! `kiln model`: the model registry. `register` makes a version of a job's outputs; `ls`,
//! `show` and `versions` read (with text and tag filters); `alias`, `unalias` and `tag` change
//! what points at a version; `get` downloads a version and checks every file's sha256.
//!
//! Model names are unique per project. A command names a model as `NAME` (with `--project`,
//! or without it the one model of that name in the projects you may read) or `PROJECT/NAME`.

use std::collections::HashMap;
use std::process::ExitCode;

use anyhow::{Result, bail};
use kiln_proto::v1 as pb;
use tabled::settings::Style;

use crate::client;
use crate::format::{self, Output, bytes, out};

mod get;
mod show;

/// A version as a command names it: `NAME`, `NAME:3` or `NAME@production`, NAME maybe
/// `PROJECT/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionArg {
    pub name: String,
    pub version: i64,
    pub alias: String,
}

impl std::str::FromStr for VersionArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (name, version, alias) = if let Some((name, alias)) = text.split_once('@') {
            (name, 0, alias.to_string())
        } else if let Some((name, version)) = text.split_once(':') {
            let version = version
                .parse::<i64>()
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| format!("{text:?}: the version after ':' must be a number from 1"))?;
            (name, version, String::new())
        } else {
            (text, 0, String::new())
        };
        if name.is_empty() {
            return Err(format!(
                "{text:?} names no model: write NAME, NAME:VERSION or NAME@ALIAS"
            ));
        }
        Ok(VersionArg {
            name: name.to_string(),
            version,
            alias,
        })
    }
}

/// `JOB` or `JOB:PATH`.
fn parse_source(text: &str) -> Result<(String, String), String> {
    let (job, path) = text.split_once(':').unwrap_or((text, ""));
    if job.is_empty() {
        return Err(format!("{text:?} names no job: write JOB or JOB:PATH"));
    }
    Ok((job.to_string(), path.to_string()))
}

/// The project of a model named without one.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ProjectArg {
    /// The model's project (default: the one project you may read that has a model of that
    /// name; PROJECT/NAME names it too).
    #[arg(long)]
    pub project: Option<String>,
}

impl ProjectArg {
    fn value(&self) -> String {
        self.project.clone().unwrap_or_default()
    }
}

#[derive(Debug, clap::Subcommand)]
pub enum ModelCommand {
    /// Register a new version of a model from a job's outputs and saved artifacts (all, or a
    /// file or directory); the model is of the job's project.
    Register {
        name: String,
        /// JOB or JOB:PATH (PATH a file or directory inside the job's /kiln/outputs, or the name
        /// of an artifact its run saved with kiln.save).
        #[arg(long, value_parser = parse_source)]
        from: (String, String),
        #[arg(long, default_value = "")]
        description: String,
        /// A key=value tag (repeatable).
        #[arg(long = "tag", value_parser = format::parse_env)]
        tags: Vec<(String, String)>,
        /// An alias to point at the new version.
        #[arg(long, default_value = "")]
        alias: String,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// List models (those of the projects you may read).
    Ls {
        #[arg(long)]
        project: Option<String>,
        /// Only names containing this text.
        #[arg(long, default_value = "")]
        query: String,
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Show a version (NAME, NAME:VERSION or NAME@ALIAS): files, lineage, tags, aliases.
    Show {
        version: VersionArg,
        #[command(flatten)]
        project: ProjectArg,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// List a model's versions, newest first.
    Versions {
        name: String,
        #[command(flatten)]
        project: ProjectArg,
        /// Only versions whose description, source job or a tag value contains this text.
        #[arg(long, default_value = "")]
        query: String,
        /// Only versions with this key=value tag (repeatable: all of them).
        #[arg(long = "tag", value_parser = format::parse_env)]
        tags: Vec<(String, String)>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Point ALIAS at VERSION, moving it from the version that held it.
    Alias {
        name: String,
        version: i64,
        alias: String,
        #[command(flatten)]
        project: ProjectArg,
    },
    /// Remove an alias.
    Unalias {
        name: String,
        alias: String,
        #[command(flatten)]
        project: ProjectArg,
    },
    /// Set key=value tags on a version (NAME:VERSION); `key=` removes a tag.
    Tag {
        version: VersionArg,
        #[arg(required = true, value_parser = format::parse_env)]
        tags: Vec<(String, String)>,
        #[command(flatten)]
        project: ProjectArg,
    },
    /// Download a version's files into DIR, checking each file's sha256.
    Get {
        version: VersionArg,
        #[arg(long)]
        dest: std::path::PathBuf,
        #[command(flatten)]
        project: ProjectArg,
    },
}

pub async fn model(command: ModelCommand) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    match command {
        ModelCommand::Register {
            name,
            from: (job_id, path),
            description,
            tags,
            alias,
            output,
        } => {
            let request = pb::RegisterModelRequest {
                name,
                job_id,
                path,
                description,
                tags: tags.into_iter().collect(),
                alias,
            };
            let version = clients.models.register_model(request).await?.into_inner();
            if output == Output::Json {
                format::print_json(&show::version_json(&version))?;
            } else {
                eprintln!(
                    "{} files, {}, digest {}",
                    version.files.len(),
                    bytes(version.size),
                    version.digest
                );
                out!("{}:{}", version.model, version.version);
            }
        }
        ModelCommand::Ls {
            project,
            query,
            limit,
            output,
        } => list_models(&mut clients, project.unwrap_or_default(), query, limit, output).await?,
        ModelCommand::Show {
            version,
            project,
            output,
        } => show::show(&mut clients, version, &project.value(), output).await?,
        ModelCommand::Versions {
            name,
            project,
            query,
            tags,
            limit,
            output,
        } => {
            let request = pb::ListModelVersionsRequest {
                name,
                query,
                tags: tags.into_iter().collect::<HashMap<_, _>>(),
                limit,
                before_version: 0,
                project: project.value(),
            };
            let versions = clients.models.list_model_versions(request).await?.into_inner().versions;
            show::print_versions(&versions, output)?;
        }
        ModelCommand::Alias {
            name,
            version,
            alias,
            project,
        } => {
            let request = pb::SetModelAliasRequest {
                name,
                version,
                alias: alias.clone(),
                project: project.value(),
            };
            let version = clients.models.set_model_alias(request).await?.into_inner();
            out!("{}@{alias} -> {}:{}", version.model, version.model, version.version);
        }
        ModelCommand::Unalias { name, alias, project } => {
            let request = pb::DeleteModelAliasRequest {
                name: name.clone(),
                alias: alias.clone(),
                project: project.value(),
            };
            let held = clients.models.delete_model_alias(request).await?.into_inner();
            out!("{name}@{alias} removed (it pointed at {name}:{})", held.version);
        }
        ModelCommand::Tag { version, tags, project } => {
            if version.version == 0 {
                bail!("name the version to tag: {}:VERSION", version.name);
            }
            let request = pb::SetModelTagsRequest {
                name: version.name,
                version: version.version,
                tags: tags.into_iter().collect(),
                project: project.value(),
            };
            let version = clients.models.set_model_tags(request).await?.into_inner();
            let mut tags: Vec<_> = version.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
            tags.sort();
            out!("{}:{} {}", version.model, version.version, tags.join(" "));
        }
        ModelCommand::Get { version, dest, project } => {
            get::get(&mut clients, version, &project.value(), &dest).await?
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn list_models(
    clients: &mut client::Clients,
    project: String,
    query: String,
    limit: u32,
    output: Output,
) -> Result<()> {
    let mut models = Vec::new();
    let mut page_token = String::new();
    while models.len() < limit as usize {
        let request = pb::ListModelsRequest {
            project: project.clone(),
            query: query.clone(),
            limit: (limit as usize - models.len()).min(1000) as u32,
            page_token,
        };
        let page = clients.models.list_models(request).await?.into_inner();
        models.extend(page.models);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    if output == Output::Json {
        let models: Vec<_> = models.iter().map(show::model_json).collect();
        return format::print_json(&models);
    }
    let mut builder = tabled::builder::Builder::default();
    builder.push_record(["NAME", "PROJECT", "LATEST", "ALIASES", "CREATED BY", "AGE"]);
    for model in models {
        let mut aliases: Vec<_> = model.aliases.iter().map(|(a, v)| format!("{a}:{v}")).collect();
        aliases.sort();
        builder.push_record([
            model.name,
            model.project,
            model.latest_version.to_string(),
            aliases.join(" "),
            model.created_by,
            format::age(model.created_at_ms),
        ]);
    }
    out!("{}", builder.build().with(Style::blank()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_named_by_number_or_alias() {
        let parse = |text: &str| text.parse::<VersionArg>();
        assert_eq!(
            parse("m").unwrap(),
            VersionArg {
                name: "m".into(),
                version: 0,
                alias: String::new()
            }
        );
        assert_eq!(parse("m:3").unwrap().version, 3);
        assert_eq!(parse("m@prod").unwrap().alias, "prod");
        let qualified = parse("alpha/m:2").unwrap();
        assert_eq!((qualified.name.as_str(), qualified.version), ("alpha/m", 2));
        assert!(parse("m:0").is_err() && parse("m:x").is_err() && parse(":3").is_err());
        assert_eq!(parse_source("j:out/model").unwrap(), ("j".into(), "out/model".into()));
        assert_eq!(parse_source("j").unwrap(), ("j".into(), String::new()));
    }
}
