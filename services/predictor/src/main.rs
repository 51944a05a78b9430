//! kiln-predictor binary: flags → config → `kiln_predictor::run`.

kiln_core::service_main!("predictor", kiln_predictor::run);
