//! `kiln user|token|whoami|login`: users and their tokens (projects are in `project`).
//! Commands that make a token print it alone on their last line, so scripts can take it with
//! `tail -n1`.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use kiln_proto::v1 as pb;
use tabled::settings::Style;

use crate::client::{self, Credentials};
use crate::format::{self, Output, age, out};

#[derive(Debug, clap::Subcommand)]
pub enum UserCommand {
    /// Add a user (admin); prints their first token on the last line.
    Create {
        name: String,
        /// Make them an instance admin.
        #[arg(long)]
        admin: bool,
    },
    /// List users (admin).
    Ls {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Disable a user (admin): their tokens fail at once, their queued jobs stop.
    Disable { name: String },
}

#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Make a token of yours; prints it on the last line.
    Create {
        /// A name unique among your live tokens (default: generated).
        #[arg(long)]
        name: Option<String>,
        /// Expire after this long (30d, 12h, 90m, 3600).
        #[arg(long, value_parser = format::parse_duration_secs)]
        expires: Option<u64>,
        /// Narrow the token to this project (with --role).
        #[arg(long, requires = "role")]
        project: Option<String>,
        /// The role it acts with there: viewer, member or maintainer (at most yours).
        #[arg(long, requires = "project", value_enum)]
        role: Option<RoleArg>,
    },
    /// List your tokens (live ones; --all adds revoked and expired).
    Ls {
        #[arg(long)]
        all: bool,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Revoke a token of yours by name or id (an admin: anyone's by id); every service refuses
    /// it at once.
    Revoke { token: String },
}

/// A role in a project, as the command line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RoleArg {
    Viewer,
    Member,
    Maintainer,
}

impl RoleArg {
    pub(crate) fn to_proto(self) -> pb::Role {
        match self {
            RoleArg::Viewer => pb::Role::Viewer,
            RoleArg::Member => pb::Role::Member,
            RoleArg::Maintainer => pb::Role::Maintainer,
        }
    }
}

/// Arguments of `kiln login`.
#[derive(Debug, clap::Args)]
pub struct LoginArgs {
    /// The api's address (host:port, http:// or https://).
    #[arg(long)]
    pub addr: String,
    /// log-ingest's address (default: what the api says, asked at each use).
    #[arg(long)]
    pub logs_addr: Option<String>,
    /// item-batch's address (default: what the api says).
    #[arg(long)]
    pub batch_addr: Option<String>,
    /// The advisor's address (default: what the api says).
    #[arg(long)]
    pub advisor_addr: Option<String>,
    /// The predictor's gRPC address (ServeService; default: what the api says).
    #[arg(long)]
    pub predictor_addr: Option<String>,
    /// The web UI's address (`kiln ui`; default: what the api says).
    #[arg(long)]
    pub ui_addr: Option<String>,
}

pub(crate) fn role_name(role: i32) -> &'static str {
    match pb::Role::try_from(role).unwrap_or(pb::Role::Unspecified) {
        pb::Role::Viewer => "viewer",
        pb::Role::Member => "member",
        pb::Role::Maintainer => "maintainer",
        pb::Role::Unspecified => "-",
    }
}

fn time_or_dash(ms: i64) -> String {
    if ms == 0 { "-".to_string() } else { age(ms) }
}

pub(crate) fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> Result<()> {
    let mut builder = tabled::builder::Builder::default();
    builder.push_record(header.iter().map(|h| h.to_string()));
    for row in rows {
        builder.push_record(row);
    }
    out!("{}", builder.build().with(Style::blank()));
    Ok(())
}

pub async fn user(command: UserCommand) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    match command {
        UserCommand::Create { name, admin } => {
            let created = clients
                .users
                .create_user(pb::CreateUserRequest { name, admin })
                .await?
                .into_inner();
            let user = created.user.unwrap_or_default();
            out!(
                "user {} created{}; their token:",
                user.name,
                if user.admin { " (admin)" } else { "" }
            );
            out!("{}", created.token);
        }
        UserCommand::Ls { output } => {
            let users = clients
                .users
                .list_users(pb::ListUsersRequest {})
                .await?
                .into_inner()
                .users;
            if output == Output::Json {
                let all: Vec<_> = users
                    .iter()
                    .map(|u| serde_json::json!({"name": u.name, "admin": u.admin, "disabled": u.disabled, "created_at_ms": u.created_at_ms}))
                    .collect();
                format::print_json(&all)?;
            } else {
                table(
                    &["NAME", "ADMIN", "DISABLED", "CREATED"],
                    users.iter().map(|u| {
                        vec![
                            u.name.clone(),
                            u.admin.to_string(),
                            u.disabled.to_string(),
                            age(u.created_at_ms),
                        ]
                    }),
                )?;
            }
        }
        UserCommand::Disable { name } => {
            let user = clients.users.disable_user(pb::UserRef { name }).await?.into_inner();
            out!(
                "user {} disabled: their tokens are refused and their queued jobs stopped",
                user.name
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn token(command: TokenCommand) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    match command {
        TokenCommand::Create {
            name,
            expires,
            project,
            role,
        } => {
            let request = pb::CreateTokenRequest {
                name: name.unwrap_or_default(),
                expires_in_secs: expires.unwrap_or(0),
                project: project.unwrap_or_default(),
                role: role.map_or(pb::Role::Unspecified, RoleArg::to_proto) as i32,
            };
            let created = clients.users.create_token(request).await?.into_inner();
            let token = created.token.unwrap_or_default();
            out!("token {} created (shown once):", token.name);
            out!("{}", created.secret);
        }
        TokenCommand::Ls { all, output } => {
            let tokens = clients
                .users
                .list_tokens(pb::ListTokensRequest { all })
                .await?
                .into_inner()
                .tokens;
            if output == Output::Json {
                let all: Vec<_> = tokens
                    .iter()
                    .map(|t| {
                        serde_json::json!({
                            "id": t.id, "name": t.name, "created_at_ms": t.created_at_ms,
                            "last_used_at_ms": t.last_used_at_ms, "expires_at_ms": t.expires_at_ms,
                            "revoked": t.revoked, "project": t.project, "role": role_name(t.role),
                        })
                    })
                    .collect();
                format::print_json(&all)?;
            } else {
                table(
                    &[
                        "NAME",
                        "ID",
                        "CREATED",
                        "LAST USED",
                        "EXPIRES",
                        "PROJECT",
                        "ROLE",
                        "REVOKED",
                    ],
                    tokens.iter().map(|t| {
                        vec![
                            t.name.clone(),
                            t.id.clone(),
                            age(t.created_at_ms),
                            time_or_dash(t.last_used_at_ms),
                            expires_in(t.expires_at_ms),
                            if t.project.is_empty() {
                                "-".into()
                            } else {
                                t.project.clone()
                            },
                            role_name(t.role).to_string(),
                            t.revoked.to_string(),
                        ]
                    }),
                )?;
            }
        }
        TokenCommand::Revoke { token } => {
            let revoked = clients
                .users
                .revoke_token(pb::RevokeTokenRequest { token })
                .await?
                .into_inner();
            out!("token {} ({}) revoked", revoked.name, revoked.id);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// When a token expires, from now: `in 29d`, `expired`, or `never`.
fn expires_in(expires_at_ms: i64) -> String {
    if expires_at_ms == 0 {
        return "never".into();
    }
    let left_secs = (expires_at_ms - kiln_core::ids::now_ms()) / 1000;
    if left_secs <= 0 {
        return "expired".into();
    }
    match left_secs {
        s if s < 3600 => format!("in {}m", s / 60),
        s if s < 86_400 => format!("in {}h", s / 3600),
        s => format!("in {}d", s / 86_400),
    }
}

/// Prints who the token in use is, as the api sees it.
pub async fn whoami(output: Output) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    let me = clients.node.who_am_i(pb::WhoAmIRequest {}).await?.into_inner();
    if output == Output::Json {
        let memberships: Vec<_> = me
            .memberships
            .iter()
            .map(|m| serde_json::json!({"project": m.project, "role": role_name(m.role)}))
            .collect();
        format::print_json(&serde_json::json!({
            "user": me.user, "admin": me.admin, "token": me.token_name, "job_id": me.job_id,
            "memberships": memberships,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    out!("user:     {}{}", me.user, if me.admin { " (admin)" } else { "" });
    out!("token:    {}", me.token_name);
    for member in &me.memberships {
        out!("project:  {} ({})", member.project, role_name(member.role));
    }
    Ok(ExitCode::SUCCESS)
}

/// Reads a token from stdin, checks it against the api and stores it with the addresses (and
/// the `--ca-file`/client certificate settings given) in `KILN_HOME/credentials.toml` (0600).
pub async fn login(args: LoginArgs) -> Result<ExitCode> {
    let token = read_token()?;
    let (ca_file, cert_file, key_file) = client::tls_paths();
    let credentials = Credentials {
        ca_file,
        cert_file,
        key_file,
        // Only what is given: the rest is asked of the api at each use, so a deployment that
        // moves a service needs no new login.
        logs: args.logs_addr.unwrap_or_default(),
        batches: args.batch_addr.unwrap_or_default(),
        advisor: args.advisor_addr.unwrap_or_default(),
        predictor: args.predictor_addr.unwrap_or_default(),
        ui: args.ui_addr.unwrap_or_default(),
        api: args.addr,
        token,
    };
    let mut clients = client::connect(&client::discover(&credentials).await?).await?;
    let me = clients
        .node
        .who_am_i(pb::WhoAmIRequest {})
        .await
        .context("the api refused the token")?
        .into_inner();
    let home = client::kiln_home();
    std::fs::create_dir_all(&home).with_context(|| format!("cannot create {}", home.display()))?;
    client::write_credentials(&home, &credentials)?;
    out!(
        "logged in to {} as {}; credentials in {}",
        credentials.api,
        me.user,
        client::credentials_path(&home).display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The token `kiln login` stores: the first line of stdin (never an argument, which `ps` shows).
fn read_token() -> Result<String> {
    use std::io::IsTerminal;
    if std::io::stdin().is_terminal() {
        eprintln!("paste your token (from `kiln token create` or your admin), then press enter:");
    }
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let token = line.trim().to_string();
    if token.is_empty() {
        bail!("no token on stdin: `kiln token create | tail -n1 | kiln login --addr ADDR`");
    }
    Ok(token)
}
