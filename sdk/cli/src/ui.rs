//! `kiln ui`: opens the web UI already signed in, through a single-use login URL (valid for a
//! minute) made for the token in use, as Jupyter's tokenised URL does.

use std::process::ExitCode;

use anyhow::{Result, bail};
use kiln_proto::v1 as pb;

use crate::client;

#[derive(Debug, clap::Args)]
pub struct UiArgs {
    /// Print the login URL instead of opening a browser (it signs in once, within 60 s).
    #[arg(long)]
    pub print_url: bool,
}

pub async fn ui(args: UiArgs) -> Result<ExitCode> {
    let credentials = client::resolve()?;
    if credentials.ui.is_empty() {
        bail!("no web UI address: `kiln up` writes it, or set KILN_UI_ADDR (e.g. http://127.0.0.1:7079)");
    }
    let mut clients = client::connect(&credentials).await?;
    let code = clients
        .users
        .create_login_code(pb::CreateLoginCodeRequest {})
        .await?
        .into_inner();
    let url = format!("{}/api/v1/login/code?code={}", credentials.ui, code.code);
    if args.print_url {
        println!("{url}");
        return Ok(ExitCode::SUCCESS);
    }
    let opened = ["xdg-open", "open"].iter().any(|opener| {
        std::process::Command::new(opener)
            .arg(&url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    });
    if opened {
        eprintln!("opened the web UI in your browser");
    } else {
        eprintln!("no browser to open here; open this URL within 60 s (it signs in once):");
        println!("{url}");
    }
    Ok(ExitCode::SUCCESS)
}
