//! The test Docker Engine and its image, and the containers kiln labelled.

/// The Docker Engine of the tests; scripts/test.sh starts one when none runs.
pub fn docker_host() -> String {
    std::env::var("KILN_TEST_DOCKER_HOST")
        .expect("KILN_TEST_DOCKER_HOST is not set: run the tests through scripts/test.sh, which starts dockerd")
}

/// The image the docker tests run (busybox, built locally by scripts/test-image.sh).
pub fn test_image() -> String {
    std::env::var("KILN_TEST_IMAGE")
        .expect("KILN_TEST_IMAGE is not set: run the tests through scripts/test.sh, which builds it")
}

/// A client of the test Docker Engine, for checking what kiln left on it.
pub async fn docker() -> bollard::Docker {
    let host = docker_host();
    let path = host.strip_prefix("unix://").expect("a unix socket");
    bollard::Docker::connect_with_socket(path, 60, bollard::API_DEFAULT_VERSION)
        .expect("connect to the engine")
        .negotiate_version()
        .await
        .expect("negotiate")
}

/// Containers and volumes on the engine labelled with `label=value`.
pub async fn labelled(docker: &bollard::Docker, label: &str, value: &str) -> (Vec<String>, Vec<String>) {
    use std::collections::HashMap;
    let filters = HashMap::from([("label", vec![format!("{label}={value}")])]);
    let containers = docker
        .list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .expect("list containers")
        .into_iter()
        .filter_map(|c| c.id)
        .collect();
    let volumes = docker
        .list_volumes(Some(
            bollard::query_parameters::ListVolumesOptionsBuilder::new()
                .filters(&filters)
                .build(),
        ))
        .await
        .expect("list volumes")
        .volumes
        .unwrap_or_default()
        .into_iter()
        .map(|v| v.name)
        .collect();
    (containers, volumes)
}
