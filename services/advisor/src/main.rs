//! kiln-advisor binary: flags → config → `kiln_advisor::run`.

kiln_core::service_main!("advisor", kiln_advisor::run);
