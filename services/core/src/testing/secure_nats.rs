//! nats-servers that only speak TLS, verify client certificates and admit one NKey user, for
//! tests of `nats.require-tls`, `tls-*` and `nkey-seed-file`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{NatsServer, TestCa, free_port, nats_server_binary, spawn_nats_server};
use crate::config::NatsConfig;

/// A CA, the servers' certificate, one client certificate and one NKey user: the `tls` and
/// `authorization` blocks of a nats-server config, and what a client needs to pass them.
pub struct NatsSecurity {
    /// The CA of the server's certificate and of the client certificate.
    pub ca: TestCa,
    /// The seed (`SU…`) of the one user the servers admit, and its public key.
    pub seed_file: PathBuf,
    pub user: String,
    server_cert: super::CertFiles,
    client_cert: super::CertFiles,
    _dir: tempfile::TempDir,
}

impl NatsSecurity {
    pub fn new() -> NatsSecurity {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = TestCa::new(dir.path(), "nats");
        let user = nkeys::KeyPair::new_user();
        let seed_file = dir.path().join("user.nk");
        std::fs::write(&seed_file, user.seed().expect("a user seed")).expect("write the seed");
        NatsSecurity {
            server_cert: ca.server_cert("nats-server"),
            client_cert: ca.client_cert("nats-client"),
            ca,
            seed_file,
            user: user.public_key(),
            _dir: dir,
        }
    }

    /// The config blocks that make a server require TLS, a client certificate and the NKey.
    pub fn server_blocks(&self) -> String {
        format!(
            "tls {{\n  cert_file: \"{cert}\"\n  key_file: \"{key}\"\n  ca_file: \"{ca}\"\n  verify: true\n  timeout: 5\n}}\n\
             authorization {{\n  users: [ {{ nkey: \"{user}\" }} ]\n}}\n",
            cert = self.server_cert.cert_file.display(),
            key = self.server_cert.key_file.display(),
            ca = self.ca.ca_file.display(),
            user = self.user,
        )
    }

    /// `config` with everything a client needs: TLS required, the CA, the client certificate
    /// and the user's seed.
    pub fn client_config(&self, config: NatsConfig) -> NatsConfig {
        NatsConfig {
            require_tls: true,
            tls_ca_file: Some(self.ca.ca_file.clone()),
            tls_cert_file: Some(self.client_cert.cert_file.clone()),
            tls_key_file: Some(self.client_cert.key_file.clone()),
            nkey_seed_file: Some(self.seed_file.clone()),
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
}

impl SecureNatsServer {
    /// Starts a server and waits until it accepts connections.
    pub fn start() -> SecureNatsServer {
        let store = tempfile::tempdir().expect("temp dir");
        let security = NatsSecurity::new();
        let port = free_port();
        let monitor_port = free_port();
        let config = store.path().join("nats.conf");
        let text = format!(
            "listen: \"127.0.0.1:{port}\"\nhttp: \"127.0.0.1:{monitor_port}\"\n\
             jetstream {{ store_dir: \"{store}\" }}\n{blocks}",
            store = store.path().join("js").display(),
            blocks = security.server_blocks(),
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
                child,
                _dir: store,
            },
            security,
        }
    }

    pub fn config(&self) -> NatsConfig {
        self.security.client_config(self.server.config())
    }
}
