//! An attacker's probe of NATS from inside a job: a bash script (no NATS client needed: it
//! speaks the text protocol over `/dev/tcp`) that connects without credentials, publishes on a
//! kiln subject and reports what the server said, and the parser of its output.
//!
//! A hostile-job test submits `bash -c <script>` as a job, reads its log lines, and expects
//! [`NatsProbe::Refused`]; the control runs the same script against a server without
//! authorization and sees [`NatsProbe::Published`].

/// What the probe saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NatsProbe {
    /// No TCP connection to the server.
    Unreachable,
    /// The server refused the connection or the publish (its `-ERR` line).
    Refused(String),
    /// The server took the publish (it answered the PING that follows it, with no error).
    Published,
}

/// The prefix of every line the probe prints.
const PREFIX: &str = "kiln-nats-probe:";

/// A bash script that connects to `host:port` with no credentials, publishes `payload` on
/// `subject` and prints one line per server answer, prefixed `kiln-nats-probe:`. SIGPIPE is
/// ignored: a server that refuses may close the socket before the script has written.
pub fn nats_probe_script(host: &str, port: u16, subject: &str, payload: &str) -> String {
    format!(
        r#"trap '' PIPE
exec 3<>/dev/tcp/{host}/{port} || {{ echo "{PREFIX} unreachable"; exit 0; }}
printf 'CONNECT {{"verbose":false,"pedantic":false,"name":"probe"}}\r\nPUB {subject} {len}\r\n{payload}\r\nPING\r\n' >&3
while read -t 5 -r line <&3; do
  echo "{PREFIX} $line"
  case "$line" in PONG*|-ERR*) break ;; esac
done
echo "{PREFIX} end""#,
        len = payload.len(),
    )
}

impl NatsProbe {
    /// Reads the probe's output (a job's log lines joined, or its stdout); `None` when it
    /// holds no verdict (the script did not run to its end).
    pub fn from_output(output: &str) -> Option<NatsProbe> {
        let answers: Vec<&str> = output
            .lines()
            .filter_map(|line| line.trim().strip_prefix(PREFIX))
            .map(str::trim)
            .collect();
        for answer in &answers {
            if *answer == "unreachable" {
                return Some(NatsProbe::Unreachable);
            }
            if answer.starts_with("-ERR") {
                return Some(NatsProbe::Refused(answer.to_string()));
            }
            if answer.starts_with("PONG") {
                return Some(NatsProbe::Published);
            }
        }
        // The server closed the connection without a word.
        answers
            .contains(&"end")
            .then(|| NatsProbe::Refused("closed without an answer".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_are_read() {
        let refused = "kiln-nats-probe: INFO {}\nkiln-nats-probe: -ERR 'Authorization Violation'\nkiln-nats-probe: end";
        assert_eq!(
            NatsProbe::from_output(refused),
            Some(NatsProbe::Refused("-ERR 'Authorization Violation'".into()))
        );
        let published = "kiln-nats-probe: INFO {}\r\nkiln-nats-probe: PONG\r\nkiln-nats-probe: end";
        assert_eq!(NatsProbe::from_output(published), Some(NatsProbe::Published));
        assert_eq!(
            NatsProbe::from_output("kiln-nats-probe: unreachable"),
            Some(NatsProbe::Unreachable)
        );
        assert_eq!(NatsProbe::from_output("kiln-nats-probe: INFO {}"), None);
    }
}
