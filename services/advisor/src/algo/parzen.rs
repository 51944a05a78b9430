//! The multivariate Parzen estimator of TPE: a weighted mixture of product kernels, one per
//! observation plus a prior kernel. Numeric dimensions use truncated normals (discretised on a
//! step grid when there is one), categorical ones a smoothed point mass. A kernel's bandwidth in
//! a dimension is the larger gap to its neighbours among the observations sorted in that
//! dimension (the outermost ones use their inner gap), clipped to
//! `[range / min(100, 1 + kernels), range]`: the rule of Bergstra et al.'s hyperopt that
//! Optuna 4–5 uses in multivariate mode too.

use rand::Rng;
use rand_distr::StandardNormal;

/// One coordinate of the encoded space.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Dim {
    /// `[low, high]`; values on `low + k·step` when `step` is set (kernels then cover
    /// `[low - step/2, high + step/2]`).
    Numeric { low: f64, high: f64, step: Option<f64> },
    /// Choice number `0..n`.
    Categorical { n: usize },
}

#[derive(Debug, Clone)]
enum Kernels {
    Numeric {
        mus: Vec<f64>,
        sigmas: Vec<f64>,
        log_mass: Vec<f64>,
        /// `1 / sigma` and `−ln σ − ln √(2π) − log_mass` of each kernel, so that the density's
        /// inner loop (candidates × kernels × dimensions) has neither a division nor a log.
        inv_sigmas: Vec<f64>,
        log_norms: Vec<f64>,
        low: f64,
        high: f64,
        step: Option<f64>,
    },
    Categorical {
        log_probs: Vec<Vec<f64>>,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct Parzen {
    weights: Vec<f64>,
    log_weights: Vec<f64>,
    dims: Vec<Kernels>,
}

const LOG_SQRT_2PI: f64 = 0.918_938_533_204_672_7;

/// A standard normal has all but 1e-17 of its mass within this many σ.
const CERTAIN_Z: f64 = 8.5;

/// Terms of a log-sum-exp this far below the largest add less than half an ulp of the sum (the
/// largest term alone contributes 1 after scaling; e^-37 ≈ 8.5e-17 < 2^-53), so their `exp` is
/// skipped.
const NEGLIGIBLE: f64 = -37.0;

/// The standard normal CDF.
fn cdf(z: f64) -> f64 {
    0.5 * libm::erfc(-z / std::f64::consts::SQRT_2)
}

/// `ln(Φ(b) − Φ(a))` for `a < b`, computed on the side where it does not cancel.
fn log_mass(a: f64, b: f64) -> f64 {
    // Beyond 8.5σ on both sides Φ(b) − Φ(a) is 1 − 2e-17, which is 1.0 in f64: exactly 0.
    if a <= -CERTAIN_Z && b >= CERTAIN_Z {
        return 0.0;
    }
    let mass = if a > 0.0 { cdf(-a) - cdf(-b) } else { cdf(b) - cdf(a) };
    mass.max(f64::MIN_POSITIVE).ln()
}

impl Parzen {
    /// The estimator over `observations` (one encoded point each, weighted by `weights`) and a
    /// prior kernel of weight `prior_weight`.
    pub(crate) fn new(observations: &[Vec<f64>], weights: &[f64], dims: &[Dim], prior_weight: f64) -> Parzen {
        let n = observations.len();
        let kernels = n + 1;
        let mut raw: Vec<f64> = weights.to_vec();
        raw.push(prior_weight);
        let total: f64 = raw.iter().sum();
        let weights: Vec<f64> = raw.iter().map(|w| w / total).collect();
        let log_weights = weights.iter().map(|w| w.ln()).collect();
        let dims = dims
            .iter()
            .enumerate()
            .map(|(d, dim)| match *dim {
                Dim::Numeric { low, high, step } => {
                    let half = step.map_or(0.0, |step| step / 2.0);
                    let (a, b) = (low - half, high + half);
                    let range = b - a;
                    let (min_sigma, max_sigma) = (range / (1.0 + kernels as f64).min(100.0), range);
                    let mut mus: Vec<f64> = observations.iter().map(|x| x[d]).collect();
                    let mut sigmas: Vec<f64> = neighbour_gaps(&mus, a, b)
                        .into_iter()
                        .map(|gap| gap.clamp(min_sigma, max_sigma))
                        .collect();
                    mus.push((a + b) / 2.0);
                    sigmas.push(max_sigma);
                    let log_mass: Vec<f64> = mus
                        .iter()
                        .zip(&sigmas)
                        .map(|(mu, sigma)| log_mass((a - mu) / sigma, (b - mu) / sigma))
                        .collect();
                    let inv_sigmas = sigmas.iter().map(|sigma| 1.0 / sigma).collect();
                    let log_norms = sigmas
                        .iter()
                        .zip(&log_mass)
                        .map(|(sigma, mass)| -sigma.ln() - LOG_SQRT_2PI - mass)
                        .collect();
                    Kernels::Numeric {
                        mus,
                        sigmas,
                        log_mass,
                        inv_sigmas,
                        log_norms,
                        low,
                        high,
                        step,
                    }
                }
                Dim::Categorical { n: choices } => {
                    let smoothing = prior_weight / kernels as f64;
                    let row = |observed: Option<usize>| {
                        let mut probs = vec![smoothing; choices];
                        if let Some(at) = observed.filter(|&at| at < choices) {
                            probs[at] += 1.0;
                        }
                        let sum: f64 = probs.iter().sum();
                        probs.iter().map(|p| (p / sum).ln()).collect::<Vec<f64>>()
                    };
                    let mut log_probs: Vec<Vec<f64>> = observations.iter().map(|x| row(Some(x[d] as usize))).collect();
                    log_probs.push(row(None));
                    Kernels::Categorical { log_probs }
                }
            })
            .collect();
        Parzen {
            weights,
            log_weights,
            dims,
        }
    }

    /// `count` points drawn from the mixture.
    pub(crate) fn sample(&self, rng: &mut impl Rng, count: usize) -> Vec<Vec<f64>> {
        (0..count)
            .map(|_| {
                let mut u: f64 = rng.random();
                let kernel = self.weights.iter().position(|w| {
                    u -= w;
                    u < 0.0
                });
                let kernel = kernel.unwrap_or(self.weights.len() - 1);
                self.dims.iter().map(|dims| draw(dims, kernel, rng)).collect()
            })
            .collect()
    }

    /// The log density (probability, for discrete coordinates) of `x`.
    pub(crate) fn log_pdf(&self, x: &[f64]) -> f64 {
        let mut terms = self.log_weights.clone();
        for (dims, &value) in self.dims.iter().zip(x) {
            match dims {
                Kernels::Numeric {
                    mus,
                    inv_sigmas,
                    log_norms,
                    step: None,
                    ..
                } => {
                    for (((term, mu), inv_sigma), log_norm) in terms.iter_mut().zip(mus).zip(inv_sigmas).zip(log_norms)
                    {
                        let z = (value - mu) * inv_sigma;
                        *term += log_norm - 0.5 * z * z;
                    }
                }
                Kernels::Numeric {
                    mus,
                    sigmas,
                    log_mass: masses,
                    step: Some(step),
                    ..
                } => {
                    for (k, term) in terms.iter_mut().enumerate() {
                        let (a, b) = (
                            (value - step / 2.0 - mus[k]) / sigmas[k],
                            (value + step / 2.0 - mus[k]) / sigmas[k],
                        );
                        *term += log_mass(a, b) - masses[k];
                    }
                }
                Kernels::Categorical { log_probs } => {
                    for (k, term) in terms.iter_mut().enumerate() {
                        *term += log_probs[k].get(value as usize).copied().unwrap_or(f64::NEG_INFINITY);
                    }
                }
            }
        }
        let max = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if max == f64::NEG_INFINITY {
            return max;
        }
        let sum: f64 = terms
            .iter()
            .map(|term| term - max)
            .filter(|scaled| *scaled > NEGLIGIBLE)
            .map(f64::exp)
            .sum();
        max + sum.ln()
    }
}

/// Each point's larger gap to its neighbours in `[a, b]` (the ends of the interval count as
/// neighbours only for a lone point; the outermost points otherwise take their inner gap).
fn neighbour_gaps(points: &[f64], a: f64, b: f64) -> Vec<f64> {
    let n = points.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| points[i].total_cmp(&points[j]));
    let sorted: Vec<f64> = std::iter::once(a)
        .chain(order.iter().map(|&i| points[i]))
        .chain(std::iter::once(b))
        .collect();
    let mut gaps = vec![0.0; n];
    for (rank, &at) in order.iter().enumerate() {
        let (below, above) = (sorted[rank + 1] - sorted[rank], sorted[rank + 2] - sorted[rank + 1]);
        gaps[at] = match rank {
            _ if n < 2 => below.max(above),
            0 => above,
            _ if rank == n - 1 => below,
            _ => below.max(above),
        };
    }
    gaps
}

/// A draw of one coordinate from kernel `k`.
fn draw(dims: &Kernels, k: usize, rng: &mut impl Rng) -> f64 {
    match dims {
        Kernels::Numeric {
            mus,
            sigmas,
            low,
            high,
            step,
            ..
        } => {
            let half = step.map_or(0.0, |step| step / 2.0);
            let (a, b) = (low - half, high + half);
            // Rejection from the normal: every kernel's mean is inside [a, b], so at least half
            // of its mass is, and a draw is accepted with probability ≥ 1/2.
            let mut x = (a + b) / 2.0;
            for _ in 0..64 {
                let candidate = mus[k] + sigmas[k] * rng.sample::<f64, _>(StandardNormal);
                if (a..=b).contains(&candidate) {
                    x = candidate;
                    break;
                }
            }
            match step {
                Some(step) => (low + ((x - low) / step).round() * step).clamp(*low, *high),
                None => x.clamp(*low, *high),
            }
        }
        Kernels::Categorical { log_probs } => {
            let mut u: f64 = rng.random();
            let row = &log_probs[k];
            row.iter()
                .position(|p| {
                    u -= p.exp();
                    u < 0.0
                })
                .unwrap_or(row.len() - 1) as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::trial_rng;

    #[test]
    fn densities_integrate_to_one_and_samples_stay_inside() {
        let dims = [Dim::Numeric {
            low: 0.0,
            high: 1.0,
            step: None,
        }];
        let parzen = Parzen::new(&[vec![0.2], vec![0.9]], &[1.0, 1.0], &dims, 1.0);
        let steps = 10_000;
        let integral: f64 = (0..steps)
            .map(|i| parzen.log_pdf(&[(i as f64 + 0.5) / steps as f64]).exp() / steps as f64)
            .sum();
        assert!((integral - 1.0).abs() < 1e-3, "{integral}");
        let stepped = [
            Dim::Numeric {
                low: 1.0,
                high: 5.0,
                step: Some(1.0),
            },
            Dim::Categorical { n: 3 },
        ];
        let parzen = Parzen::new(&[vec![2.0, 1.0]], &[1.0], &stepped, 1.0);
        let total: f64 = (1..=5)
            .flat_map(|i| (0..3).map(move |c| (i, c)))
            .map(|(i, c)| parzen.log_pdf(&[i as f64, c as f64]).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-9, "{total}");
        for point in parzen.sample(&mut trial_rng(1, 2), 500) {
            assert!(
                (1.0..=5.0).contains(&point[0]) && point[0].fract() == 0.0 && point[1] < 3.0,
                "{point:?}"
            );
        }
    }
}
