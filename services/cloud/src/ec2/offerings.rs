//! `offerings`: the pool's types (`DescribeInstanceTypes`, cached a day) × the zones of its
//! subnets (`DescribeSubnets`) where each type is offered (`DescribeInstanceTypeOfferings`,
//! cached five minutes) × its capacity types, priced by the latest spot price
//! (`DescribeSpotPriceHistory`, refreshed every five minutes) or the on-demand table.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use tracing::warn;

use super::Ec2Config;
use super::client::{QueryClient, Resend};
use super::params::Params;
use super::prices::OnDemandTable;
use super::xml::{self, InstanceTypeInfo};
use crate::timefmt;
use crate::{CapacityType, CloudError, Offering, OfferingKey, PoolSpec, PriceSource, Shape};

/// Values per filter and ids per call: well under EC2's limits.
const CHUNK: usize = 100;

/// The sorted types and zones a cached answer covers.
type Key = (Vec<String>, Vec<String>);
/// (type, zone) → (latest spot price, when it was set in ms since the epoch).
type SpotPrices = HashMap<(String, String), (f64, i64)>;

/// What the offerings calls learned, with when; behind one lock, never held across a call.
#[derive(Default)]
pub(crate) struct OfferingCache {
    shapes: HashMap<String, (Instant, Shape)>,
    catalogue_at: Option<Instant>,
    subnet_zones: HashMap<String, String>,
    zone_offerings: HashMap<Key, (Instant, HashSet<(String, String)>)>,
    spot_prices: HashMap<Key, (Instant, SpotPrices)>,
}

pub(crate) async fn offerings(
    client: &QueryClient,
    config: &Ec2Config,
    cache: &Mutex<OfferingCache>,
    pool: &PoolSpec,
) -> Result<Vec<Offering>, CloudError> {
    if !pool.region.is_empty() && pool.region != config.region {
        return Err(CloudError::Invalid(format!(
            "pool {} is in {}, this ec2 client in {}",
            pool.name, pool.region, config.region
        )));
    }
    let subnets = subnet_zones(client, cache, &pool.subnets).await?;
    let shapes = shapes(client, config, cache, pool).await?;
    let mut zones: Vec<String> = subnets.iter().map(|(_, zone)| zone.clone()).collect();
    zones.sort();
    zones.dedup();
    let types: Vec<String> = shapes.iter().map(|(name, _)| name.clone()).collect();
    if types.is_empty() || zones.is_empty() {
        return Ok(Vec::new());
    }
    let key: Key = (types.clone(), zones.clone());
    let offered = zone_offerings(client, config, cache, &key).await?;
    let spot = if pool.capacity_types.contains(&CapacityType::Spot) {
        spot_prices(client, config, cache, &key).await?
    } else {
        HashMap::new()
    };
    let table = OnDemandTable::shipped();
    let mut out = Vec::new();
    let mut seen_zones = HashSet::new();
    for (subnet, zone) in &subnets {
        if !seen_zones.insert(zone.clone()) {
            continue; // one subnet per zone: the first the pool names
        }
        for (instance_type, shape) in &shapes {
            if !offered.contains(&(instance_type.clone(), zone.clone())) {
                continue;
            }
            for &capacity in &pool.capacity_types {
                let priced = match capacity {
                    CapacityType::Spot => spot
                        .get(&(instance_type.clone(), zone.clone()))
                        .map(|&(price, at_ms)| (price, PriceSource::SpotHistory { at_ms })),
                    CapacityType::OnDemand => match pool.on_demand_prices.get(instance_type) {
                        Some(&price) => Some((price, PriceSource::Configured)),
                        None => table.price(&config.region, instance_type).map(|price| {
                            (
                                price,
                                PriceSource::Table {
                                    dated: table.dated().to_owned(),
                                },
                            )
                        }),
                    },
                };
                let Some((price_per_hour, price_source)) = priced else {
                    warn!(pool = %pool.name, %instance_type, %zone, %capacity, "no price for an offering: left out (set on-demand-prices for types the shipped table lacks)");
                    continue;
                };
                out.push(Offering {
                    key: OfferingKey {
                        instance_type: instance_type.clone(),
                        zone: zone.clone(),
                        capacity,
                    },
                    shape: shape.clone(),
                    price_per_hour,
                    price_source,
                    subnet: Some(subnet.clone()),
                });
            }
        }
    }
    Ok(out)
}

/// (subnet, zone) in the pool's order; an unknown subnet is the pool's config error.
async fn subnet_zones(
    client: &QueryClient,
    cache: &Mutex<OfferingCache>,
    subnets: &[String],
) -> Result<Vec<(String, String)>, CloudError> {
    let missing: Vec<String> = {
        let cache = cache.lock().expect("offering cache lock");
        subnets
            .iter()
            .filter(|s| !cache.subnet_zones.contains_key(*s))
            .cloned()
            .collect()
    };
    for chunk in missing.chunks(CHUNK) {
        let mut params = Params::new("DescribeSubnets");
        params.list("SubnetId", chunk.iter().map(String::as_str));
        let body = client.call(&params, Resend::Safe).await?;
        let answer: xml::DescribeSubnetsResponse = xml::parse("DescribeSubnets", &body)?;
        let mut cache = cache.lock().expect("offering cache lock");
        for subnet in answer.subnet_set.items {
            cache.subnet_zones.insert(subnet.subnet_id, subnet.availability_zone);
        }
    }
    let cache = cache.lock().expect("offering cache lock");
    subnets
        .iter()
        .map(|subnet| match cache.subnet_zones.get(subnet) {
            Some(zone) => Ok((subnet.clone(), zone.clone())),
            None => Err(CloudError::Invalid(format!("subnet {subnet} does not exist"))),
        })
        .collect()
}

/// The pool's types and shapes, sorted by name: its `instance-types` (or the whole catalogue),
/// kept when inside its requirements.
async fn shapes(
    client: &QueryClient,
    config: &Ec2Config,
    cache: &Mutex<OfferingCache>,
    pool: &PoolSpec,
) -> Result<Vec<(String, Shape)>, CloudError> {
    let ttl = Duration::from_secs(config.types_ttl_secs);
    let fresh = |at: &Instant| at.elapsed() < ttl;
    if pool.instance_types.is_empty() {
        let stale = cache
            .lock()
            .expect("offering cache lock")
            .catalogue_at
            .is_none_or(|at| !fresh(&at));
        if stale {
            let mut params = Params::new("DescribeInstanceTypes");
            params.set("MaxResults", "100");
            let infos = describe_types(client, params).await?;
            let mut cache = cache.lock().expect("offering cache lock");
            let now = Instant::now();
            for info in infos {
                cache.shapes.insert(info.instance_type.clone(), (now, shape(&info)));
            }
            cache.catalogue_at = Some(now);
        }
    } else {
        let missing: Vec<String> = {
            let cache = cache.lock().expect("offering cache lock");
            let wanted: BTreeSet<&String> = pool.instance_types.iter().collect();
            wanted
                .into_iter()
                .filter(|t| cache.shapes.get(*t).is_none_or(|(at, _)| !fresh(at)))
                .cloned()
                .collect()
        };
        for chunk in missing.chunks(CHUNK) {
            let mut params = Params::new("DescribeInstanceTypes");
            params.list("InstanceType", chunk.iter().map(String::as_str));
            let infos = describe_types(client, params).await?;
            let mut cache = cache.lock().expect("offering cache lock");
            let now = Instant::now();
            for info in infos {
                cache.shapes.insert(info.instance_type.clone(), (now, shape(&info)));
            }
        }
    }
    let cache = cache.lock().expect("offering cache lock");
    let mut out: Vec<(String, Shape)> = if pool.instance_types.is_empty() {
        cache
            .shapes
            .iter()
            .map(|(name, (_, shape))| (name.clone(), shape.clone()))
            .collect()
    } else {
        let mut named = Vec::new();
        for name in pool.instance_types.iter().collect::<BTreeSet<_>>() {
            match cache.shapes.get(name) {
                Some((_, shape)) => named.push((name.clone(), shape.clone())),
                None => warn!(pool = %pool.name, instance_type = %name, "ec2 does not know this instance type"),
            }
        }
        named
    };
    if let Some(requirements) = &pool.requirements {
        out.retain(|(name, shape)| requirements.admits(name, shape));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

async fn describe_types(client: &QueryClient, params: Params) -> Result<Vec<InstanceTypeInfo>, CloudError> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut page = params.clone();
        if let Some(token) = &token {
            page.set("NextToken", token);
        }
        let body = client.call(&page, Resend::Safe).await?;
        let answer: xml::DescribeInstanceTypesResponse = xml::parse("DescribeInstanceTypes", &body)?;
        out.extend(answer.instance_type_set.items);
        token = xml::next_token(answer.next_token);
        if token.is_none() {
            return Ok(out);
        }
    }
}

/// vCPUs × 1000, MiB → bytes, the GPUs' count and model, and the architecture (arm64 when the
/// type supports it, else x86_64).
pub(crate) fn shape(info: &InstanceTypeInfo) -> Shape {
    let gpus = info
        .gpu_info
        .as_ref()
        .map(|g| g.gpus.items.as_slice())
        .unwrap_or_default();
    let architectures = &info.processor_info.supported_architectures.items;
    let arch = if architectures.iter().any(|a| a == "arm64") {
        "arm64"
    } else if architectures.iter().any(|a| a == "x86_64") || architectures.is_empty() {
        "x86_64"
    } else {
        architectures[0].as_str()
    };
    Shape {
        cpu_millis: info.v_cpu_info.default_v_cpus * 1000,
        memory_bytes: info.memory_info.size_in_mib * 1024 * 1024,
        gpus: gpus.iter().map(|g| g.count).sum(),
        gpu_model: gpus.first().map(|g| g.name.clone()).filter(|n| !n.is_empty()),
        arch: arch.to_owned(),
    }
}

async fn zone_offerings(
    client: &QueryClient,
    config: &Ec2Config,
    cache: &Mutex<OfferingCache>,
    key: &Key,
) -> Result<HashSet<(String, String)>, CloudError> {
    let ttl = Duration::from_secs(config.offerings_ttl_secs);
    if let Some((at, offered)) = cache.lock().expect("offering cache lock").zone_offerings.get(key)
        && at.elapsed() < ttl
    {
        return Ok(offered.clone());
    }
    let (types, zones) = key;
    let mut offered = HashSet::new();
    for chunk in types.chunks(CHUNK) {
        let mut params = Params::new("DescribeInstanceTypeOfferings");
        params
            .set("LocationType", "availability-zone")
            .filter("location", zones.iter().map(String::as_str))
            .filter("instance-type", chunk.iter().map(String::as_str))
            .set("MaxResults", "1000");
        let mut token: Option<String> = None;
        loop {
            let mut page = params.clone();
            if let Some(token) = &token {
                page.set("NextToken", token);
            }
            let body = client.call(&page, Resend::Safe).await?;
            let answer: xml::DescribeInstanceTypeOfferingsResponse =
                xml::parse("DescribeInstanceTypeOfferings", &body)?;
            offered.extend(
                answer
                    .instance_type_offering_set
                    .items
                    .into_iter()
                    .map(|o| (o.instance_type, o.location)),
            );
            token = xml::next_token(answer.next_token);
            if token.is_none() {
                break;
            }
        }
    }
    cache
        .lock()
        .expect("offering cache lock")
        .zone_offerings
        .insert(key.clone(), (Instant::now(), offered.clone()));
    Ok(offered)
}

/// The latest Linux spot price per (type, zone), and when it was set.
async fn spot_prices(
    client: &QueryClient,
    config: &Ec2Config,
    cache: &Mutex<OfferingCache>,
    key: &Key,
) -> Result<SpotPrices, CloudError> {
    let ttl = Duration::from_secs(config.spot_prices_ttl_secs);
    if let Some((at, prices)) = cache.lock().expect("offering cache lock").spot_prices.get(key)
        && at.elapsed() < ttl
    {
        return Ok(prices.clone());
    }
    let (types, zones) = key;
    let mut prices = SpotPrices::new();
    for chunk in types.chunks(CHUNK) {
        let mut params = Params::new("DescribeSpotPriceHistory");
        params
            .set("StartTime", timefmt::format_utc(SystemTime::now()))
            .list("ProductDescription", ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"])
            .list("InstanceType", chunk.iter().map(String::as_str))
            .filter("availability-zone", zones.iter().map(String::as_str))
            .set("MaxResults", "1000");
        let mut token: Option<String> = None;
        loop {
            let mut page = params.clone();
            if let Some(token) = &token {
                page.set("NextToken", token);
            }
            let body = client.call(&page, Resend::Safe).await?;
            let answer: xml::DescribeSpotPriceHistoryResponse = xml::parse("DescribeSpotPriceHistory", &body)?;
            for item in answer.spot_price_history_set.items {
                let Ok(price) = item.spot_price.trim().parse::<f64>() else {
                    continue;
                };
                let at_ms = timefmt::parse_utc(&item.timestamp).map(timefmt::millis).unwrap_or(0);
                let entry = prices
                    .entry((item.instance_type, item.availability_zone))
                    .or_insert((price, at_ms));
                if at_ms > entry.1 {
                    *entry = (price, at_ms);
                }
            }
            token = xml::next_token(answer.next_token);
            if token.is_none() {
                break;
            }
        }
    }
    cache
        .lock()
        .expect("offering cache lock")
        .spot_prices
        .insert(key.clone(), (Instant::now(), prices.clone()));
    Ok(prices)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_shapes_from_moto_instance_types() {
        let answer: xml::DescribeInstanceTypesResponse = xml::parse(
            "DescribeInstanceTypes",
            include_str!("fixtures/moto_describe_instance_types.xml"),
        )
        .expect("parses");
        let shapes: HashMap<String, Shape> = answer
            .instance_type_set
            .items
            .iter()
            .map(|i| (i.instance_type.clone(), shape(i)))
            .collect();
        let gib = 1024 * 1024 * 1024;
        assert_eq!(
            shapes["g4dn.xlarge"],
            Shape {
                cpu_millis: 4000,
                memory_bytes: 16 * gib,
                gpus: 1,
                gpu_model: Some("T4".into()),
                arch: "x86_64".into()
            }
        );
        assert_eq!(shapes["m6g.large"].arch, "arm64");
        assert_eq!(shapes["m6g.large"].gpus, 0);
        assert_eq!(shapes["m6g.large"].gpu_model, None);
        assert_eq!(shapes["m6g.large"].cpu_millis, 2000);
    }
}
