//! A `nats-server -js` that only speaks TLS and only admits one NKey user, for tests of
//! `nats.require-tls`, `tls-*` and `nkey-seed-file`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{NatsServer, TestCa, free_port, nats_server_binary, spawn_nats_server};
use crate::config::NatsConfig;

/// The server, its CA, and the NKey user's seed file; killed on drop like [`NatsServer`].
pub struct SecureNatsServer {
    pub server: NatsServer,
    /// The CA of the server's certificate (and of client certificates, which it verifies).
    pub ca: TestCa,
    /// The seed (`SU…`) of the one user the server admits.
    pub seed_file: PathBuf,
    /// The public key of that user.
    pub user: String,
    _certs: tempfile::TempDir,
}

impl SecureNatsServer {
    /// Starts a server that requires TLS with a client certificate of its CA and the NKey of
    /// its one user, and waits until it accepts connections.
    pub fn start() -> SecureNatsServer {
        let certs = tempfile::tempdir().expect("temp dir");
        let store = tempfile::tempdir().expect("temp dir");
        let ca = TestCa::new(certs.path(), "nats");
        let server_cert = ca.server_cert("nats-server");
        let user = nkeys::KeyPair::new_user();
        let seed_file = certs.path().join("user.nk");
        std::fs::write(&seed_file, user.seed().expect("a user seed")).expect("write the seed");
        let port = free_port();
        let monitor_port = free_port();
        let config = certs.path().join("nats.conf");
        let text = format!(
            "listen: \"127.0.0.1:{port}\"\nhttp: \"127.0.0.1:{monitor_port}\"\n\
             jetstream {{ store_dir: \"{store}\" }}\n\
             tls {{\n  cert_file: \"{cert}\"\n  key_file: \"{key}\"\n  ca_file: \"{ca}\"\n  verify: true\n  timeout: 5\n}}\n\
             authorization {{\n  users: [ {{ nkey: \"{user}\" }} ]\n}}\n",
            store = store.path().display(),
            cert = server_cert.cert_file.display(),
            key = server_cert.key_file.display(),
            ca = ca.ca_file.display(),
            user = user.public_key(),
        );
        std::fs::write(&config, text).expect("write a nats-server config");
        let binary = nats_server_binary();
        let child = spawn_nats_server(&binary, &[std::ffi::OsStr::new("-c"), config.as_os_str()]);
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
            ca,
            seed_file,
            user: user.public_key(),
            _certs: certs,
        }
    }

    /// Everything a client needs: the CA, a client certificate and the user's seed.
    pub fn config(&self) -> NatsConfig {
        let client = self.ca.client_cert("nats-client");
        NatsConfig {
            url: self.server.url.clone(),
            require_tls: true,
            tls_ca_file: Some(self.ca.ca_file.clone()),
            tls_cert_file: Some(client.cert_file),
            tls_key_file: Some(client.key_file),
            nkey_seed_file: Some(self.seed_file.clone()),
            ..NatsConfig::default()
        }
    }
}
