//! Test CAs and the certificates they sign, written as PEM files (made with rcgen).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

use crate::tls::{ClientTlsConfig, ServerTlsConfig};

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// A self-signed CA whose PEM certificate is `ca_file`, signing server and client certificates
/// for `localhost` and `127.0.0.1` into its directory.
pub struct TestCa {
    pub ca_file: PathBuf,
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    /// Makes a CA named `name` and writes `<dir>/<name>-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("kiln test CA {name}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("self-signed CA");
        let ca_file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca_file, cert.pem()).expect("write the CA file");
        TestCa {
            ca_file,
            dir: dir.to_path_buf(),
            issuer: Issuer::new(params, key),
        }
    }

    /// Signs a server certificate for `localhost` and `127.0.0.1`, written as `<name>.pem`
    /// and `<name>.key`.
    pub fn server_cert(&self, name: &str) -> CertFiles {
        self.server_cert_for(name, &[])
    }

    /// Signs a server certificate for `localhost`, `127.0.0.1` and `more_names` (host names or
    /// IP addresses: the Docker bridge's gateway that containers reach the host at).
    pub fn server_cert_for(&self, name: &str, more_names: &[&str]) -> CertFiles {
        self.sign(name, ExtendedKeyUsagePurpose::ServerAuth, more_names)
    }

    /// Signs a client certificate, written as `<name>.pem` and `<name>.key`.
    pub fn client_cert(&self, name: &str) -> CertFiles {
        self.sign(name, ExtendedKeyUsagePurpose::ClientAuth, &[])
    }

    /// `[grpc.tls]` serving a new certificate of this CA, verifying client certificates against
    /// it (required when `require_client_cert`).
    pub fn server_tls(&self, name: &str, require_client_cert: bool) -> ServerTlsConfig {
        let files = self.server_cert(name);
        ServerTlsConfig {
            cert_file: Some(files.cert_file),
            key_file: Some(files.key_file),
            client_ca_file: Some(self.ca_file.clone()),
            require_client_cert,
        }
    }

    /// A client trusting this CA and presenting a new client certificate of it.
    pub fn client_tls(&self, name: &str) -> ClientTlsConfig {
        let files = self.client_cert(name);
        ClientTlsConfig {
            ca_file: Some(self.ca_file.clone()),
            cert_file: Some(files.cert_file),
            key_file: Some(files.key_file),
        }
    }

    fn sign(&self, name: &str, usage: ExtendedKeyUsagePurpose, more_names: &[&str]) -> CertFiles {
        let names = ["localhost", "127.0.0.1"]
            .iter()
            .chain(more_names)
            .map(|n| n.to_string());
        let mut params = CertificateParams::new(names.collect::<Vec<_>>()).expect("cert params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let files = CertFiles {
            cert_file: self.dir.join(format!("{name}.pem")),
            key_file: self.dir.join(format!("{name}.key")),
        };
        std::fs::write(&files.cert_file, cert.pem()).expect("write the certificate");
        std::fs::write(&files.key_file, key.serialize_pem()).expect("write the key");
        files
    }
}
