//! What every service binary shares: common flags, config loading, and the exit codes
//! (64 for a bad configuration, 1 for a runtime failure).

use std::fmt::{Debug, Display};
use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::config::{self, ConfigError};

/// A service's typed configuration.
pub trait ServiceConfig: Serialize + DeserializeOwned + Default + Debug {
    /// Checks every value and reports all problems at once.
    fn validate(&self) -> Result<(), ConfigError>;

    /// Completes the loaded configuration from variables outside kiln's own `KILN_*` layer
    /// (the `AWS_*` fallbacks of the object store), before `validate`.
    fn apply_env(&mut self, _env: &std::collections::HashMap<String, String>) {}
}

/// Turns a list of problems into a result.
pub fn problems_to_result(problems: Vec<String>) -> Result<(), ConfigError> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ConfigError::Invalid(problems))
    }
}

/// Flags every service binary takes.
#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// TOML configuration file (also KILN_CONFIG).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print the effective configuration (secrets masked) and exit.
    #[arg(long)]
    pub dump_config: bool,
    /// Log JSON lines instead of text.
    #[arg(long)]
    pub log_json: bool,
}

/// Loads and validates the configuration of `service` from its layers.
pub fn load_config<C: ServiceConfig>(
    service: &str,
    args: &CommonArgs,
    overrides: &impl Serialize,
) -> Result<C, ConfigError> {
    let env = config::process_env();
    let mut config: C = config::load(service, args.config.as_deref(), &env, overrides)?;
    config.apply_env(&env);
    config.validate()?;
    Ok(config)
}

/// Runs a service binary: config → tracing → runtime → `run(config, shutdown)`.
pub fn main<C, F, Fut, E>(service: &str, args: CommonArgs, overrides: &impl Serialize, run: F) -> ExitCode
where
    C: ServiceConfig,
    F: FnOnce(C, CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    let config: C = match load_config(service, &args, overrides) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("kiln-{service}: {error}");
            return ExitCode::from(64);
        }
    };
    if args.dump_config {
        println!("{config:#?}");
        return ExitCode::SUCCESS;
    }
    crate::telemetry::init(args.log_json);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("kiln-{service}: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(service, config = ?config, "starting");
    let result = runtime.block_on(async move {
        let shutdown = crate::shutdown::on_signal();
        run(config, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(service, error = %error, "stopped on error");
            ExitCode::FAILURE
        }
    }
}

/// The `--listen ADDR` flag every service takes; it overrides `grpc.listen`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ListenFlag {
    /// Address to listen on (overrides grpc.listen).
    #[arg(long)]
    pub listen: Option<std::net::SocketAddr>,
}

impl Serialize for ListenFlag {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        if let Some(listen) = self.listen {
            map.serialize_entry("grpc", &std::collections::BTreeMap::from([("listen", listen)]))?;
        }
        map.end()
    }
}

/// Writes the `main` of a service binary: common flags and `--listen`, then [`main`].
/// The binary's crate must depend on `clap`.
#[macro_export]
macro_rules! service_main {
    ($service:literal, $run:path) => {
        #[derive(clap::Parser)]
        #[command(name = concat!("kiln-", $service), about = concat!("kiln's ", $service, " service"), version)]
        struct Args {
            #[command(flatten)]
            common: $crate::service::CommonArgs,
            #[command(flatten)]
            listen: $crate::service::ListenFlag,
        }

        fn main() -> std::process::ExitCode {
            let args = <Args as clap::Parser>::parse();
            $crate::service::main($service, args.common, &args.listen, $run)
        }
    };
}
