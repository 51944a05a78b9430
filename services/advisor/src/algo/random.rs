//! Random, Sobol and Latin-hypercube search: a unit coordinate per parameter, mapped into its
//! domain ([`crate::space::Domain::from_unit`]), each a function of `(seed, index)` only.

use kiln_core::runs::RunConfig;
use rand::Rng;
use rand::seq::SliceRandom;

use super::{from_unit, trial_rng};
use crate::space::Space;

/// Independent uniform coordinates.
pub fn random(space: &Space, seed: u64, index: u64) -> RunConfig {
    let mut rng = trial_rng(seed, index);
    let draws: Vec<f64> = (0..space.params().len()).map(|_| rng.random::<f64>()).collect();
    from_unit(space, |at| draws[at])
}

/// Point `index` of the Owen-scrambled Sobol sequence (`sobol_burley`, 256 dimensions; a space
/// with more parameters draws the rest uniformly).
pub fn sobol(space: &Space, seed: u64, index: u64) -> RunConfig {
    let mut rng = trial_rng(seed, index);
    // sobol_burley takes a 32-bit index and seed; an index past u32 wraps into a new scramble.
    let (point, scramble) = (
        (index & 0xffff_ffff) as u32,
        (seed ^ (seed >> 32) ^ (index >> 32)) as u32,
    );
    from_unit(space, |at| {
        let fallback = rng.random::<f64>();
        if (at as u32) < sobol_burley::NUM_DIMENSIONS {
            f64::from(sobol_burley::sample(point, at as u32, scramble))
        } else {
            fallback
        }
    })
}

/// Point `index % trials` of Latin-hypercube design `index / trials`.
pub fn latin_hypercube(space: &Space, seed: u64, trials: u64, index: u64) -> RunConfig {
    let trials = trials.max(1);
    let (design, at_in_design) = (index / trials, index % trials);
    let mut jitter = trial_rng(seed, index);
    let coordinates: Vec<f64> = (0..space.params().len())
        .map(|dimension| {
            let mut strata: Vec<u64> = (0..trials).collect();
            // One permutation per (design, dimension), the same for every point of the design.
            let stream = design.wrapping_mul(1 << 20).wrapping_add(dimension as u64);
            strata.shuffle(&mut trial_rng(seed ^ 0x4c48_5300_0000_0000, stream));
            (strata[at_in_design as usize] as f64 + jitter.random::<f64>()) / trials as f64
        })
        .collect();
    from_unit(space, |at| coordinates[at])
}
