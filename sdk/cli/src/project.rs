//! `kiln project create|ls|members|add-member|rm-member`: projects and their members in roles.

use std::process::ExitCode;

use anyhow::Result;
use kiln_proto::v1 as pb;

use crate::client;
use crate::format::{self, Output, age, out};
use crate::tenancy::{RoleArg, role_name, table};

#[derive(Debug, clap::Subcommand)]
pub enum ProjectCommand {
    /// Make a project (admin).
    Create { name: String },
    /// List the projects you are a member of (an admin: all).
    Ls {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// List a project's members.
    Members {
        name: String,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Add a member, or change their role (a maintainer of the project).
    AddMember {
        project: String,
        user: String,
        #[arg(long, value_enum)]
        role: RoleArg,
    },
    /// Remove a member (a maintainer of the project).
    RmMember { project: String, user: String },
}

pub async fn project(command: ProjectCommand) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    match command {
        ProjectCommand::Create { name } => {
            let project = clients
                .projects
                .create_project(pb::CreateProjectRequest { name })
                .await?
                .into_inner();
            out!("project {} created", project.name);
        }
        ProjectCommand::Ls { output } => {
            let projects = clients
                .projects
                .list_projects(pb::ListProjectsRequest {})
                .await?
                .into_inner()
                .projects;
            if output == Output::Json {
                let all: Vec<_> = projects
                    .iter()
                    .map(|p| serde_json::json!({"name": p.name, "role": role_name(p.role), "created_at_ms": p.created_at_ms}))
                    .collect();
                format::print_json(&all)?;
            } else {
                table(
                    &["NAME", "YOUR ROLE", "CREATED"],
                    projects
                        .iter()
                        .map(|p| vec![p.name.clone(), role_name(p.role).to_string(), age(p.created_at_ms)]),
                )?;
            }
        }
        ProjectCommand::Members { name, output } => {
            let members = clients
                .projects
                .list_members(pb::ProjectRef { name })
                .await?
                .into_inner()
                .members;
            if output == Output::Json {
                let all: Vec<_> = members
                    .iter()
                    .map(|m| serde_json::json!({"user": m.user, "role": role_name(m.role)}))
                    .collect();
                format::print_json(&all)?;
            } else {
                table(
                    &["USER", "ROLE"],
                    members
                        .iter()
                        .map(|m| vec![m.user.clone(), role_name(m.role).to_string()]),
                )?;
            }
        }
        ProjectCommand::AddMember { project, user, role } => {
            let member = clients
                .projects
                .add_member(pb::AddMemberRequest {
                    project,
                    user,
                    role: role.to_proto() as i32,
                })
                .await?
                .into_inner();
            out!(
                "{} is {} of project {}",
                member.user,
                role_name(member.role),
                member.project
            );
        }
        ProjectCommand::RmMember { project, user } => {
            clients
                .projects
                .remove_member(pb::RemoveMemberRequest {
                    project: project.clone(),
                    user: user.clone(),
                })
                .await?;
            out!("{user} removed from project {project}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
