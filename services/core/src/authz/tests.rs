use super::*;

fn user(roles: &[(&str, Role)]) -> Principal {
    Principal {
        user_id: "u-ada".into(),
        user_name: "ada".into(),
        is_admin: false,
        scope: Scope::User,
        token_id: "t".into(),
        token_name: "cli".into(),
        roles: roles.iter().map(|(p, r)| (p.to_string(), *r)).collect(),
        job_batch_id: None,
    }
}

fn job_token(job_id: &str, batch_id: Option<&str>) -> Principal {
    Principal {
        scope: Scope::Job(job_id.into()),
        job_batch_id: batch_id.map(String::from),
        ..user(&[])
    }
}

fn job<'a>(id: &'a str, project: &'a str, owner: &'a str, batch: &'a str) -> Resource<'a> {
    Resource {
        kind: "job",
        id,
        project,
        owner_id: owner,
        job_id: id,
        batch_id: batch,
    }
}

#[test]
fn the_policy_names_every_rpc_once() {
    for method in kiln_proto::RPC_METHODS {
        let rules = POLICY.iter().filter(|rule| rule.method == *method).count();
        assert_eq!(rules, 1, "{method} needs exactly one rule in authz/policy.rs");
    }
    for rule in POLICY {
        assert!(
            kiln_proto::RPC_METHODS.contains(&rule.method),
            "{} is in the policy but is no RPC",
            rule.method
        );
    }
}

#[test]
fn roles_order_and_parse() {
    assert!(Role::Viewer < Role::Member && Role::Member < Role::Maintainer);
    for role in Role::ALL {
        assert_eq!(Role::parse(role.as_str()), Some(role));
        assert_eq!(Role::from_proto(role.to_proto() as i32), Some(role));
    }
    assert_eq!(Role::parse("owner"), None);
    assert_eq!(Role::from_proto(0), None);
}

#[test]
fn outsiders_are_told_the_object_does_not_exist() {
    let outsider = user(&[("beta", Role::Maintainer)]);
    let denied = decide(
        &outsider,
        Need::Role(Role::Viewer),
        JobAccess::Deny,
        &job("j1", "alpha", "u-bob", ""),
    );
    assert_eq!(
        denied,
        Err(Denied::NotFound {
            kind: "job",
            id: "j1".into()
        })
    );
    assert_eq!(denied.unwrap_err().to_string(), "job j1 not found");
}

#[test]
fn roles_in_the_project_decide() {
    let viewer = user(&[("alpha", Role::Viewer)]);
    let member = user(&[("alpha", Role::Member)]);
    let maintainer = user(&[("alpha", Role::Maintainer)]);
    let project = Resource::project("alpha");
    let submit = Need::Role(Role::Member);
    assert!(
        matches!(decide(&viewer, submit, JobAccess::Deny, &project), Err(Denied::PermissionDenied(m)) if m.contains("member role in project alpha") && m.contains("you are viewer"))
    );
    assert!(decide(&member, submit, JobAccess::Deny, &project).is_ok());
    assert!(decide(&maintainer, submit, JobAccess::Deny, &project).is_ok());

    let stop = Need::OwnerOr {
        owner: Role::Member,
        others: Role::Maintainer,
    };
    let own = job("j1", "alpha", "u-ada", "");
    let bobs = job("j2", "alpha", "u-bob", "");
    assert!(decide(&member, stop, JobAccess::Deny, &own).is_ok());
    assert!(
        matches!(decide(&member, stop, JobAccess::Deny, &bobs), Err(Denied::PermissionDenied(m)) if m.contains("another user's job j2"))
    );
    assert!(decide(&maintainer, stop, JobAccess::Deny, &bobs).is_ok());
    assert!(decide(&viewer, stop, JobAccess::Deny, &own).is_err());
}

#[test]
fn the_admin_may_do_anything_and_others_no_admin_thing() {
    let admin = Principal {
        is_admin: true,
        ..user(&[])
    };
    for need in [Need::Admin, Need::Role(Role::Maintainer), Need::Caller] {
        assert!(decide(&admin, need, JobAccess::Deny, &Resource::instance("quota", "global")).is_ok());
    }
    let maintainer = user(&[("alpha", Role::Maintainer)]);
    assert!(matches!(
        decide(
            &maintainer,
            Need::Role(Role::Viewer),
            JobAccess::Deny,
            &Resource::instance("quota", "global")
        ),
        Err(Denied::PermissionDenied(m)) if m.contains("admin")
    ));
    let rule = rule("/kiln.v1.UserService/CreateUser").unwrap();
    assert!(matches!(precheck(&maintainer, rule), Err(Denied::PermissionDenied(_))));
    assert!(precheck(&admin, rule).is_ok());
}

#[test]
fn a_job_token_reaches_only_its_job_or_batch() {
    let token = job_token("j1", Some("b1"));
    assert!(
        decide(
            &token,
            Need::Role(Role::Viewer),
            JobAccess::OwnJob,
            &job("j1", "alpha", "u", "")
        )
        .is_ok()
    );
    assert!(matches!(
        decide(
            &token,
            Need::Role(Role::Viewer),
            JobAccess::OwnJob,
            &job("j2", "alpha", "u", "")
        ),
        Err(Denied::NotFound { .. })
    ));
    let batch = |id| Resource {
        kind: "batch",
        id,
        project: "alpha",
        owner_id: "u",
        job_id: "",
        batch_id: id,
    };
    assert!(decide(&token, Need::Admin, JobAccess::OwnBatch, &batch("b1")).is_ok());
    assert!(decide(&token, Need::Admin, JobAccess::OwnBatch, &batch("b2")).is_err());
    assert!(decide(&job_token("j1", None), Need::Admin, JobAccess::OwnBatch, &batch("")).is_err());
    let submit = rule("/kiln.v1.JobService/SubmitJob").unwrap();
    assert!(matches!(precheck(&token, submit), Err(Denied::PermissionDenied(_))));
}

#[test]
fn listings_show_the_projects_with_the_needed_role() {
    let caller = Caller {
        principal: user(&[("alpha", Role::Viewer), ("beta", Role::Member)]),
        rule: rule("/kiln.v1.SecretService/ListSecrets").unwrap(),
    };
    assert_eq!(caller.visible_projects(), Visible::Only(vec!["beta".into()]));
    let caller = Caller {
        rule: rule("/kiln.v1.JobService/ListJobs").unwrap(),
        ..caller
    };
    assert_eq!(
        caller.visible_projects(),
        Visible::Only(vec!["alpha".into(), "beta".into()])
    );
    assert!(caller.visible_projects().contains("alpha") && !caller.visible_projects().contains("gamma"));
}

#[test]
fn references_are_a_bare_name_or_project_slash_name() {
    assert_eq!(
        ObjectRef::parse("resnet"),
        Some(ObjectRef {
            project: None,
            name: "resnet".into()
        })
    );
    let qualified = ObjectRef::parse("alpha/resnet").unwrap();
    assert_eq!(
        (qualified.project.as_deref(), qualified.name.as_str()),
        (Some("alpha"), "resnet")
    );
    for nothing in ["", "/resnet", "alpha/", "a/b/c"] {
        assert_eq!(ObjectRef::parse(nothing), None, "{nothing:?}");
    }
    // The project it writes wins over the request's; a bare name takes the request's, if any.
    assert_eq!(qualified.project_in("beta"), Some("alpha"));
    let bare = ObjectRef::parse("resnet").unwrap();
    assert_eq!(bare.project_in("beta"), Some("beta"));
    assert_eq!(bare.project_in(""), None);
}

#[test]
fn a_bare_name_is_of_the_one_readable_project_that_has_it() {
    let ada = user(&[("alpha", Role::Viewer), ("beta", Role::Member)]);
    let holders = |projects: &[&str]| projects.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    // Projects she may not read are neither chosen nor named.
    assert_eq!(ada.sole_holder(holders(&["gamma"])), Holder::None);
    assert_eq!(
        ada.sole_holder(holders(&["alpha", "gamma"])),
        Holder::One("alpha".into())
    );
    assert_eq!(
        ada.sole_holder(holders(&["gamma", "beta", "alpha"])),
        Holder::Several(vec!["alpha".into(), "beta".into()])
    );
    let admin = Principal {
        is_admin: true,
        ..user(&[])
    };
    assert_eq!(
        admin.sole_holder(holders(&["gamma", "delta"])),
        Holder::Several(vec!["delta".into(), "gamma".into()])
    );
    // A job's token reads no project this way.
    assert_eq!(job_token("j1", None).sole_holder(holders(&["alpha"])), Holder::None);
}
