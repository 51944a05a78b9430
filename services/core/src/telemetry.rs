//! Tracing set-up, once per process: `KILN_LOG` (or `RUST_LOG`) filter, pretty or JSON lines.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Later calls (several services in one process, tests) keep the
/// first one.
pub fn init(json: bool) {
    let filter = std::env::var("KILN_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info,sqlx=warn,sea_orm=warn,async_nats=warn,h2=warn,tower=warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_writer(std::io::stderr);
    // Ignoring the error is deliberate: it only says a subscriber is already installed.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
