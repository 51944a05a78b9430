//! kiln's sweep advisor.
//!
//! - [`space`]: the `parameters:` block of a sweep spec, validated into a [`space::Space`]
//!   (floats, ints, categoricals, log scales, steps, conditional `when` parameters).
//! - [`algo`]: suggestion algorithms (random, Sobol, Latin hypercube, grid, multivariate TPE
//!   with a constant liar). Each is a pure function of `(options, space, history, index)`, so an
//!   advisor that replays its record makes the same next suggestion.
//! - [`stop`]: early stopping (ASHA with optional Hyperband brackets, median stopping), a pure
//!   decision over a trial's learning curve and its peers'.
//!
//! Values are oriented so that lower is better; the service negates `goal: maximize` objectives.

pub mod algo;
pub mod space;
pub mod stop;
