//! kiln-scheduler binary: flags → config → `kiln_scheduler::run`.

kiln_core::service_main!("scheduler", kiln_scheduler::run);
