//! kiln-item-batch binary: flags → config → `kiln_item_batch::run`.

kiln_core::service_main!("item-batch", kiln_item_batch::run);
