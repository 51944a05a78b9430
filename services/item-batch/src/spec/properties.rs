//! Properties of the batch checks over generated requests: a spec (CreateBatch) and items
//! (AddItems) are answered without a panic, valid ones are accepted, and one bad field makes a
//! refusal that names it.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::grpc::{MAX_PARAMS, MAX_URI_BYTES, check_items};

/// Text with what validation cares about: separators, braces, NUL, controls, non-ASCII.
fn text(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::string::string_regex(&format!(".{{0,{max}}}")).unwrap(),
        proptest::string::string_regex(&format!("[a-zK_=:{{}}\\x00 ]{{0,{max}}}")).unwrap(),
    ]
}

fn any_spec() -> impl Strategy<Value = pb::BatchSpec> {
    (
        (text(10), text(10), text(10), prop::collection::vec(text(10), 0..4)),
        (
            prop::collection::hash_map(text(6), text(6), 0..3),
            any::<u32>(),
            any::<u64>(),
            text(10),
        ),
        (any::<u32>(), any::<u64>(), any::<u32>(), any::<i32>(), text(8)),
        (any::<u32>(), prop::collection::vec(any_rule(), 0..3), any::<u32>()),
        (any::<u64>(), any::<u64>()),
    )
        .prop_map(
            |(
                (name, project, image, command),
                (env, cpu_millis, memory_mb, output_prefix),
                (max_attempts, item_timeout_secs, max_workers, market, pool),
                (gpus, retry_rules, slots),
                (disk_bytes, shm_bytes),
            )| pb::BatchSpec {
                name,
                project,
                image,
                command,
                env,
                cpu_millis,
                memory_mb,
                output_prefix,
                max_attempts,
                item_timeout_secs,
                max_workers,
                market,
                pool,
                // Secret names have properties of their own (kiln_core::secrets).
                secrets: Vec::new(),
                retry_rules,
                gpus,
                slots,
                disk_bytes,
                shm_bytes,
            },
        )
}

fn any_rule() -> impl Strategy<Value = pb::RetryRule> {
    (any::<i32>(), prop::collection::vec(any::<i32>(), 0..4), any::<i32>())
        .prop_map(|(on, exit_codes, action)| pb::RetryRule { on, exit_codes, action })
}

/// A rule that can match: codes only where the failure has one.
fn valid_rule() -> impl Strategy<Value = pb::RetryRule> {
    (0i32..=4, prop::collection::vec(1i32..=255, 0..4), 1i32..=2).prop_map(|(on, exit_codes, action)| {
        let coded = [
            pb::ItemFailure::Unspecified,
            pb::ItemFailure::Exit,
            pb::ItemFailure::OutOfMemory,
        ]
        .map(|f| f as i32)
        .contains(&on);
        pb::RetryRule {
            on,
            exit_codes: if coded { exit_codes } else { Vec::new() },
            action,
        }
    })
}

fn token() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9_-]{0,20}"
}

fn valid_spec() -> impl Strategy<Value = pb::BatchSpec> {
    (
        (
            "[ -~]{0,200}",
            prop_oneof![Just(String::new()), token()],
            prop_oneof![Just(String::new()), "[a-z0-9][a-z0-9._/-]{0,30}(:[a-z0-9._-]{1,20})?"],
            prop_oneof![
                prop::collection::vec(
                    prop::sample::select(vec!["sh", "-c", "cp {uri} {output}", "{{x}}", "{item}-{attempt}"]),
                    1..5
                )
                .prop_map(|args| args.into_iter().map(String::from).collect::<Vec<_>>()),
                Just(vec!["kiln:noop".to_string()]),
                (0u64..=3_600_000).prop_map(|ms| vec!["kiln:sleep".to_string(), ms.to_string()]),
            ],
        ),
        (
            prop::collection::hash_map("[A-JL-Z][A-Z0-9_]{0,8}", "[^\\x00]{0,12}", 0..3),
            any::<u32>(),
            any::<u64>(),
            prop_oneof![Just(String::new()), "s3://[a-z]{1,10}/[a-z/]{0,20}"],
        ),
        (
            0..=LARGEST_MAX_ATTEMPTS,
            any::<u64>(),
            0..=LARGEST_MAX_WORKERS,
            0i32..3,
            prop_oneof![Just(String::new()), token()],
        ),
        (
            0..=MAX_GPUS,
            prop::collection::vec(valid_rule(), 0..4),
            0..=LARGEST_SLOTS,
        ),
    )
        .prop_map(
            |(
                (name, project, image, command),
                (env, cpu_millis, memory_mb, output_prefix),
                (max_attempts, item_timeout_secs, max_workers, market, pool),
                (gpus, retry_rules, slots),
            )| pb::BatchSpec {
                name,
                project,
                image,
                command,
                env,
                cpu_millis,
                memory_mb,
                output_prefix,
                max_attempts,
                item_timeout_secs,
                max_workers,
                market,
                pool,
                // Secret names have properties of their own (kiln_core::secrets).
                secrets: Vec::new(),
                retry_rules,
                gpus,
                slots,
                // A disk needs an image; none and /dev/shm at Docker's default are always valid.
                disk_bytes: 0,
                shm_bytes: 0,
            },
        )
}

/// Breaks one field of a valid spec; returns what the refusal must name.
fn break_field(spec: &mut pb::BatchSpec, which: u8) -> &'static str {
    match which {
        0 => {
            spec.command = vec!["echo".into(), "{url}".into()];
            "command"
        }
        1 => {
            spec.command.clear();
            "command"
        }
        2 => {
            spec.name = "n".repeat(201);
            "name"
        }
        3 => {
            spec.env = HashMap::from([("KILN_X".to_string(), String::new())]);
            "env"
        }
        4 => {
            spec.env = HashMap::from([("X".to_string(), "a\0".to_string())]);
            "env"
        }
        5 => {
            spec.max_attempts = LARGEST_MAX_ATTEMPTS + 1;
            "max_attempts"
        }
        6 => {
            spec.max_workers = LARGEST_MAX_WORKERS + 1;
            "max_workers"
        }
        7 => {
            spec.pool = "a b".into();
            "pool"
        }
        8 => {
            spec.market = -1;
            "market"
        }
        9 => {
            spec.project = "a/b".into();
            "project"
        }
        10 => {
            spec.image = "--privileged".into();
            "image"
        }
        11 => {
            spec.gpus = MAX_GPUS + 1;
            "gpus"
        }
        12 => {
            spec.retry_rules.push(pb::RetryRule {
                on: pb::ItemFailure::Timeout as i32,
                exit_codes: vec![124],
                action: pb::RetryAction::Fail as i32,
            });
            "retry rule"
        }
        13 => {
            spec.slots = LARGEST_SLOTS + 1;
            "slots"
        }
        14 => {
            (spec.memory_mb, spec.slots, spec.shm_bytes) = (64, 2, 129 << 20);
            "shm_bytes"
        }
        15 => {
            spec.disk_bytes = 1 << 20;
            "disk_bytes"
        }
        _ => {
            spec.output_prefix = "x".repeat(MAX_OUTPUT_PREFIX_BYTES + 1);
            "output_prefix"
        }
    }
}

fn any_item() -> impl Strategy<Value = pb::Item> {
    (text(12), text(12), prop::collection::hash_map(text(4), text(4), 0..3)).prop_map(|(key, uri, params)| pb::Item {
        key,
        uri,
        params,
    })
}

proptest! {
    #[test]
    fn any_spec_is_answered_without_a_panic(spec in prop::option::of(any_spec())) {
        match Spec::from_proto(spec) {
            Ok(spec) => {
                prop_assert!(spec.max_attempts >= 1 && spec.max_attempts <= LARGEST_MAX_ATTEMPTS);
                prop_assert!(spec.max_workers >= 1 && spec.max_workers <= LARGEST_MAX_WORKERS);
                prop_assert!(template::validate(&spec.command).is_ok());
                prop_assert_eq!(Spec::from_json(&spec.to_json()).unwrap(), spec);
            }
            Err(error) => prop_assert_eq!(error.kind(), kiln_core::ErrorKind::InvalidArgument),
        }
    }

    #[test]
    fn valid_specs_are_accepted_with_their_defaults(given in valid_spec()) {
        let spec = Spec::from_proto(Some(given.clone())).map_err(|e| TestCaseError::fail(format!("{e}: {given:?}")))?;
        prop_assert_eq!(&spec.command, &given.command);
        prop_assert!(spec.cpu_millis > 0 && spec.memory_mb > 0 && spec.item_timeout_secs > 0);
        // What is stored reads back as the same spec.
        prop_assert_eq!(Spec::from_proto(Some(spec.to_proto())).unwrap(), spec);
    }

    #[test]
    fn one_bad_field_is_refused_and_named(spec in valid_spec(), which in 0u8..17) {
        let mut spec = spec;
        let field = break_field(&mut spec, which);
        let error = Spec::from_proto(Some(spec)).unwrap_err();
        prop_assert_eq!(error.kind(), kiln_core::ErrorKind::InvalidArgument);
        prop_assert!(error.to_string().contains(field), "{} does not name {}", error, field);
    }

    #[test]
    fn any_items_are_answered_without_a_panic(items in prop::collection::vec(any_item(), 0..6)) {
        let given = items.len();
        match check_items(items) {
            Ok(checked) => prop_assert_eq!(checked.len(), given),
            Err(error) => prop_assert!(!error.to_string().is_empty()),
        }
    }

    #[test]
    fn a_bad_item_is_refused_and_named(
        good in prop::collection::vec(("[a-z0-9/]{1,20}", "s3://b/[a-z]{1,20}"), 0..5),
        which in 0u8..4,
    ) {
        let mut items: Vec<pb::Item> = good
            .into_iter()
            .map(|(key, uri)| pb::Item { key, uri, params: HashMap::new() })
            .collect();
        prop_assert!(check_items(items.clone()).is_ok());
        let (bad, named) = match which {
            0 => (pb::Item::default(), "neither a key nor a URI"),
            1 => (pb::Item { key: "a\nb".into(), ..Default::default() }, "item key"),
            2 => (pb::Item { key: "k".into(), uri: "u".repeat(MAX_URI_BYTES + 1), ..Default::default() }, "URI"),
            _ => (
                pb::Item {
                    key: "k".into(),
                    params: (0..=MAX_PARAMS).map(|i| (i.to_string(), String::new())).collect(),
                    ..Default::default()
                },
                "parameters",
            ),
        };
        items.push(bad);
        let message = check_items(items).unwrap_err().to_string();
        prop_assert!(message.contains(named), "{} does not name {}", message, named);
    }
}
