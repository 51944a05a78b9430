//! Three clustered `nats-server`s for tests of what happens when one dies.

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use super::{NatsSecurity, NatsUsers, free_port, nats_server_binary, spawn_nats_server};
use crate::config::NatsConfig;
use crate::nats_auth::Service;

/// Three `nats-server`s with JetStream clustered over routes on loopback (a cluster named
/// `kiln-test-<id>`, so that routes never join two tests' clusters; servers `n0`, `n1`, `n2`, each with its own store directory and config file), for tests of
/// what happens when one dies. Every node is killed on drop.
pub struct NatsCluster {
    /// The client URLs of the three nodes, comma-separated (what `nats.url` takes).
    pub url: String,
    /// What clients need when the cluster was started with [`NatsCluster::start_secure`].
    pub security: Option<NatsSecurity>,
    /// The users it admits ([`NatsCluster::start_authorized`], and a secure cluster's).
    pub users: Option<NatsUsers>,
    nodes: Vec<ClusterNode>,
    binary: String,
    dir: tempfile::TempDir,
}

struct ClusterNode {
    port: u16,
    http_port: u16,
    config: PathBuf,
    child: Option<Child>,
}

impl NatsCluster {
    pub const SIZE: usize = 3;

    /// Starts the three nodes and waits until each is healthy: routed, with a JetStream meta
    /// leader elected.
    pub async fn start() -> NatsCluster {
        NatsCluster::start_with(None, None).await
    }

    /// Starts the three nodes admitting only the users of a new [`NatsUsers`] (each service's
    /// with its permissions, and the harness's); [`NatsCluster::config`] is the harness's.
    pub async fn start_authorized() -> NatsCluster {
        NatsCluster::start_with(None, Some(NatsUsers::new())).await
    }

    /// Starts the three nodes requiring TLS, a client certificate and an NKey user of clients,
    /// one per service (routes between the nodes stay plain on loopback); [`NatsCluster::config`]
    /// has them all, with the harness's seed.
    pub async fn start_secure() -> NatsCluster {
        NatsCluster::start_with(Some(NatsSecurity::new()), Some(NatsUsers::new())).await
    }

    async fn start_with(security: Option<NatsSecurity>, users: Option<NatsUsers>) -> NatsCluster {
        // A port free when it was picked may be taken (another process's outgoing connection)
        // before the node binds it: that node exits, and the cluster starts again on new ports.
        let (mut security, mut users) = (security, users);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let mut cluster = NatsCluster::configure(security, users);
            for index in 0..Self::SIZE {
                cluster.spawn(index);
            }
            match cluster.wait_all_healthy().await {
                Ok(()) => return cluster,
                Err(failure) if attempts < 3 => eprintln!("{failure}; starting the cluster again"),
                Err(failure) => panic!("{failure}"),
            }
            // Dropping the cluster kills its nodes; its certificates and seeds serve the next.
            (security, users) = (cluster.security.take(), cluster.users.take());
        }
    }

    /// Waits until every node is healthy; `Err` when one has exited (a port taken from under it).
    async fn wait_all_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        for index in 0..Self::SIZE {
            while !self.healthy_by(index, deadline).await {
                self.none_exited()?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        self.none_exited()
    }

    /// `Err` naming the first node that has exited, with its log.
    fn none_exited(&mut self) -> Result<(), String> {
        for index in 0..Self::SIZE {
            if let Some(Ok(Some(status))) = self.nodes[index].child.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "{} exited while starting ({status}); its log:\n{}",
                    Self::server_name(index),
                    self.log_tail(index)
                ));
            }
        }
        Ok(())
    }

    fn configure(security: Option<NatsSecurity>, users: Option<NatsUsers>) -> NatsCluster {
        let binary = nats_server_binary();
        let cluster_name = format!("kiln-test-{}", crate::ids::new_id());
        let dir = tempfile::tempdir().expect("temp dir");
        let mut ports = std::collections::BTreeSet::new();
        while ports.len() < 3 * Self::SIZE {
            ports.insert(free_port());
        }
        let ports: Vec<u16> = ports.into_iter().collect();
        let route_ports = &ports[2 * Self::SIZE..];
        let routes: Vec<String> = route_ports
            .iter()
            .map(|port| format!("\"nats-route://127.0.0.1:{port}\""))
            .collect();
        let mut nodes = Vec::new();
        for index in 0..Self::SIZE {
            let name = Self::server_name(index);
            let config = dir.path().join(format!("{name}.conf"));
            let text = format!(
                "server_name: \"{name}\"\nlisten: \"127.0.0.1:{port}\"\nhttp: \"127.0.0.1:{http}\"\n\
                 log_file: \"{log}\"\njetstream {{ store_dir: \"{store}\" }}\n\
                 cluster {{\n  name: \"{cluster_name}\"\n  listen: \"127.0.0.1:{route}\"\n  routes: [{routes}]\n}}\n{blocks}",
                port = ports[index],
                http = ports[Self::SIZE + index],
                log = dir.path().join(format!("{name}.log")).display(),
                store = dir.path().join(&name).display(),
                route = route_ports[index],
                routes = routes.join(", "),
                blocks = security.as_ref().map(NatsSecurity::tls_block).unwrap_or_default()
                    + &users.as_ref().map(NatsUsers::authorization_block).unwrap_or_default(),
            );
            std::fs::write(&config, text).expect("write a nats-server config");
            nodes.push(ClusterNode {
                port: ports[index],
                http_port: ports[Self::SIZE + index],
                config,
                child: None,
            });
        }
        let url = nodes
            .iter()
            .map(|node| format!("nats://127.0.0.1:{}", node.port))
            .collect::<Vec<_>>()
            .join(",");
        NatsCluster {
            url,
            security,
            users,
            nodes,
            binary,
            dir,
        }
    }

    /// The `server_name` of node `index`.
    pub fn server_name(index: usize) -> String {
        format!("n{index}")
    }

    /// The client URL of each node.
    pub fn urls(&self) -> Vec<String> {
        self.url.split(',').map(str::to_string).collect()
    }

    /// The monitoring URL (`http://127.0.0.1:PORT`, nats-server's `http:` port) of each node.
    pub fn monitor_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|node| format!("http://127.0.0.1:{}", node.http_port))
            .collect()
    }

    /// A configuration with every node and three replicas (and the TLS and NKey settings of a
    /// secure cluster).
    pub fn config(&self) -> NatsConfig {
        let config = NatsConfig {
            url: self.url.clone(),
            replicas: Self::SIZE,
            ..NatsConfig::default()
        };
        let config = match &self.security {
            Some(security) => security.client_config(config),
            None => config,
        };
        match &self.users {
            Some(users) => users.harness_config(config),
            None => config,
        }
    }

    /// The configuration of `service`: with its own seed when the cluster admits only its users.
    pub fn service_config(&self, service: Service) -> NatsConfig {
        match &self.users {
            Some(users) => users.service_config(service, self.config()),
            None => self.config(),
        }
    }

    /// Kills node `index` with SIGKILL (no lame duck, nothing flushed) and reaps it.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut child) = self.nodes[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts node `index` again, on the same ports with the same store, and waits until it is
    /// healthy (routed and its JetStream assets current).
    pub async fn restart(&mut self, index: usize) {
        self.kill(index);
        self.start_node(index);
        self.wait_healthy(index).await;
    }

    /// Starts node `index` (killed before) without waiting for it: a node alone cannot be
    /// healthy while the others are down.
    pub fn start_node(&mut self, index: usize) {
        if self.nodes[index].child.is_none() {
            self.spawn(index);
        }
    }

    /// Waits until node `index` says it is healthy (`/healthz`: JetStream up, a meta leader
    /// known, its streams and consumers current).
    pub async fn wait_healthy(&self, index: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.healthy_by(index, deadline).await {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether node `index` answers `/healthz` with 200; panics with its log past `deadline`.
    async fn healthy_by(&self, index: usize, deadline: Instant) -> bool {
        match healthz(self.nodes[index].http_port).await {
            Some(status) if status.contains(" 200 ") => true,
            status => {
                assert!(
                    Instant::now() < deadline,
                    "{} is not healthy ({status:?}); its log:\n{}",
                    Self::server_name(index),
                    self.log_tail(index)
                );
                false
            }
        }
    }

    /// The last lines of node `index`'s log, for a failure message (without the warnings each
    /// failed `/healthz` poll adds, which would hide the cause).
    pub fn log_tail(&self, index: usize) -> String {
        let log = self.dir.path().join(format!("{}.log", Self::server_name(index)));
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text
            .lines()
            .filter(|line| !line.contains("Healthcheck failed"))
            .collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn spawn(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        node.child = Some(spawn_nats_server(
            &self.binary,
            &[std::ffi::OsStr::new("-c"), node.config.as_os_str()],
        ));
    }
}

/// The status line of `GET /healthz` on a monitoring port, if it answers.
async fn healthz(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        stream
            .write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let response = String::from_utf8_lossy(&response);
        Some(format!("{} {}", response.lines().next()?, response.lines().last()?))
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for index in 0..self.nodes.len() {
            self.kill(index);
        }
    }
}
