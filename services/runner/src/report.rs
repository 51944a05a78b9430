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
    let mut prices_read_at: Option<tokio::time::Instant> = None;
    loop {
        if prices_read_at.is_none_or(|at| at.elapsed() >= PRICES_REFRESH) {
            prices_read_at = Some(tokio::time::Instant::now());
            learn_prices(&ctx).await;
        }
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

/// How often a runner on a cloud instance reads its offering's prices again.
const PRICES_REFRESH: Duration = Duration::from_secs(60);

/// On a cloud instance, reads what its offering costs from its pool's status, which the
/// provisioner writes (spot prices move; on-demand ones are its table's). Nothing to do off a
/// cloud, or where no provisioner runs the pool.
pub(crate) async fn learn_prices(ctx: &Context) {
    let Some(identity) = ctx.identity.as_deref() else {
        return;
    };
    let status = match kiln_core::provisioning::status(&ctx.nats, &ctx.config.pool).await {
        Ok(Some(status)) => status,
        Ok(None) => return,
        Err(error) => {
            tracing::debug!(error = %error, "cannot read the pool's prices");
            return;
        }
    };
    let price = |capacity: &str| {
        status
            .prices
            .iter()
            .find(|p| p.instance_type == identity.instance_type && p.zone == identity.zone && p.capacity == capacity)
            .map(|p| p.price_per_hour)
    };
    if let Some(on_demand) = price("on-demand") {
        let spot = price("spot").unwrap_or(on_demand);
        *ctx.instance_prices.lock().expect("prices lock") = Some((on_demand, spot));
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
    let offer = ctx.offer();
    let identity = ctx.identity.as_deref();
    CapacityReport {
        runner_id: ctx.config.runner_id.clone(),
        pool: ctx.config.pool.clone(),
        provider: ctx.provider.name().into(),
        cpu_millis: ctx.capacity.cpu_millis,
        memory_bytes: ctx.capacity.memory_bytes,
        gpus: i64::from(ctx.capacity.gpus),
        disk_bytes: ctx.capacity.disk_bytes,
        address: ctx.config.advertise_host.clone(),
        updated_at_ms: now_ms(),
        instance: offer
            .instance
            .map_or_else(Default::default, |instance| capacity::Instance {
                cpu_millis: instance.cpu_millis,
                memory_bytes: instance.memory_bytes,
                gpus: i64::from(instance.gpus),
                disk_bytes: instance.disk_bytes,
            }),
        on_demand_per_hour: offer.on_demand_per_hour,
        spot_per_hour: offer.spot_per_hour,
        // On a cloud instance, spot is what the machine is; else what the provider offers.
        spot: identity.map_or(offer.spot, |identity| identity.is_spot()),
        instance_id: identity.map(|identity| identity.instance_id.clone()),
        instance_type: identity.map(|identity| identity.instance_type.clone()),
        zone: identity.map(|identity| identity.zone.clone()),
        market: identity.map(|identity| identity.market.clone()),
        // Unknown until configured or read from the pool's status.
        price_per_hour: identity
            .filter(|_| {
                ctx.config.imds.price_per_hour.is_some() || ctx.instance_prices.lock().expect("prices lock").is_some()
            })
            .map(|identity| {
                if identity.is_spot() {
                    offer.spot_per_hour
                } else {
                    offer.on_demand_per_hour
                }
            }),
        cordoned: ctx.is_cordoned(),
    }
}
