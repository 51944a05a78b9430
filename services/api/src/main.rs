//! kiln-api binary: flags → config → `kiln_api::run`.

kiln_core::service_main!("api", kiln_api::run);
