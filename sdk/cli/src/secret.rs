//! `kiln secret set|ls|rm`: a project's secrets, which jobs and batches name with `--secret
//! NAME` and get as environment variables. A value is read from stdin or a file, never from
//! the command line (where `ps` and shell history would keep it), and no command prints one.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use kiln_proto::v1 as pb;
use tabled::settings::Style;

use crate::client;
use crate::format::{self, Output, age, out};

#[derive(Debug, clap::Subcommand)]
pub enum SecretCommand {
    /// Create or replace a secret (a project maintainer's), its value read from stdin (one
    /// trailing newline dropped) or --from-file (as is). With --registry, the credentials the
    /// project's jobs pull their images with: the password or token from stdin.
    Set {
        /// An environment variable name: letters, digits and _, not starting with a digit
        /// (none with --registry).
        #[arg(required_unless_present = "registry", conflicts_with = "registry")]
        name: Option<String>,
        /// Registry credentials for this registry host, as images name it (ghcr.io,
        /// 127.0.0.1:5000, docker.io); stored as the secret `registry:<host>`.
        #[arg(long, value_name = "HOST", requires = "username")]
        registry: Option<String>,
        /// The registry's user (with --registry; `AWS` for an ECR token).
        #[arg(long, short, value_name = "USER", requires = "registry")]
        username: Option<String>,
        /// The project (default: `default`).
        #[arg(long, short)]
        project: Option<String>,
        /// Read the value from this file instead of stdin.
        #[arg(long, value_name = "FILE")]
        from_file: Option<PathBuf>,
    },
    /// List a project's secrets: names and times, never values.
    Ls {
        #[arg(long, short)]
        project: Option<String>,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Remove a secret (`registry:<host>` for a registry's credentials); jobs that name it and
    /// have not started fail to start.
    Rm {
        name: String,
        #[arg(long, short)]
        project: Option<String>,
    },
}

/// The value from the file, or stdin without its one trailing newline (`echo v | kiln secret set`).
fn read_value(from_file: Option<PathBuf>) -> Result<String> {
    if let Some(path) = from_file {
        return std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()));
    }
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprintln!("kiln: type the value, then Ctrl-D (or pipe it in, or use --from-file)");
    }
    let mut value = String::new();
    stdin
        .read_to_string(&mut value)
        .context("cannot read the value from stdin (it must be UTF-8 text)")?;
    if value.ends_with('\n') {
        value.pop();
        if value.ends_with('\r') {
            value.pop();
        }
    }
    Ok(value)
}

fn print(secrets: &[pb::Secret], output: Output) -> Result<()> {
    if output == Output::Json {
        let all: Vec<_> = secrets
            .iter()
            .map(|secret| {
                serde_json::json!({
                    "project": secret.project,
                    "name": secret.name,
                    "created_at_ms": secret.created_at_ms,
                    "updated_at_ms": secret.updated_at_ms,
                })
            })
            .collect();
        format::print_json(&all)?;
        return Ok(());
    }
    let mut builder = tabled::builder::Builder::default();
    builder.push_record(["NAME", "PROJECT", "CREATED", "UPDATED"]);
    for secret in secrets {
        builder.push_record([
            secret.name.clone(),
            secret.project.clone(),
            age(secret.created_at_ms),
            age(secret.updated_at_ms),
        ]);
    }
    out!("{}", builder.build().with(Style::blank()));
    Ok(())
}

pub async fn secret(command: SecretCommand) -> Result<ExitCode> {
    match command {
        SecretCommand::Set {
            name,
            registry,
            username,
            project,
            from_file,
        } => {
            let value = read_value(from_file)?;
            let mut clients = client::connect(&client::resolve().await?).await?;
            let request = pb::SetSecretRequest {
                project: project.unwrap_or_default(),
                name: name.unwrap_or_default(),
                value,
                registry: registry.unwrap_or_default(),
                username: username.unwrap_or_default(),
            };
            let saved = clients.secrets.set_secret(request).await?.into_inner();
            out!("secret {} set in project {}", saved.name, saved.project);
        }
        SecretCommand::Ls { project, output } => {
            let mut clients = client::connect(&client::resolve().await?).await?;
            let request = pb::ListSecretsRequest {
                project: project.unwrap_or_default(),
            };
            let listed = clients.secrets.list_secrets(request).await?.into_inner().secrets;
            print(&listed, output)?;
        }
        SecretCommand::Rm { name, project } => {
            let mut clients = client::connect(&client::resolve().await?).await?;
            let request = pb::DeleteSecretRequest {
                project: project.unwrap_or_default(),
                name,
            };
            let removed = clients.secrets.delete_secret(request).await?.into_inner();
            out!("removed secret {} from project {}", removed.name, removed.project);
        }
    }
    Ok(ExitCode::SUCCESS)
}
