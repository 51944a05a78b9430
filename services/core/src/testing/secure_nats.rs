//! nats-servers that only speak TLS, verify client certificates and admit the NKey users of
//! [`NatsUsers`] (one per service, and the harness's), for tests of `nats.require-tls`, `tls-*`
//! and `nkey-seed-file`.

use std::time::{Duration, Instant};

use super::{NatsServer, NatsUsers, TestCa, free_port, nats_server_binary, spawn_nats_server};
use crate::config::NatsConfig;
use crate::nats_auth::Service;

/// A CA, the servers' certificate and one client certificate: the `tls` block of a nats-server
/// config, and what a client needs to pass it.
pub struct NatsSecurity {
    /// The CA of the server's certificate and of the client certificate.
    pub ca: TestCa,
    server_cert: super::CertFiles,
    client_cert: super::CertFiles,
    _dir: tempfile::TempDir,
}

impl NatsSecurity {
    pub fn new() -> NatsSecurity {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = TestCa::new(dir.path(), "nats");
        NatsSecurity {
            server_cert: ca.server_cert("nats-server"),
            client_cert: ca.client_cert("nats-client"),
            ca,
            _dir: dir,
        }
    }

    /// The config block that makes a server require TLS and a client certificate.
    pub fn tls_block(&self) -> String {
        format!(
            "tls {{\n  cert_file: \"{cert}\"\n  key_file: \"{key}\"\n  ca_file: \"{ca}\"\n  verify: true\n  timeout: 5\n}}\n",
            cert = self.server_cert.cert_file.display(),
            key = self.server_cert.key_file.display(),
            ca = self.ca.ca_file.display(),
        )
    }

    /// `config` with the TLS a client needs: TLS required, the CA, the client certificate.
    pub fn client_config(&self, config: NatsConfig) -> NatsConfig {
        NatsConfig {
            require_tls: true,
            tls_ca_file: Some(self.ca.ca_file.clone()),
            tls_cert_file: Some(self.client_cert.cert_file.clone()),
            tls_key_file: Some(self.client_cert.key_file.clone()),
            ..config
        }
    }
}

impl Default for NatsSecurity {
    fn default() -> Self {
        NatsSecurity::new()
    }
}

/// One such server, killed on drop like [`NatsServer`].
pub struct SecureNatsServer {
    pub server: NatsServer,
    pub security: NatsSecurity,
    pub users: NatsUsers,
}

impl SecureNatsServer {
    /// Starts a server and waits until it accepts connections.
    pub fn start() -> SecureNatsServer {
        let store = tempfile::tempdir().expect("temp dir");
        let security = NatsSecurity::new();
        let users = NatsUsers::new();
        let port = free_port();
        let monitor_port = free_port();
        let config = store.path().join("nats.conf");
        let text = format!(
            "listen: \"127.0.0.1:{port}\"\nhttp: \"127.0.0.1:{monitor_port}\"\n\
             jetstream {{ store_dir: \"{store}\" }}\n{blocks}",
            store = store.path().join("js").display(),
            blocks = security.tls_block() + &users.authorization_block(),
        );
        std::fs::write(&config, text).expect("write a nats-server config");
        let child = spawn_nats_server(&nats_server_binary(), &[std::ffi::OsStr::new("-c"), config.as_os_str()]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not start on port {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        SecureNatsServer {
            server: NatsServer {
                url: format!("tls://127.0.0.1:{port}"),
                monitor_port,
                users: None,
                child,
                _dir: store,
            },
            security,
            users,
        }
    }

    /// The harness's configuration (TLS and a seed with every subject).
    pub fn config(&self) -> NatsConfig {
        self.users
            .harness_config(self.security.client_config(self.server.config()))
    }

    /// The configuration of `service` (TLS and its own seed).
    pub fn service_config(&self, service: Service) -> NatsConfig {
        self.users.service_config(service, self.config())
    }
}
