//! Properties of the job checks over generated requests: any spec is answered without a panic,
//! every valid one is accepted within the limits, and one bad field makes a refusal that
//! names it.

use std::collections::HashMap;

use kiln_core::auth::Scope;
use proptest::prelude::*;

use super::*;

fn principal() -> Principal {
    Principal {
        user_id: "u1".into(),
        user_name: "ada".into(),
        is_admin: false,
        scope: Scope::User,
        token_id: "t1".into(),
        token_name: "cli".into(),
        roles: Default::default(),
        job_batch_id: None,
    }
}

/// Text with the characters validation cares about: separators, NUL, controls, non-ASCII.
fn text(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::string::string_regex(&format!(".{{0,{max}}}")).unwrap(),
        proptest::string::string_regex(&format!("[a-z0-9=_/:@.\\-\\x00 ]{{0,{max}}}")).unwrap(),
    ]
}

fn any_spec() -> impl Strategy<Value = pb::JobSpec> {
    (
        (
            text(12),
            prop::collection::vec(text(12), 0..4),
            prop::collection::hash_map(text(8), text(8), 0..3),
        ),
        (
            prop::option::of((any::<u32>(), any::<u64>())),
            prop_oneof![text(8), "[0-9a-f]{64}"],
            text(8),
            text(12),
        ),
        (any::<u32>(), any::<u64>(), prop::collection::vec(text(8), 0..3)),
        (
            prop_oneof![Just(String::new()), Just("high".to_string()), text(6)],
            any::<i32>(),
            text(8),
        ),
    )
        .prop_map(
            |(
                (name, command, env),
                (resources, code_digest, project, image),
                (gpus, max_runtime_secs, datasets),
                (priority_class, market, pool),
            )| pb::JobSpec {
                name,
                command,
                env,
                resources: resources.map(|(cpu_millis, memory_bytes)| pb::Resources {
                    cpu_millis,
                    memory_bytes,
                    ..Default::default()
                }),
                code_digest,
                project,
                image,
                gpus,
                max_runtime_secs,
                datasets,
                priority_class,
                market,
                pool,
                // Secret names have properties of their own (kiln_core::secrets).
                secrets: Vec::new(),
                nodes: 1,
            },
        )
}

fn token() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9_-]{0,20}"
}

/// Specs a user may submit: every field within its rules (or left out).
fn valid_spec() -> impl Strategy<Value = pb::JobSpec> {
    (
        (
            prop_oneof![Just(String::new()), "[ -~]{1,128}"],
            ("[a-zA-Z0-9/._-]{1,300}", prop::collection::vec("[^\\x00]{0,40}", 0..5)),
            prop::collection::hash_map("[A-JL-Z][A-Z0-9_]{0,10}", "[^\\x00]{0,20}", 0..4),
        ),
        (
            prop::option::of((1u32.., 1u64..=i64::MAX as u64)),
            prop_oneof![Just(String::new()), "[0-9a-f]{64}"],
            prop_oneof![Just(String::new()), token()],
            prop_oneof![Just(String::new()), "[a-z0-9][a-z0-9._/-]{0,30}(:[a-z0-9._-]{1,20})?"],
        ),
        (
            0u32..=MAX_GPUS,
            0u64..=i64::MAX as u64,
            prop::collection::vec(token(), 0..3),
        ),
        (
            prop::sample::select(vec!["", "low", "normal", "high"]),
            0i32..3,
            prop_oneof![Just(String::new()), token()],
        ),
    )
        .prop_map(
            |(
                (name, (program, args), env),
                (resources, code_digest, project, image),
                (gpus, max_runtime_secs, datasets),
                (priority_class, market, pool),
            )| pb::JobSpec {
                name,
                command: std::iter::once(program).chain(args).collect(),
                env,
                resources: resources.map(|(cpu_millis, memory_bytes)| pb::Resources {
                    cpu_millis,
                    memory_bytes,
                    ..Default::default()
                }),
                code_digest,
                project,
                image,
                gpus,
                max_runtime_secs,
                datasets,
                priority_class: priority_class.to_string(),
                market,
                pool,
                // Secret names have properties of their own (kiln_core::secrets).
                secrets: Vec::new(),
                nodes: 1,
            },
        )
}

/// Breaks one field of a valid spec; returns what the refusal must name.
fn break_field(spec: &mut pb::JobSpec, which: u8) -> &'static str {
    match which {
        0 => {
            spec.command.clear();
            "command"
        }
        1 => {
            spec.command.push("a\0b".into());
            "command"
        }
        2 => {
            spec.command.push("x".repeat(MAX_COMMAND_BYTES + 1));
            "command"
        }
        3 => {
            spec.resources = Some(pb::Resources {
                cpu_millis: 0,
                memory_bytes: 1,
                ..Default::default()
            });
            "cpu_millis"
        }
        4 => {
            spec.resources = Some(pb::Resources {
                cpu_millis: 1,
                memory_bytes: u64::MAX,
                ..Default::default()
            });
            "memory_bytes"
        }
        5 => {
            spec.env = HashMap::from([("A=B".to_string(), String::new())]);
            "env"
        }
        6 => {
            spec.env = HashMap::from([("KILN_TOKEN".to_string(), String::new())]);
            "env"
        }
        7 => {
            spec.env = HashMap::from([("A".to_string(), "\0".to_string())]);
            "env"
        }
        8 => {
            spec.name = "n".repeat(MAX_NAME_CHARS + 1);
            "name"
        }
        9 => {
            spec.project = "no spaces".into();
            "project"
        }
        10 => {
            spec.code_digest = "ABC".into();
            "code_digest"
        }
        11 => {
            spec.image = "-rm".into();
            "image"
        }
        12 => {
            spec.gpus = MAX_GPUS + 1;
            "gpus"
        }
        13 => {
            spec.max_runtime_secs = u64::MAX;
            "max_runtime_secs"
        }
        14 => {
            spec.datasets.push("_hidden".into());
            "dataset"
        }
        15 => {
            spec.priority_class = "urgent".into();
            "priority class"
        }
        16 => {
            spec.market = 7;
            "market"
        }
        _ => {
            spec.pool = "a.b".into();
            "pool"
        }
    }
}

proptest! {
    #[test]
    fn any_spec_is_answered_without_a_panic(spec in prop::option::of(any_spec())) {
        match validate_spec(&principal(), spec) {
            Ok(job) => {
                prop_assert!(job.name.chars().count() <= MAX_NAME_CHARS);
                prop_assert!(job.cpu_millis > 0 && job.memory_bytes > 0);
                prop_assert!(!job.command.is_empty());
            }
            Err(error) => {
                prop_assert_eq!(error.kind(), kiln_core::ErrorKind::InvalidArgument);
                prop_assert!(!error.to_string().is_empty());
            }
        }
    }

    #[test]
    fn valid_specs_are_accepted_within_the_limits(spec in valid_spec()) {
        let job = validate_spec(&principal(), Some(spec.clone()))
            .map_err(|e| TestCaseError::fail(format!("{e}: {spec:?}")))?;
        prop_assert!(job.name.chars().count() <= MAX_NAME_CHARS);
        prop_assert_eq!(job.command, spec.command);
        prop_assert_eq!(job.env.len(), spec.env.len());
        if spec.project.is_empty() {
            prop_assert_eq!(job.project, "default");
        }
    }

    #[test]
    fn one_bad_field_is_refused_and_named(spec in valid_spec(), which in 0u8..18) {
        let mut spec = spec;
        let field = break_field(&mut spec, which);
        let error = validate_spec(&principal(), Some(spec)).unwrap_err();
        prop_assert_eq!(error.kind(), kiln_core::ErrorKind::InvalidArgument);
        prop_assert!(error.to_string().contains(field), "{} does not name {}", error, field);
    }

    #[test]
    fn submit_keys_are_printable_ascii_up_to_128(key in text(140)) {
        let valid = key.len() <= 128 && key.bytes().all(|b| b.is_ascii_graphic());
        match validate_submit_key(key) {
            Ok(_) => prop_assert!(valid),
            Err(error) => {
                prop_assert!(!valid);
                prop_assert!(error.to_string().contains("idempotency_key"));
            }
        }
    }

    #[test]
    fn dataset_names_are_tokens_that_start_with_a_letter_or_digit(name in text(70)) {
        let valid = subjects::validate_token("dataset", &name).is_ok() && !name.starts_with(['-', '_']);
        match validate_dataset_name(&name) {
            Ok(()) => prop_assert!(valid),
            Err(error) => {
                prop_assert!(!valid);
                prop_assert!(error.to_string().contains("dataset"));
            }
        }
    }
}
