//! Private images: a project's registry credentials (`kiln secret set --registry`) pull its
//! jobs' images from a real registry (Debian's `docker-registry` with htpasswd and TLS), and
//! only its jobs': a job of another project is refused by the registry even once the image
//! sits in the engine's cache, and a wrong password fails with the registry's reason.
//! A registry a runner names in `[ecr]` is pulled with the ECR token of its instance role (moto's
//! ECR, the role's keys served by AEMM), for a project without credentials of its own.

use kiln_core::testing::{Aemm, AemmInstance};
use kiln_e2e::{Stack, docker, registry::Registry, spec, test_image};
use kiln_proto::v1 as pb;
use tonic::Code;

const PASSWORD: &str = "reg-pass-8d1f3a-secret";

async fn set_registry(
    stack: &Stack,
    project: &str,
    registry: &str,
    username: &str,
    password: &str,
) -> Result<pb::Secret, tonic::Status> {
    let request = pb::SetSecretRequest {
        project: project.into(),
        registry: registry.into(),
        username: username.into(),
        value: password.into(),
        ..Default::default()
    };
    Ok(stack.secrets().await.set_secret(request).await?.into_inner())
}

async fn run_in(stack: &Stack, project: &str, image: &str) -> pb::Job {
    let mut job_spec = spec(&["sh", "-c", "echo pulled and running; env"]);
    job_spec.project = project.into();
    job_spec.image = image.into();
    let job = stack.submit_spec(job_spec).await;
    stack
        .wait_for(&job.id, "the job's end", |job| {
            job.state == pb::JobState::Succeeded as i32 || job.state == pb::JobState::Failed as i32
        })
        .await
}

#[tokio::test]
async fn a_private_image_is_pulled_with_its_projects_credentials_and_no_other_projects_job_gets_it() {
    let registry = Registry::start("trainer", PASSWORD);
    let stack = Stack::start_docker().await;
    for project in ["vision", "audio", "speech"] {
        stack.create_project(project).await;
    }
    let engine = docker().await;
    let unique = kiln_core::ids::new_id().to_lowercase().replace('-', "");
    let image = registry
        .push_unique(&engine, &test_image(), "team/trainer", &unique)
        .await;

    // Bad requests say what to give.
    for (registry_host, username, why) in [
        ("GHCR.io", "u", "not a registry host"),
        ("ghcr.io/team", "u", "not a registry host"),
        (registry.host.as_str(), "", "need a username"),
    ] {
        let refused = set_registry(&stack, "vision", registry_host, username, PASSWORD)
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains(why), "{refused:?}");
    }
    let saved = set_registry(&stack, "vision", &registry.host, "trainer", PASSWORD)
        .await
        .unwrap();
    assert_eq!(saved.name, format!("registry:{}", registry.host));
    set_registry(&stack, "speech", &registry.host, "trainer", "not-the-password")
        .await
        .unwrap();
    let listed = stack
        .secrets()
        .await
        .list_secrets(pb::ListSecretsRequest {
            project: "vision".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        listed.secrets.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        [saved.name.as_str()]
    );

    // vision's job pulls the image with vision's credentials; they never reach the job.
    let pulled = run_in(&stack, "vision", &image).await;
    assert_eq!(pulled.state, pb::JobState::Succeeded as i32, "{pulled:?}");
    let lines = stack.log_lines(&pulled.id, false).await;
    let text: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
    assert!(text.contains(&"pulled and running"), "{text:?}");
    assert!(
        !text.iter().any(|line| line.contains(PASSWORD)),
        "the job saw the password: {text:?}"
    );

    // audio has no credentials: the registry refuses it, though the engine now has the image.
    assert!(
        engine.inspect_image(&image).await.is_ok(),
        "the image is in the engine's cache"
    );
    let refused = run_in(&stack, "audio", &image).await;
    assert_eq!(refused.state, pb::JobState::Failed as i32, "{refused:?}");
    assert!(
        refused.reason.contains("project audio has no credentials for registry")
            && refused
                .reason
                .contains(&format!("kiln secret set --registry {}", registry.host)),
        "{refused:?}"
    );

    // speech's password is wrong: the registry's refusal, and what to do.
    let wrong = run_in(&stack, "speech", &image).await;
    assert_eq!(wrong.state, pb::JobState::Failed as i32, "{wrong:?}");
    assert!(
        wrong
            .reason
            .contains("refused project speech's credentials (user trainer)"),
        "{wrong:?}"
    );
    assert!(!wrong.reason.contains("not-the-password"), "{wrong:?}");

    // The control: without vision's grant tag on the cached image (the protection), audio's
    // job runs vision's private image from the cache.
    let tags = engine
        .inspect_image(&image)
        .await
        .unwrap()
        .repo_tags
        .unwrap_or_default();
    let grants: Vec<&String> = tags.iter().filter(|tag| tag.starts_with("kiln-grant-")).collect();
    assert_eq!(grants.len(), 1, "one grant, vision's: {tags:?}");
    assert!(grants[0].starts_with("kiln-grant-vision:"), "{tags:?}");
    engine
        .remove_image(grants[0], None::<bollard::query_parameters::RemoveImageOptions>, None)
        .await
        .unwrap();
    let leaked = run_in(&stack, "audio", &image).await;
    assert_eq!(leaked.state, pb::JobState::Succeeded as i32, "{leaked:?}");
    engine
        .remove_image(&image, None::<bollard::query_parameters::RemoveImageOptions>, None)
        .await
        .unwrap();
}

/// The password moto's ECR gives account 123456789012 (`AWS:<account>-auth-token`).
const MOTO_ECR_PASSWORD: &str = "123456789012-auth-token";

#[tokio::test]
async fn a_registry_named_in_ecr_is_pulled_with_the_instance_roles_token() {
    // A registry that takes ECR's token (user AWS) and nothing else, the image pushed to it.
    let registry = Registry::start("AWS", MOTO_ECR_PASSWORD);
    let engine = docker().await;
    let unique = kiln_core::ids::new_id().to_lowercase().replace('-', "");
    let image = registry.push_unique(&engine, &test_image(), "team/ecr", &unique).await;
    assert!(engine.inspect_image(&image).await.is_err(), "only the registry has it");
    // The instance's metadata serves the credentials of a role moto knows (moto checks every
    // signature); the runner names the registry in `[ecr]`.
    let cloud = kiln_cloud::testing::cloud_env();
    let aemm = Aemm::start_with_role(AemmInstance::spot(), Some(cloud.role.clone()));
    let mut stack = Stack::start_without_runner().await;
    let runner = kiln_runner::Config {
        imds: kiln_runner::metadata::ImdsConfig {
            endpoint: aemm.endpoint.clone(),
            ..Default::default()
        },
        ecr: kiln_runner::ecr::EcrConfig {
            registries: vec![registry.host.clone()],
            endpoint: cloud.endpoint.clone(),
            region: cloud.region.clone(),
        },
        ..stack.docker_runner_config(&stack.docker_runner_id())
    };
    stack.runner = Some(stack.spawn_runner(runner).await);
    stack.create_project("vision").await;

    // vision has no credentials of its own: the pull goes with the role's token.
    let pulled = run_in(&stack, "vision", &image).await;
    assert_eq!(pulled.state, pb::JobState::Succeeded as i32, "{pulled:?}");
    let lines = stack.log_lines(&pulled.id, false).await;
    assert!(
        !lines.iter().any(|line| line.text.contains(MOTO_ECR_PASSWORD)),
        "the job saw the token"
    );

    // The control: the registry refuses the same pull with another password.
    engine
        .remove_image(&image, None::<bollard::query_parameters::RemoveImageOptions>, None)
        .await
        .unwrap();
    let options = bollard::query_parameters::CreateImageOptionsBuilder::new()
        .from_image(&image)
        .build();
    let wrong = bollard::auth::DockerCredentials {
        username: Some("AWS".into()),
        password: Some("not-the-token".into()),
        serveraddress: Some(registry.host.clone()),
        ..Default::default()
    };
    let mut pull = engine.create_image(Some(options), None, Some(wrong));
    let mut refused = None;
    while let Some(step) = futures::StreamExt::next(&mut pull).await {
        match step {
            Err(error) => refused = Some(error.to_string()),
            Ok(step) => refused = refused.or(step.error_detail.and_then(|detail| detail.message)),
        }
    }
    let refused = refused.expect("a pull with another password is refused");
    assert!(refused.contains("unauthorized"), "{refused}");
}
