//! kiln-log-ingest binary: flags → config → `kiln_log_ingest::run`.

kiln_core::service_main!("log-ingest", kiln_log_ingest::run);
