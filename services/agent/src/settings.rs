//! The agent's settings, read from the environment the runner and item-batch give a worker,
//! and the endpoints of item-batch they make.

use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// Where to work and for whom: `KILN_ITEMS_ADDR` (one item-batch URL, or several separated by
/// commas: replicas, tried in turn), `KILN_TOKEN`, `KILN_BATCH_ID`, and `KILN_AGENT_SLOTS` (items
/// at once, default 1).
#[derive(Debug, Clone)]
pub struct Settings {
    pub addr: String,
    pub token: String,
    pub batch_id: String,
    pub slots: u32,
    pub tls: TlsSettings,
    /// Masks the job's secrets in items' output lines.
    pub masker: std::sync::Arc<kiln_formats::mask::Masker>,
    /// How each item's own use is measured ([`crate::measure`]); None measures the worker's
    /// children as a whole, which mixes items run side by side.
    pub measure_with: Option<crate::measure::Measurer>,
}

impl Settings {
    pub fn from_env() -> Result<Settings, String> {
        let var =
            |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set (kiln sets it in worker jobs)"));
        let slots = match std::env::var("KILN_AGENT_SLOTS") {
            Ok(text) => text
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=256).contains(n))
                .ok_or_else(|| format!("KILN_AGENT_SLOTS {text:?} must be a number from 1 to 256"))?,
            Err(_) => 1,
        };
        Ok(Settings {
            addr: var("KILN_ITEMS_ADDR")?,
            token: var("KILN_TOKEN")?,
            batch_id: var("KILN_BATCH_ID")?,
            slots,
            tls: TlsSettings::from_vars(|name| std::env::var(name).ok())?,
            masker: std::sync::Arc::new(kiln_formats::mask::Masker::from_env(|name| std::env::var(name).ok())),
            measure_with: None,
        })
    }
}

/// How `https://` item-batch addresses are reached: `KILN_CA_PEM` (PEM text; or `KILN_CA_FILE`, a
/// path) is the CA trusted instead of the system roots, and `KILN_CLIENT_CERT_PEM` with
/// `KILN_CLIENT_KEY_PEM` the client certificate for an item-batch that requires one. The runner
/// sets them from its `job-tls` (kiln-core's `tls::ENV_*` names).
#[derive(Debug, Clone, Default)]
pub struct TlsSettings {
    pub ca_pem: Option<String>,
    pub cert_pem: Option<String>,
    pub key_pem: Option<String>,
}

impl TlsSettings {
    /// Reads the settings from variables looked up by `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<TlsSettings, String> {
        let var = |name: &str| var(name).filter(|value| !value.is_empty());
        let ca_pem = match (var("KILN_CA_PEM"), var("KILN_CA_FILE")) {
            (Some(pem), _) => Some(pem),
            (None, Some(path)) => {
                Some(std::fs::read_to_string(&path).map_err(|e| format!("KILN_CA_FILE {path:?}: {e}"))?)
            }
            (None, None) => None,
        };
        let (cert_pem, key_pem) = (var("KILN_CLIENT_CERT_PEM"), var("KILN_CLIENT_KEY_PEM"));
        if cert_pem.is_some() != key_pem.is_some() {
            return Err("KILN_CLIENT_CERT_PEM and KILN_CLIENT_KEY_PEM go together: set both or neither".into());
        }
        Ok(TlsSettings {
            ca_pem,
            cert_pem,
            key_pem,
        })
    }

    /// Adds TLS to the endpoint of an `https://` address; others are left plain.
    fn apply(&self, addr: &str, endpoint: Endpoint) -> Result<Endpoint, String> {
        if !addr.starts_with("https://") {
            return Ok(endpoint);
        }
        let mut config = match &self.ca_pem {
            Some(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
            None => ClientTlsConfig::new().with_native_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.cert_pem, &self.key_pem) {
            config = config.identity(Identity::from_pem(cert, key));
        }
        endpoint
            .tls_config(config)
            .map_err(|e| format!("KILN_ITEMS_ADDR {addr:?}: cannot use TLS: {e}"))
    }
}

/// The item-batch endpoints of `KILN_ITEMS_ADDR`, in the order given.
pub(crate) fn endpoints(addrs: &str, tls: &TlsSettings) -> Result<Vec<(String, Endpoint)>, String> {
    let endpoints = addrs
        .split(',')
        .map(str::trim)
        .filter(|addr| !addr.is_empty())
        .map(|addr| {
            let endpoint = Endpoint::from_shared(addr.to_string())
                .map_err(|e| format!("KILN_ITEMS_ADDR {addr:?} is not a URL: {e}"))?
                .connect_timeout(Duration::from_secs(5))
                .tcp_nodelay(true);
            Ok((addr.to_string(), tls.apply(addr, endpoint)?))
        })
        .collect::<Result<Vec<_>, String>>()?;
    if endpoints.is_empty() {
        return Err(format!("KILN_ITEMS_ADDR {addrs:?} names no item-batch URL"));
    }
    Ok(endpoints)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_addr_may_name_several_replicas() {
        let none = TlsSettings::default();
        let parsed = endpoints("http://127.0.0.1:7075, http://127.0.0.2:7075,", &none).unwrap();
        let addrs: Vec<&str> = parsed.iter().map(|(addr, _)| addr.as_str()).collect();
        assert_eq!(addrs, ["http://127.0.0.1:7075", "http://127.0.0.2:7075"]);
        assert!(endpoints(" , ", &none).unwrap_err().contains("names no item-batch URL"));
        assert!(
            endpoints("http://ok:1,not a url", &none)
                .unwrap_err()
                .contains("\"not a url\"")
        );
    }

    #[test]
    fn client_certificate_parts_go_together() {
        let vars = |name: &str| (name == "KILN_CLIENT_CERT_PEM").then(|| "pem".to_string());
        assert!(TlsSettings::from_vars(vars).unwrap_err().contains("go together"));
        let https = TlsSettings {
            ca_pem: Some("not checked until connect".into()),
            ..TlsSettings::default()
        };
        endpoints("https://127.0.0.1:7075", &https).unwrap();
    }
}
