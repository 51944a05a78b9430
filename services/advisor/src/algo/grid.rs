//! Grid search: every combination of the parameters' grid values, the last parameter varying
//! fastest. A conditional parameter multiplies only the combinations where it is active, so each
//! distinct config comes exactly once.

use kiln_core::runs::RunConfig;

use crate::space::Space;

/// Parameters some `when` names, parents first; the rest are the leaves.
fn split(space: &Space) -> (Vec<usize>, Vec<usize>) {
    let is_parent = |at: usize| {
        space
            .params()
            .iter()
            .any(|param| param.when.contains_key(&space.params()[at].name))
    };
    space.order().iter().partition(|&&at| is_parent(at))
}

/// Combinations of the leaves active under `config`.
fn leaves(space: &Space, leaves: &[usize], config: &RunConfig) -> u64 {
    leaves
        .iter()
        .filter(|&&at| space.is_active(&space.params()[at].name, config))
        .map(|&at| space.params()[at].domain.grid_len().unwrap_or(0))
        .fold(1u64, u64::saturating_mul)
}

/// Configs completing `config` over `parents` (then the leaves).
fn count(space: &Space, parents: &[usize], rest: &[usize], config: &mut RunConfig) -> u64 {
    let Some((&first, others)) = parents.split_first() else {
        return leaves(space, rest, config);
    };
    let param = &space.params()[first];
    if !space.is_active(&param.name, config) {
        return count(space, others, rest, config);
    }
    let mut total = 0u64;
    for k in 0..param.domain.grid_len().unwrap_or(0) {
        config.insert(param.name.clone(), param.domain.grid_value(k));
        total = total.saturating_add(count(space, others, rest, config));
    }
    config.remove(&param.name);
    total
}

/// The number of configs of the grid; `None` when a float has no grid.
pub fn size(space: &Space) -> Option<u64> {
    if space.params().iter().any(|param| param.domain.grid_len().is_none()) {
        return None;
    }
    let (parents, rest) = split(space);
    Some(count(space, &parents, &rest, &mut RunConfig::new()))
}

/// Config number `index` of the grid; `None` past its end (or when a float has no grid).
pub fn point(space: &Space, mut index: u64) -> Option<RunConfig> {
    if index >= size(space)? {
        return None;
    }
    let (parents, rest) = split(space);
    let mut config = RunConfig::new();
    for (position, &at) in parents.iter().enumerate() {
        let param = &space.params()[at];
        if !space.is_active(&param.name, &config) {
            continue;
        }
        for k in 0..param.domain.grid_len()? {
            config.insert(param.name.clone(), param.domain.grid_value(k));
            let block = count(space, &parents[position + 1..], &rest, &mut config);
            if index < block {
                break;
            }
            index -= block;
        }
    }
    let active: Vec<usize> = rest
        .iter()
        .copied()
        .filter(|&at| space.is_active(&space.params()[at].name, &config))
        .collect();
    for &at in active.iter().rev() {
        let domain = &space.params()[at].domain;
        let len = domain.grid_len()?;
        config.insert(space.params()[at].name.clone(), domain.grid_value(index % len));
        index /= len;
    }
    Some(config)
}
