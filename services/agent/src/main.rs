//! kiln-agent: reads its settings from the environment (see `kiln_agent::Settings`) and works
//! until item-batch says stop (exit 0) or it is told to terminate (exit 143). As
//! `kiln-agent --measure-into FILE -- COMMAND...` it runs one item's command and measures it
//! (`kiln_agent::measure`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(kiln_agent::measure::FLAG) {
        return kiln_agent::measure::measure(&args[1..]);
    }
    let settings = match kiln_agent::Settings::from_env() {
        Ok(settings) => kiln_agent::Settings {
            measure_with: kiln_agent::measure::Measurer::here(),
            ..settings
        },
        Err(problem) => {
            eprintln!("kiln-agent: {problem}");
            return ExitCode::from(64);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("kiln-agent: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let shutdown = tokio_util::sync::CancellationToken::new();
        let signals = shutdown.clone();
        tokio::spawn(async move {
            if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                term.recv().await;
                signals.cancel();
            }
        });
        match kiln_agent::run(settings, kiln_agent::Runner::Process, shutdown).await {
            Ok(kiln_agent::Ended::Stopped(reason)) => {
                eprintln!("kiln-agent: stopping: {reason}");
                ExitCode::SUCCESS
            }
            Ok(kiln_agent::Ended::Terminated) => ExitCode::from(143),
            Err(error) => {
                eprintln!("kiln-agent: {error}");
                ExitCode::FAILURE
            }
        }
    })
}
