//! `[nats] credentials-file` against a nats-server in operator mode: the test mints an operator,
//! an account (with JetStream) and a user as NATS JWTs signed with NKeys (what `nsc` does; `nsc`
//! itself is not on the Go module proxy reachable here), writes the user's `.creds` file, and a
//! kiln connection with it reaches JetStream while one without it is refused.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use kiln_core::config::NatsConfig;
use kiln_core::testing::free_port;

/// A NATS JWT: `claims` (with `iss`, `sub`, `iat`, `jti` added) signed by `issuer`.
fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let header = serde_json::json!({"typ": "JWT", "alg": "ed25519-nkey"});
    let claims = serde_json::json!({
        "jti": kiln_core::ids::new_id(),
        "iat": kiln_core::ids::now_ms() / 1000,
        "iss": issuer.public_key(),
        "sub": subject,
        "name": name,
        "nats": nats,
    });
    let signing_input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let signature = issuer.sign(signing_input.as_bytes()).expect("sign");
    format!("{signing_input}.{}", b64(&signature))
}

struct Server {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
    creds: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn operator_mode_server() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let system = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    // JetStream needs the server's system account.
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        "kiln-test",
        serde_json::json!({"type": "operator", "version": 2, "system_account": system.public_key()}),
    );
    let unlimited = serde_json::json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": true,
        "conn": -1, "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
    });
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        "kiln",
        serde_json::json!({"limits": unlimited, "default_permissions": {"pub": {}, "sub": {}}, "type": "account", "version": 2}),
    );
    let system_jwt = jwt(
        &operator,
        &system.public_key(),
        "SYS",
        serde_json::json!({"limits": {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1}, "type": "account", "version": 2}),
    );
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "kiln-service",
        serde_json::json!({"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2}),
    );
    let creds = dir.path().join("kiln.creds");
    std::fs::write(
        &creds,
        format!(
            "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
            user.seed().unwrap()
        ),
    )
    .unwrap();
    let port = free_port();
    let config = dir.path().join("nats.conf");
    std::fs::write(
        &config,
        format!(
            "listen: \"127.0.0.1:{port}\"\njetstream {{ store_dir: \"{}\" }}\noperator: \"{operator_jwt}\"\n\
             system_account: {system_pub}\nresolver: MEMORY\n\
             resolver_preload: {{\n  {account_pub}: \"{account_jwt}\"\n  {system_pub}: \"{system_jwt}\"\n}}\n",
            dir.path().join("js").display(),
            account_pub = account.public_key(),
            system_pub = system.public_key(),
        ),
    )
    .unwrap();
    let binary = std::env::var("KILN_TEST_NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
    let child = Command::new(&binary)
        .arg("-c")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {binary} ({e}): run the tests through scripts/test.sh"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nats-server in operator mode did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server {
        child,
        url: format!("nats://127.0.0.1:{port}"),
        _dir: dir,
        creds,
    }
}

#[tokio::test]
async fn a_credentials_file_reaches_jetstream_on_an_operator_mode_server() {
    let server = operator_mode_server();
    let config = NatsConfig {
        url: server.url.clone(),
        credentials_file: Some(server.creds.clone()),
        ..NatsConfig::default()
    };
    let nats = kiln_core::streams::connect(&config)
        .await
        .expect("connect with the credentials file");
    kiln_core::streams::ensure_streams(&nats.jetstream, 1)
        .await
        .expect("JetStream through the credentials");

    // Without the credentials the server refuses the connection outright.
    let refused = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .connect(server.url.as_str())
        .await;
    assert!(refused.is_err(), "a client without credentials must be refused");
}
