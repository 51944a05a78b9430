//! kiln-runner binary: flags → config → `kiln_runner::run`.

kiln_core::service_main!("runner", kiln_runner::run);
