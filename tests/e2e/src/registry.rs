//! A private container registry for the tests: Debian's `docker-registry` (the CNCF
//! distribution server, `KILN_TEST_REGISTRY`) on 127.0.0.1 with TLS from a throw-away CA
//! (`scripts/test-ca.sh`) and one htpasswd user (bcrypt, from `KILN_TEST_HTPASSWD`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bollard::auth::DockerCredentials;
use futures::StreamExt;

/// A running registry, killed on drop.
pub struct Registry {
    /// `127.0.0.1:<port>`: the host images name.
    pub host: String,
    pub username: String,
    pub password: String,
    child: Child,
    _dir: tempfile::TempDir,
}

fn tool(var: &str, package: &str) -> String {
    let path = std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} is not set: run the tests through scripts/test.sh (Debian's {package})"));
    assert!(
        Path::new(&path).try_exists().unwrap_or(false),
        "{var}={path} is missing: apt-get install {package}"
    );
    path
}

impl Registry {
    /// Starts a registry that admits `username` with `password`, and waits until it answers.
    pub fn start(username: &str, password: &str) -> Registry {
        let binary = tool("KILN_TEST_REGISTRY", "docker-registry");
        let htpasswd = tool("KILN_TEST_HTPASSWD", "apache2-utils");
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/test-ca.sh");
        let made = Command::new("bash")
            .args([ca, &dir.path().join("tls").display().to_string(), "127.0.0.1"])
            .status()
            .expect("run scripts/test-ca.sh");
        assert!(made.success(), "scripts/test-ca.sh failed");
        let hashed = Command::new(&htpasswd)
            .args(["-Bbn", username, password])
            .output()
            .expect("run htpasswd");
        assert!(hashed.status.success(), "htpasswd failed");
        std::fs::write(dir.path().join("htpasswd"), hashed.stdout).unwrap();
        let port = kiln_core::testing::free_port();
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n\
             http:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {root}/tls/server.pem\n    key: {root}/tls/server.key\n\
             auth:\n  htpasswd:\n    realm: kiln-test\n    path: {root}/htpasswd\n",
            root = dir.path().display()
        );
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(&binary)
            .arg("serve")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let host = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&host).is_err() {
            assert!(
                Instant::now() < deadline,
                "docker-registry did not listen on {host}: {}",
                std::fs::read_to_string(dir.path().join("registry.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry {
            host,
            username: username.into(),
            password: password.into(),
            child,
            _dir: dir,
        }
    }

    fn credentials(&self) -> DockerCredentials {
        DockerCredentials {
            username: Some(self.username.clone()),
            password: Some(self.password.clone()),
            serveraddress: Some(self.host.clone()),
            ..Default::default()
        }
    }

    /// Makes an image of its own from `base` (a new id: a label of `unique` added), pushes it
    /// to this registry as `<host>/<repository>:<tag>` and removes it from the engine, so the
    /// next use pulls it. Returns the reference.
    pub async fn push_unique(&self, docker: &bollard::Docker, base: &str, repository: &str, unique: &str) -> String {
        use bollard::query_parameters::{
            CommitContainerOptionsBuilder, CreateContainerOptionsBuilder, PushImageOptionsBuilder,
            RemoveContainerOptionsBuilder, RemoveImageOptionsBuilder,
        };
        let name = format!("{}/{repository}", self.host);
        let body = bollard::models::ContainerCreateBody {
            image: Some(base.into()),
            cmd: Some(vec!["true".into()]),
            ..Default::default()
        };
        let options = CreateContainerOptionsBuilder::new()
            .name(&format!("kiln-push-{unique}"))
            .build();
        let container = docker.create_container(Some(options), body).await.unwrap().id;
        let options = CommitContainerOptionsBuilder::new()
            .container(&container)
            .repo(&name)
            .tag(unique)
            .changes(&format!("LABEL kiln.test.unique={unique}"))
            .build();
        docker
            .commit_container(options, bollard::models::ContainerConfig::default())
            .await
            .expect("commit the image");
        docker
            .remove_container(
                &container,
                Some(RemoveContainerOptionsBuilder::new().force(true).build()),
            )
            .await
            .unwrap();
        let options = PushImageOptionsBuilder::new().tag(unique).build();
        let mut push = docker.push_image(&name, Some(options), Some(self.credentials()));
        while let Some(step) = push.next().await {
            let step = step.expect("push the image");
            assert!(step.error_detail.is_none(), "push failed: {step:?}");
        }
        let reference = format!("{name}:{unique}");
        docker
            .remove_image(&reference, Some(RemoveImageOptionsBuilder::new().build()), None)
            .await
            .expect("remove the pushed image from the engine");
        reference
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
