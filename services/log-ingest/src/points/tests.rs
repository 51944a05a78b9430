//! The sampler's buckets, and its properties over any steps (the extremes of i64 included).

use super::*;

fn sampled(points: &[(i64, f64)], max_points: usize) -> Series {
    let lo = points.iter().map(|p| p.0).min().unwrap();
    let hi = points.iter().map(|p| p.0).max().unwrap();
    let mut sampler = Sampler::new(lo, hi, max_points);
    for &(step, value) in points {
        sampler.add(step, value, step * 10);
    }
    sampler.finish("job", "loss")
}

fn steps(series: &Series) -> Vec<i64> {
    series.points.iter().map(|p| p.step).collect()
}

#[test]
fn a_short_series_comes_back_whole_in_step_order() {
    let series = sampled(&[(3, 0.3), (1, 0.1), (2, f64::NAN)], 3);
    assert_eq!(series.total, 3);
    assert_eq!(steps(&series), vec![1, 2, 3]);
    assert!(series.points[1].value.is_nan());
    assert_eq!(series.points[2].timestamp_ms, 30);
}

#[test]
fn each_bucket_gives_its_lowest_and_highest_and_nan_only_where_nothing_else() {
    // Four buckets of 25 steps: a spike in the first, NaN mixed into the second, only NaN
    // in the third.
    let points: Vec<(i64, f64)> = (0..100)
        .map(|step| match step {
            7 => (step, 1e9),
            30 | 31 => (step, f64::NAN),
            50..75 => (step, f64::NAN),
            _ => (step, step as f64),
        })
        .collect();
    let series = sampled(&points, 8);
    assert_eq!(series.total, 100);
    let first: Vec<(i64, f64)> = series.points.iter().take(2).map(|p| (p.step, p.value)).collect();
    assert_eq!(first, vec![(0, 0.0), (7, 1e9)]);
    let second: Vec<i64> = series
        .points
        .iter()
        .filter(|p| (25..50).contains(&p.step))
        .map(|p| p.step)
        .collect();
    assert_eq!(
        second,
        vec![25, 49],
        "NaN is neither the lowest nor the highest of a bucket with numbers"
    );
    let third: Vec<&Point> = series.points.iter().filter(|p| (50..75).contains(&p.step)).collect();
    assert_eq!(third.len(), 1, "a bucket of NaN alone gives one NaN point");
    assert!(third[0].value.is_nan());
    assert!(series.points.len() <= 8);
}

#[test]
fn one_point_asked_gives_the_highest() {
    let series = sampled(&[(0, 5.0), (1, 9.0), (2, 1.0)], 1);
    assert_eq!(series.points.iter().map(|p| p.value).collect::<Vec<_>>(), vec![9.0]);
    assert_eq!(series.total, 3);
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    fn step() -> impl Strategy<Value = i64> {
        prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(0), -1000i64..1000, any::<i64>()]
    }

    proptest! {
        /// Any steps (a job chooses them): no overflow, the count is right, the points are
        /// some of those given, in step order, and no more than asked for.
        #[test]
        fn any_series_samples_within_its_bounds(
            points in prop::collection::vec((step(), any::<f64>()), 1..200),
            max_points in 1usize..50,
        ) {
            let lo = points.iter().map(|p| p.0).min().unwrap();
            let hi = points.iter().map(|p| p.0).max().unwrap();
            let mut sampler = Sampler::new(lo, hi, max_points);
            for &(step, value) in &points {
                sampler.add(step, value, 0);
            }
            let series = sampler.finish("job", "loss");
            prop_assert_eq!(series.total, points.len() as u64);
            prop_assert!(series.points.len() <= max_points, "{} points for {}", series.points.len(), max_points);
            let sampled = steps(&series);
            prop_assert!(sampled.windows(2).all(|pair| pair[0] < pair[1]));
            prop_assert!(sampled.iter().all(|step| points.iter().any(|p| p.0 == *step)));
            // Each kept step carries a value given at that step.
            for point in &series.points {
                prop_assert!(points.iter().any(|p| p.0 == point.step && p.1.to_bits() == point.value.to_bits()));
            }
        }
    }
}

#[test]
fn bands_give_each_bucket_its_lowest_highest_and_last_value() {
    // Four buckets of 25 steps, points given out of order: a spike in the first, NaN mixed into
    // the second and last in the third, only NaN in the fourth.
    let mut points: Vec<(i64, f64)> = (0..100)
        .map(|step| match step {
            7 => (step, 1e9),
            30 | 74 => (step, f64::NAN),
            75..100 => (step, f64::NAN),
            _ => (step, -(step as f64)),
        })
        .collect();
    points.reverse();
    let bands = sampled(&points, 8).bands;
    assert_eq!(bands.len(), 4);
    assert_eq!(bands.iter().map(|b| b.step).collect::<Vec<_>>(), vec![24, 49, 74, 99]);
    assert_eq!(bands[0].timestamp_ms, 240);
    assert_eq!((bands[0].min, bands[0].max, bands[0].last), (-24.0, 1e9, -24.0));
    assert_eq!((bands[1].min, bands[1].max, bands[1].last), (-49.0, -25.0, -49.0));
    assert_eq!((bands[2].min, bands[2].max), (-73.0, -50.0));
    assert!(bands[2].last.is_nan(), "the last value is the last point's, NaN or not");
    assert!(bands[3].min.is_nan() && bands[3].max.is_nan() && bands[3].last.is_nan());
}
