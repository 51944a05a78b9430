//! The firewall of isolated process jobs: a chain of the runner's in iptables `OUTPUT` that each
//! job's uid jumps to (see [`UidFirewall`]).

use super::{Endpoint, METADATA_ADDRESS, METADATA_ADDRESS_V6, OUTPUT, comment, failed, iptables, locate, marked};
use crate::error::{Error, Result};

/// The firewall of isolated process jobs, which share the runner's network stack: their packets
/// are judged in `OUTPUT` by the uid that made their socket.
///
/// The runner keeps a chain of its own (`KILN-<12 hex digits of its work dir's sha256>`, in
/// iptables and, when the host has IPv6, ip6tables), written whole by one `iptables-restore
/// --noflush` so that it never stands half-written, and a job's uid jumps to it (`-m owner
/// --uid-owner UID`, marked `kiln:<chain>`) from the job's start to its release. In the chain,
/// top down: reject the instance metadata address; accept replies; accept the job endpoints (a
/// port of any of the host's own addresses, or a remote address and port); accept DNS; reject
/// every other address of the host, loopback included (kiln up's NATS, the services' metrics
/// ports); reject the blocked ranges; the rest (the internet) returns to `OUTPUT`.
#[derive(Debug, Clone)]
pub struct UidFirewall {
    chain: String,
    /// `iptables`, then `ip6tables` when the host has IPv6.
    programs: Vec<Family>,
}

/// One address family's program and words.
#[derive(Debug, Clone)]
struct Family {
    program: String,
    v6: bool,
}

/// The target that refuses a connection at once (the caller sees "connection refused").
fn reject(v6: bool) -> &'static str {
    if v6 {
        "-j REJECT --reject-with icmp6-port-unreachable"
    } else {
        "-j REJECT --reject-with icmp-port-unreachable"
    }
}

/// IPv6 ranges jobs may not reach on a host with IPv6 (unique-local and link-local).
const BLOCKED_V6: [&str; 2] = ["fc00::/7", "fe80::/10"];

/// The chain of the runner whose work dir is `work_dir`.
pub fn uid_chain(work_dir: &std::path::Path) -> String {
    use sha2::Digest;
    let absolute = std::path::absolute(work_dir).unwrap_or_else(|_| work_dir.to_path_buf());
    let hash = hex::encode(sha2::Sha256::digest(absolute.as_os_str().as_encoded_bytes()));
    format!("KILN-{}", &hash[..12])
}

/// The rules of a process jobs' chain, top down, as `-A <chain> ...` lines of `iptables-restore`.
pub fn uid_chain_rules(chain: &str, v6: bool, endpoints: &[Endpoint], blocked_ranges: &[String]) -> Vec<String> {
    let reject = reject(v6);
    let metadata = if v6 { METADATA_ADDRESS_V6 } else { METADATA_ADDRESS };
    let mut rules = vec![
        format!("-A {chain} -d {metadata} {reject}"),
        format!("-A {chain} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"),
    ];
    for endpoint in endpoints {
        match *endpoint {
            Endpoint::Host { port } => rules.push(format!(
                "-A {chain} -p tcp --dport {port} -m addrtype --dst-type LOCAL -j ACCEPT"
            )),
            Endpoint::Remote { ip, port } if !v6 => {
                rules.push(format!("-A {chain} -d {ip}/32 -p tcp --dport {port} -j ACCEPT"));
            }
            Endpoint::Remote { .. } => {}
        }
    }
    for protocol in ["udp", "tcp"] {
        rules.push(format!("-A {chain} -p {protocol} --dport 53 -j ACCEPT"));
    }
    rules.push(format!("-A {chain} -m addrtype --dst-type LOCAL {reject}"));
    let blocked: Vec<&str> = if v6 {
        BLOCKED_V6.to_vec()
    } else {
        blocked_ranges.iter().map(String::as_str).collect()
    };
    for range in blocked {
        rules.push(format!("-A {chain} -d {range} {reject}"));
    }
    rules
}

/// The program of the other family: `iptables-legacy` → `ip6tables-legacy`.
fn v6_program(program: &str) -> String {
    match program.rsplit_once('/') {
        Some((dir, name)) => format!("{dir}/{}", name.replacen("iptables", "ip6tables", 1)),
        None => program.replacen("iptables", "ip6tables", 1),
    }
}

impl UidFirewall {
    /// Writes (or rewrites) the chain of the runner whose work dir is `work_dir`; `iptables` is
    /// the IPv4 program (`docker.iptables`). Jumps of running jobs are kept: a restarted runner
    /// finds its jobs' uids still confined.
    pub async fn install(
        iptables_program: &str,
        work_dir: &std::path::Path,
        endpoints: &[Endpoint],
        blocked_ranges: &[String],
    ) -> Result<UidFirewall> {
        let chain = uid_chain(work_dir);
        let mut programs = vec![Family {
            program: iptables_program.to_string(),
            v6: false,
        }];
        // Unknown (an error reading /proc) counts as present: the v6 chain is then required.
        if std::path::Path::new("/proc/net/if_inet6").try_exists().ok() != Some(false) {
            programs.push(Family {
                program: v6_program(iptables_program),
                v6: true,
            });
        }
        for family in &programs {
            let mut script = format!("*filter\n:{chain} - [0:0]\n-F {chain}\n");
            for rule in uid_chain_rules(&chain, family.v6, endpoints, blocked_ranges) {
                script.push_str(&rule);
                script.push('\n');
            }
            script.push_str("COMMIT\n");
            restore(&format!("{}-restore", family.program), &script)
                .await
                .map_err(|message| Error::ProcessFirewall {
                    message: format!("cannot write the chain {chain}: {message}"),
                })?;
        }
        tracing::info!(chain, endpoints = ?endpoints, "process jobs are confined to kiln's job endpoints");
        Ok(UidFirewall { chain, programs })
    }

    pub fn chain(&self) -> &str {
        &self.chain
    }

    fn jump(&self, uid: u32) -> Vec<String> {
        let marker = comment(&self.chain);
        format!(
            "-m owner --uid-owner {uid} -m comment --comment {marker} -j {}",
            self.chain
        )
        .split_whitespace()
        .map(str::to_string)
        .collect()
    }

    /// Sends the packets of `uid` through the chain (before the job's first process starts).
    pub async fn admit(&self, uid: u32) -> Result<()> {
        let jump = self.jump(uid);
        let jump: Vec<&str> = jump.iter().map(String::as_str).collect();
        for family in &self.programs {
            let mut check = vec!["-C", OUTPUT];
            check.extend(&jump);
            if iptables(&family.program, &check).await.is_ok() {
                continue;
            }
            let mut insert = vec!["-I", OUTPUT, "1"];
            insert.extend(&jump);
            iptables(&family.program, &insert)
                .await
                .map_err(|message| Error::ProcessFirewall {
                    message: format!("cannot send the uid {uid} through {}: {message}", self.chain),
                })?;
        }
        Ok(())
    }

    /// Removes the jumps of `uid` (its job was released).
    pub async fn release(&self, uid: u32) -> Result<()> {
        let jump = self.jump(uid);
        let jump: Vec<&str> = jump.iter().map(String::as_str).collect();
        for family in &self.programs {
            let mut delete = vec!["-D", OUTPUT];
            delete.extend(&jump);
            while iptables(&family.program, &delete).await.is_ok() {}
        }
        Ok(())
    }

    /// Removes the chain and its jumps: the runner stopped, and every job with it.
    pub async fn remove(&self) -> Result<()> {
        let programs: Vec<String> = self.programs.iter().map(|family| family.program.clone()).collect();
        remove_chain(&programs, &self.chain).await
    }

    /// The uids that jump to the chain now.
    pub async fn admitted(&self) -> Result<Vec<u32>> {
        let mut uids = Vec::new();
        for family in &self.programs {
            let listed = marked(&family.program, OUTPUT, &self.chain).await;
            let listed = listed.map_err(|error| Error::ProcessFirewall {
                message: error.to_string(),
            })?;
            for words in listed {
                let uid = words
                    .iter()
                    .position(|word| word == "--uid-owner")
                    .and_then(|at| words.get(at + 1))
                    .and_then(|uid| uid.parse::<u32>().ok());
                uids.extend(uid);
            }
        }
        uids.sort_unstable();
        uids.dedup();
        Ok(uids)
    }
}

/// Removes the chain of the runner whose work dir is `work_dir` and every jump to it (a runner
/// taken out of service, and the tests).
pub async fn remove_uid_chain(iptables_program: &str, work_dir: &std::path::Path) -> Result<()> {
    let programs = [iptables_program.to_string(), v6_program(iptables_program)];
    remove_chain(&programs, &uid_chain(work_dir)).await
}

async fn remove_chain(programs: &[String], chain: &str) -> Result<()> {
    for program in programs {
        if iptables(program, &["-n", "-L", chain]).await.is_err() {
            continue;
        }
        for words in marked(program, OUTPUT, chain).await? {
            let mut args = vec!["-D"];
            args.extend(words.iter().skip(1).map(String::as_str));
            iptables(program, &args)
                .await
                .map_err(failed(&format!("cannot delete a jump to {chain}")))?;
        }
        for step in ["-F", "-X"] {
            iptables(program, &[step, chain])
                .await
                .map_err(failed(&format!("cannot remove {chain}")))?;
        }
    }
    Ok(())
}

/// Runs `<program> --noflush` with `script` on its stdin.
async fn restore(program: &str, script: &str) -> std::result::Result<(), String> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(locate(program))
        .args(["-w", "10", "--noflush"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|error| format!("cannot run {program} ({error}); install it (Debian: apt-get install iptables)"))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin
        .write_all(script.as_bytes())
        .await
        .map_err(|error| format!("cannot write to {program}: {error}"))?;
    drop(stdin);
    let output = child
        .wait_with_output()
        .await
        .map_err(|error| format!("{program} did not end: {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).trim().to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn a_process_jobs_chain_rejects_the_host_but_its_endpoints_and_the_metadata_address_first() {
        let endpoints = [
            Endpoint::Host { port: 7070 },
            Endpoint::Remote {
                ip: Ipv4Addr::new(10, 0, 1, 5),
                port: 7071,
            },
        ];
        let chain = uid_chain(std::path::Path::new("/var/lib/kiln/work"));
        assert!(chain.starts_with("KILN-") && chain.len() == 17, "{chain}");
        let reject = "-j REJECT --reject-with icmp-port-unreachable";
        assert_eq!(
            uid_chain_rules("KILN-X", false, &endpoints, &["10.0.0.0/8".to_string()]),
            [
                format!("-A KILN-X -d 169.254.169.254/32 {reject}"),
                "-A KILN-X -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT".to_string(),
                "-A KILN-X -p tcp --dport 7070 -m addrtype --dst-type LOCAL -j ACCEPT".to_string(),
                "-A KILN-X -d 10.0.1.5/32 -p tcp --dport 7071 -j ACCEPT".to_string(),
                "-A KILN-X -p udp --dport 53 -j ACCEPT".to_string(),
                "-A KILN-X -p tcp --dport 53 -j ACCEPT".to_string(),
                format!("-A KILN-X -m addrtype --dst-type LOCAL {reject}"),
                format!("-A KILN-X -d 10.0.0.0/8 {reject}"),
            ]
        );
        let v6 = uid_chain_rules("KILN-X", true, &endpoints, &["10.0.0.0/8".to_string()]);
        assert_eq!(
            v6[0],
            "-A KILN-X -d fd00:ec2::254/128 -j REJECT --reject-with icmp6-port-unreachable"
        );
        assert!(!v6.iter().any(|rule| rule.contains("10.0.")), "{v6:?}");
        assert_eq!(v6_program("/usr/sbin/iptables-legacy"), "/usr/sbin/ip6tables-legacy");
        assert_eq!(v6_program("iptables"), "ip6tables");
        // Found outside a PATH that lacks the sbin directories (kiln up run with PATH=/usr/bin:/bin).
        assert_eq!(locate("/opt/iptables"), std::path::PathBuf::from("/opt/iptables"));
        let found = locate("iptables-restore");
        assert!(found.is_absolute() && found.is_file(), "{}", found.display());
    }
}
