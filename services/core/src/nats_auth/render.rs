//! The permission table as nats-server configuration: an `authorization` block with one NKey
//! user per service (no `no_auth_user`, so a connection without a seed is refused).

use crate::nats_auth::{Permissions, Service};

/// One user of the `authorization` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsUser {
    /// What the user is, written as a comment above it.
    pub comment: String,
    /// The NKey public key (`U…`).
    pub nkey: String,
    /// `None`: every subject (an operator's or a test harness's user, never a service's).
    pub permissions: Option<Permissions>,
}

impl NatsUser {
    /// The user of `service` with public key `nkey` and the service's permissions.
    pub fn service(service: Service, nkey: impl Into<String>) -> NatsUser {
        NatsUser {
            comment: format!("kiln-{service}"),
            nkey: nkey.into(),
            permissions: Some(service.permissions()),
        }
    }
}

fn quoted(subjects: &[String]) -> String {
    subjects
        .iter()
        .map(|subject| format!("\"{subject}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `authorization { users = [...] }` block of `users`, for a nats-server config file (or a
/// file it `include`s).
pub fn authorization_block(users: &[NatsUser]) -> String {
    let mut text = String::from(
        "# kiln's NATS users: one NKey per service, with the subjects it needs\n\
         # (rendered from kiln_core::nats_auth; regenerate rather than edit).\n\
         authorization {\n  users = [\n",
    );
    for user in users {
        text.push_str(&format!(
            "    # {}\n    {{\n      nkey: \"{}\"\n",
            user.comment, user.nkey
        ));
        if let Some(permissions) = &user.permissions {
            text.push_str(&format!(
                "      permissions: {{\n        publish: {{ allow: [{}] }}\n        subscribe: {{ allow: [{}] }}\n",
                quoted(&permissions.publish),
                quoted(&permissions.subscribe),
            ));
            if permissions.allow_responses {
                text.push_str("        allow_responses: true\n");
            }
            text.push_str("      }\n");
        }
        text.push_str("    }\n");
    }
    text.push_str("  ]\n}\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_service_is_a_user_with_its_permissions() {
        let users: Vec<NatsUser> = Service::ALL
            .into_iter()
            .map(|service| NatsUser::service(service, format!("U{}", service.name().to_uppercase())))
            .collect();
        let text = authorization_block(&users);
        assert!(!text.contains("no_auth_user"));
        assert_eq!(text.matches("nkey:").count(), Service::ALL.len());
        assert_eq!(text.matches("allow_responses: true").count(), 3, "{text}");
        assert!(text.contains("# kiln-runner\n    {\n      nkey: \"URUNNER\""), "{text}");
        assert!(text.contains("\"$JS.API.CONSUMER.*.KILN_LAUNCH.>\""), "{text}");
    }

    #[test]
    fn a_user_without_permissions_has_every_subject() {
        let text = authorization_block(&[NatsUser {
            comment: "test harness".into(),
            nkey: "UHARNESS".into(),
            permissions: None,
        }]);
        assert!(!text.contains("permissions"), "{text}");
        assert!(text.contains("nkey: \"UHARNESS\""), "{text}");
    }
}
