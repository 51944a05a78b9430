//! kiln-provisioner binary: flags → config → `kiln_provisioner::run`.

kiln_core::service_main!("provisioner", kiln_provisioner::run);
