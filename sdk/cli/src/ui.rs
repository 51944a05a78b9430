//! `kiln ui`: signs a browser in to the web UI as the token in use. The browser asks for the
//! login (its login page shows a code, and keeps a nonce in a cookie); the CLI approves that
//! code (`UserService.ApproveLogin`), and only that browser redeems it. A link cannot sign in
//! whoever opens it, so neither a leaked link nor one sent by someone else signs a browser in.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::{Result, bail};
use kiln_proto::v1 as pb;

use crate::client;

/// How many codes `kiln ui` asks for before it gives up.
const ATTEMPTS: usize = 3;

#[derive(Debug, clap::Args)]
pub struct UiArgs {
    /// Print the login page's URL instead of opening a browser (a remote machine, a tunnel).
    #[arg(long, conflicts_with = "approve")]
    pub print_url: bool,
    /// Approve the code a browser's login page shows, without opening or asking anything.
    #[arg(long, value_name = "CODE")]
    pub approve: Option<String>,
}

pub async fn ui(args: UiArgs) -> Result<ExitCode> {
    let credentials = client::resolve().await?;
    let mut clients = client::connect(&credentials).await?;
    if let Some(code) = &args.approve {
        approve(&mut clients, code).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if credentials.ui.is_empty() {
        bail!("no web UI address: `kiln up` writes it, or set KILN_UI_ADDR (e.g. http://127.0.0.1:7079)");
    }
    let url = format!("{}/login?via=cli", credentials.ui.trim_end_matches('/'));
    if args.print_url || !open_browser(&url) {
        if !args.print_url {
            eprintln!("no browser to open here; open this URL:");
        }
        println!("{url}");
    } else {
        eprintln!("opened the web UI's login page in your browser");
    }
    if !std::io::stdin().is_terminal() {
        eprintln!("then approve the code the page shows: kiln ui --approve CODE");
        return Ok(ExitCode::SUCCESS);
    }
    for attempt in 1..=ATTEMPTS {
        eprint!("enter the code the page shows (like BCDF-GHJK): ");
        let mut line = String::new();
        if std::io::stdin().read_line(&mut line)? == 0 {
            bail!("no code entered: approve it later with `kiln ui --approve CODE`");
        }
        let error = match approve(&mut clients, &line).await {
            Ok(()) => return Ok(ExitCode::SUCCESS),
            Err(error) => error,
        };
        match mistyped(&error) {
            Some(why) if attempt < ATTEMPTS => eprintln!("{why}"),
            _ => return Err(error),
        }
    }
    unreachable!("the last attempt returns")
}

/// Approves the login waiting for `code` and says which browser it signs in.
async fn approve(clients: &mut client::Clients, code: &str) -> Result<()> {
    let approved = clients
        .users
        .approve_login(pb::ApproveLoginRequest {
            code: code.trim().to_string(),
        })
        .await?
        .into_inner();
    let asked_secs = (kiln_core::ids::now_ms() - approved.requested_at_ms).max(0) / 1000;
    let browser = if approved.user_agent.is_empty() {
        "an unnamed browser".to_string()
    } else {
        approved.user_agent
    };
    eprintln!("approved: the browser that asked {asked_secs} s ago signs in as you ({browser})");
    Ok(())
}

/// Why a code was refused, when it may be typed again (it was mistyped or unknown).
fn mistyped(error: &anyhow::Error) -> Option<&str> {
    error
        .downcast_ref::<tonic::Status>()
        .filter(|status| matches!(status.code(), tonic::Code::InvalidArgument | tonic::Code::NotFound))
        .map(tonic::Status::message)
}

/// Opens `url` in the desktop's browser; false when there is none.
fn open_browser(url: &str) -> bool {
    ["xdg-open", "open"].iter().any(|opener| {
        std::process::Command::new(opener)
            .arg(url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })
}
