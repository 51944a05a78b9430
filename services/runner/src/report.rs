//! The capacity reports to the `kiln_capacity` bucket, which the scheduler reads.

use std::time::Duration;

use kiln_core::capacity::{self, CapacityReport};
use kiln_core::ids::now_ms;
use tokio_util::sync::CancellationToken;

use crate::Context;
use crate::reconcile::republish_own;

/// Reports this runner's capacity until shutdown, and re-drives unpublished changes of its jobs.
pub(super) async fn report_capacity(ctx: Context, shutdown: CancellationToken) {
    let interval = Duration::from_millis(ctx.config.report_interval_ms);
    loop {
        report_once(&ctx).await;
        if let Err(error) = republish_own(&ctx).await {
            tracing::warn!(error = %error, "cannot re-drive unpublished changes");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// Reports this runner's capacity now (also when it is cordoned, so the scheduler stops
/// placing jobs on it before the next report is due).
pub(crate) async fn report_once(ctx: &Context) {
    if let Err(error) = capacity::report(&ctx.nats, &report_of(ctx)).await {
        tracing::warn!(error = %error, "cannot report capacity");
    }
}

/// What this runner offers now: its capacity and, on a cloud instance, what the instance is.
fn report_of(ctx: &Context) -> CapacityReport {
    let offer = ctx.provider.offer();
    let identity = ctx.identity.as_deref();
    CapacityReport {
        runner_id: ctx.config.runner_id.clone(),
        pool: ctx.config.pool.clone(),
        provider: ctx.provider.name().into(),
        cpu_millis: ctx.capacity.cpu_millis,
        memory_bytes: ctx.capacity.memory_bytes,
        gpus: i64::from(ctx.capacity.gpus),
        updated_at_ms: now_ms(),
        instance: offer
            .instance
            .map_or_else(Default::default, |instance| capacity::Instance {
                cpu_millis: instance.cpu_millis,
                memory_bytes: instance.memory_bytes,
                gpus: i64::from(instance.gpus),
            }),
        on_demand_per_hour: offer.on_demand_per_hour,
        spot_per_hour: offer.spot_per_hour,
        // On a cloud instance, spot is what the machine is; else what the provider offers.
        spot: identity.map_or(offer.spot, |identity| identity.is_spot()),
        instance_id: identity.map(|identity| identity.instance_id.clone()),
        instance_type: identity.map(|identity| identity.instance_type.clone()),
        zone: identity.map(|identity| identity.zone.clone()),
        market: identity.map(|identity| identity.market.clone()),
        price_per_hour: identity.and(ctx.config.imds.price_per_hour),
        cordoned: ctx.is_cordoned(),
    }
}
