//! The jobs' firewall: iptables rules that confine jobs to kiln's job endpoints, for containers
//! on the jobs' network ([`rules`]) and for isolated process jobs ([`UidFirewall`]).
//!
//! Containers: two chains see a job's packets. Traffic to another machine, to another container (other
//! networks, or published ports DNATed to one) and to the instance metadata address is
//! forwarded: `DOCKER-USER`, which the engine jumps to from `FORWARD` before its own rules.
//! Traffic to one of the host's own addresses (the gateway, where loopback services of kiln are
//! reached) is delivered locally: `INPUT`, matched on the jobs' bridge interface.
//!
//! In `DOCKER-USER`, for sources in the jobs' subnet, top down: drop 169.254.169.254; accept
//! replies; accept the allowed endpoints (a remote address and port, or a port of the host that
//! the engine DNATed to a container: compose's published ports, which the engine's own
//! isolation between networks would drop further on); let DNS through; reject the blocked
//! ranges; everything else (the internet) goes on to the engine's rules. In
//! `INPUT`, for packets in from the jobs' bridge: accept replies and the host's allowed ports,
//! reject the rest.
//!
//! Every rule carries the comment `kiln:<network>`; on start the runner keeps the rules when
//! they are all there and nothing else carries the comment, and otherwise deletes every rule
//! with the comment and inserts the set again, so restarts never pile up duplicates. Each rule
//! is checked with `iptables -C` afterwards. `iptables` runs as a program with its arguments
//! (never through a shell), with `-w` so it waits for the xtables lock.

use std::net::Ipv4Addr;

use crate::error::{Error, Result};

mod uid;
pub use uid::{UidFirewall, remove_uid_chain, uid_chain, uid_chain_rules};

/// The chain the engine jumps to from `FORWARD` before its own rules.
pub const DOCKER_USER: &str = "DOCKER-USER";
pub const INPUT: &str = "INPUT";
/// Where locally made packets are judged (process jobs').
pub const OUTPUT: &str = "OUTPUT";
/// Where cloud instances' credentials are served.
pub const METADATA_ADDRESS: &str = "169.254.169.254/32";
/// The same over IPv6 (EC2's IPv6 metadata endpoint).
pub const METADATA_ADDRESS_V6: &str = "fd00:ec2::254/128";

/// The jobs' network as the firewall needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobNetwork {
    pub name: String,
    /// The bridge interface on the host.
    pub bridge: String,
    /// IPv4 subnet, `a.b.c.d/n`.
    pub subnet: String,
    /// The host's address on the bridge.
    pub gateway: String,
}

/// A TCP endpoint jobs may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Endpoint {
    /// A port of the runner's host (reached at the gateway; possibly published by a container).
    Host { port: u16 },
    /// Another machine's address.
    Remote { ip: Ipv4Addr, port: u16 },
}

/// One rule: its chain and its match and target, comment included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub chain: &'static str,
    pub args: Vec<String>,
}

/// The comment that marks the rules of a network.
pub fn comment(network: &str) -> String {
    format!("kiln:{network}")
}

/// The host and port of `host:port` or of a URL (its scheme's default port when it names none).
pub fn host_and_port(endpoint: &str) -> Option<(String, u16)> {
    if endpoint.contains("://") {
        let url = reqwest::Url::parse(endpoint).ok()?;
        let host = url.host_str()?.trim_matches(['[', ']']).to_string();
        return Some((host, url.port_or_known_default()?));
    }
    let (host, port) = endpoint.rsplit_once(':')?;
    (!host.is_empty()).then_some(())?;
    Some((host.to_string(), port.parse().ok()?))
}

/// Whether a host names the runner's own machine as a loopback address (jobs reach it at the
/// gateway: see the provider's `reachable`).
pub fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host == "0.0.0.0"
        || host == "::1"
        || host.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// Parses `a.b.c.d/n` (or an address alone, as /32) into its network address and prefix.
pub fn parse_cidr(text: &str) -> Option<(Ipv4Addr, u8)> {
    let (address, prefix) = match text.split_once('/') {
        Some((address, prefix)) => (address, prefix.parse().ok()?),
        None => (text, 32),
    };
    (prefix <= 32).then_some(())?;
    Some((address.parse().ok()?, prefix))
}

/// The endpoints of the given URLs and `host:port`s; names other than loopback ones are
/// resolved now (their IPv4 addresses).
pub async fn resolve_endpoints(endpoints: &[String]) -> Result<Vec<Endpoint>> {
    let mut resolved = Vec::new();
    for endpoint in endpoints.iter().flat_map(|list| list.split(',')).map(str::trim) {
        if endpoint.is_empty() {
            continue;
        }
        let (host, port) = host_and_port(endpoint).ok_or_else(|| Error::Firewall {
            message: format!("{endpoint:?} names no host and port"),
        })?;
        if is_loopback(&host) {
            resolved.push(Endpoint::Host { port });
            continue;
        }
        let addresses = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|error| Error::Firewall {
                message: format!("cannot resolve {host} (of the job endpoint {endpoint:?}): {error}"),
            })?;
        for address in addresses {
            if let std::net::IpAddr::V4(ip) = address.ip() {
                resolved.push(Endpoint::Remote { ip, port });
            }
        }
    }
    resolved.sort();
    resolved.dedup();
    Ok(resolved)
}

/// The rule set of a network, top down per chain.
pub fn rules(network: &JobNetwork, endpoints: &[Endpoint], blocked_ranges: &[String]) -> Vec<Rule> {
    let marker = comment(&network.name);
    // The words of a rule (none has a space of its own), and its comment.
    let rule = |chain: &'static str, text: String| {
        let mut args: Vec<String> = text.split_whitespace().map(str::to_string).collect();
        args.extend(["-m", "comment", "--comment", marker.as_str()].map(str::to_string));
        Rule { chain, args }
    };
    let subnet = network.subnet.as_str();
    let bridge = network.bridge.as_str();
    let mut rules = vec![
        rule(DOCKER_USER, format!("-s {subnet} -d {METADATA_ADDRESS} -j DROP")),
        rule(
            DOCKER_USER,
            format!("-s {subnet} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
        ),
    ];
    for endpoint in endpoints {
        rules.push(match *endpoint {
            // A port of the host that the engine DNATs to a container (compose's published
            // ports) is forwarded with its original destination port.
            Endpoint::Host { port } => rule(
                DOCKER_USER,
                format!("-s {subnet} -p tcp -m conntrack --ctstate DNAT --ctorigdstport {port} -j ACCEPT"),
            ),
            Endpoint::Remote { ip, port } => rule(
                DOCKER_USER,
                format!("-s {subnet} -d {ip}/32 -p tcp --dport {port} -j ACCEPT"),
            ),
        });
    }
    // Name resolution: a cloud's resolver lives in a private range (the VPC's .2 address).
    for protocol in ["udp", "tcp"] {
        rules.push(rule(
            DOCKER_USER,
            format!("-s {subnet} -p {protocol} --dport 53 -j RETURN"),
        ));
    }
    for range in blocked_ranges {
        rules.push(rule(
            DOCKER_USER,
            format!("-s {subnet} -d {range} -j REJECT --reject-with icmp-port-unreachable"),
        ));
    }
    rules.push(rule(
        INPUT,
        format!("-i {bridge} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
    ));
    for endpoint in endpoints {
        rules.push(match *endpoint {
            Endpoint::Host { port } => rule(INPUT, format!("-i {bridge} -p tcp --dport {port} -j ACCEPT")),
            // A remote name that resolves to one of the host's own addresses.
            Endpoint::Remote { ip, port } => {
                rule(INPUT, format!("-i {bridge} -d {ip}/32 -p tcp --dport {port} -j ACCEPT"))
            }
        });
    }
    rules.push(rule(
        INPUT,
        format!("-i {bridge} -j REJECT --reject-with icmp-port-unreachable"),
    ));
    rules
}

/// Where a program is: a path as given; a bare name in PATH, else in /usr/sbin or /sbin, where
/// Debian puts iptables and which a service's PATH may lack.
fn locate(program: &str) -> std::path::PathBuf {
    if program.contains('/') {
        return program.into();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(std::path::PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| program.into())
}

/// Runs `<program> -w 10 <args>` (`program`: `docker.iptables`); its stderr is the error.
async fn iptables(program: &str, args: &[&str]) -> std::result::Result<String, String> {
    let output = tokio::process::Command::new(locate(program))
        .args(["-w", "10"])
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|error| format!("cannot run {program} ({error}); install it (Debian: apt-get install iptables)"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim().to_string())
    }
}

fn failed(what: &str) -> impl FnOnce(String) -> Error + '_ {
    move |message| Error::Firewall {
        message: format!("{what}: {message}"),
    }
}

/// Makes `DOCKER-USER` when the engine has not (yet), jumped to first from `FORWARD`.
async fn ensure_docker_user(program: &str) -> Result<()> {
    if iptables(program, &["-n", "-L", DOCKER_USER]).await.is_err() {
        iptables(program, &["-N", DOCKER_USER])
            .await
            .map_err(failed("cannot create the DOCKER-USER chain"))?;
    }
    if iptables(program, &["-C", "FORWARD", "-j", DOCKER_USER]).await.is_err() {
        iptables(program, &["-I", "FORWARD", "1", "-j", DOCKER_USER])
            .await
            .map_err(failed("cannot jump from FORWARD to DOCKER-USER"))?;
    }
    Ok(())
}

/// The rules of `chain` marked with the network's comment, as `iptables -S` prints them.
async fn marked(program: &str, chain: &str, network: &str) -> Result<Vec<Vec<String>>> {
    let listing = iptables(program, &["-S", chain])
        .await
        .map_err(failed(&format!("cannot list {chain}")))?;
    let marker = comment(network);
    Ok(listing
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(|word| word.trim_matches('"').to_string())
                .collect::<Vec<_>>()
        })
        .filter(|words| words.first().map(String::as_str) == Some("-A") && words.contains(&marker))
        .collect())
}

async fn present(program: &str, rule: &Rule) -> bool {
    let mut args = vec!["-C", rule.chain];
    args.extend(rule.args.iter().map(String::as_str));
    iptables(program, &args).await.is_ok()
}

/// Deletes every rule marked with the network's comment; returns how many there were.
pub async fn remove(program: &str, network: &str) -> Result<usize> {
    let mut removed = 0;
    for chain in [DOCKER_USER, INPUT] {
        if chain == DOCKER_USER && iptables(program, &["-n", "-L", DOCKER_USER]).await.is_err() {
            continue;
        }
        for words in marked(program, chain, network).await? {
            let mut args = vec!["-D"];
            args.extend(words.iter().skip(1).map(String::as_str));
            iptables(program, &args)
                .await
                .map_err(failed(&format!("cannot delete a stale rule of {chain}")))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Installs the rule set (keeping it when it is already there, whole and alone), then checks
/// every rule is present.
pub async fn install(program: &str, rules: &[Rule], network: &str) -> Result<()> {
    ensure_docker_user(program).await?;
    let mut existing = marked(program, DOCKER_USER, network).await?.len();
    existing += marked(program, INPUT, network).await?.len();
    let mut whole = existing == rules.len();
    for rule in rules {
        if !whole {
            break;
        }
        whole = present(program, rule).await;
    }
    if whole {
        tracing::info!(network, rules = rules.len(), "the jobs' firewall is in place");
        return Ok(());
    }
    let stale = remove(program, network).await?;
    for chain in [DOCKER_USER, INPUT] {
        for (position, rule) in rules.iter().filter(|rule| rule.chain == chain).enumerate() {
            let position = (position + 1).to_string();
            let mut args = vec!["-I", chain, position.as_str()];
            args.extend(rule.args.iter().map(String::as_str));
            iptables(program, &args)
                .await
                .map_err(failed(&format!("cannot insert a rule into {chain}")))?;
        }
    }
    for rule in rules {
        if !present(program, rule).await {
            return Err(Error::Firewall {
                message: format!(
                    "a rule of {} is missing after its insertion: {:?}",
                    rule.chain, rule.args
                ),
            });
        }
    }
    tracing::info!(network, rules = rules.len(), stale, "installed the jobs' firewall");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network() -> JobNetwork {
        JobNetwork {
            name: "kiln-jobs".into(),
            bridge: "kiln-jobs".into(),
            subnet: "172.30.0.0/24".into(),
            gateway: "172.30.0.1".into(),
        }
    }

    #[test]
    fn endpoints_are_hosts_and_ports() {
        assert_eq!(host_and_port("http://127.0.0.1:7070"), Some(("127.0.0.1".into(), 7070)));
        assert_eq!(
            host_and_port("https://api.kiln.internal"),
            Some(("api.kiln.internal".into(), 443))
        );
        assert_eq!(host_and_port("10.0.1.5:7075"), Some(("10.0.1.5".into(), 7075)));
        assert_eq!(host_and_port(":7075"), None);
        assert_eq!(host_and_port("api"), None);
        assert!(is_loopback("127.0.0.1") && is_loopback("localhost") && !is_loopback("10.0.0.1"));
        assert_eq!(parse_cidr("10.0.0.0/8"), Some((Ipv4Addr::new(10, 0, 0, 0), 8)));
        assert_eq!(parse_cidr("1.2.3.4"), Some((Ipv4Addr::new(1, 2, 3, 4), 32)));
        assert_eq!(parse_cidr("1.2.3.4/40"), None);
    }

    #[tokio::test]
    async fn loopback_urls_are_ports_of_the_host() {
        let endpoints = resolve_endpoints(&[
            "http://127.0.0.1:7070,http://localhost:7071".into(),
            "10.0.1.5:7075".into(),
            "http://127.0.0.1:7070".into(),
        ])
        .await
        .unwrap();
        assert_eq!(
            endpoints,
            [
                Endpoint::Host { port: 7070 },
                Endpoint::Host { port: 7071 },
                Endpoint::Remote {
                    ip: Ipv4Addr::new(10, 0, 1, 5),
                    port: 7075
                },
            ]
        );
    }

    #[test]
    fn metadata_is_dropped_first_and_the_host_rejects_what_is_not_allowed_last() {
        let endpoints = [
            Endpoint::Host { port: 7070 },
            Endpoint::Remote {
                ip: Ipv4Addr::new(10, 0, 1, 5),
                port: 7071,
            },
        ];
        let rules = rules(&network(), &endpoints, &["10.0.0.0/8".to_string()]);
        let text: Vec<String> = rules
            .iter()
            .map(|rule| format!("{} {}", rule.chain, rule.args.join(" ")))
            .collect();
        let marker = "-m comment --comment kiln:kiln-jobs";
        assert_eq!(
            text,
            [
                format!("DOCKER-USER -s 172.30.0.0/24 -d 169.254.169.254/32 -j DROP {marker}"),
                format!("DOCKER-USER -s 172.30.0.0/24 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT {marker}"),
                format!(
                    "DOCKER-USER -s 172.30.0.0/24 -p tcp -m conntrack --ctstate DNAT --ctorigdstport 7070 -j ACCEPT {marker}"
                ),
                format!("DOCKER-USER -s 172.30.0.0/24 -d 10.0.1.5/32 -p tcp --dport 7071 -j ACCEPT {marker}"),
                format!("DOCKER-USER -s 172.30.0.0/24 -p udp --dport 53 -j RETURN {marker}"),
                format!("DOCKER-USER -s 172.30.0.0/24 -p tcp --dport 53 -j RETURN {marker}"),
                format!(
                    "DOCKER-USER -s 172.30.0.0/24 -d 10.0.0.0/8 -j REJECT --reject-with icmp-port-unreachable {marker}"
                ),
                format!("INPUT -i kiln-jobs -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT {marker}"),
                format!("INPUT -i kiln-jobs -p tcp --dport 7070 -j ACCEPT {marker}"),
                format!("INPUT -i kiln-jobs -d 10.0.1.5/32 -p tcp --dport 7071 -j ACCEPT {marker}"),
                format!("INPUT -i kiln-jobs -j REJECT --reject-with icmp-port-unreachable {marker}"),
            ]
        );
    }
}
