//! iperf3 over lab paths: the physical limit braid's figures are compared
//! against. One server and one single-stream client per path, all at once.

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::config::Side;
use crate::topo::PathInfo;
use crate::{Lab, LabError};

/// First server port; the k-th path measured uses `BASE_PORT + k`.
const BASE_PORT: u16 = 5201;

/// How long servers get to start listening.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(5);

/// Extra time a client gets beyond its test length (connect, teardown).
const CLIENT_SLACK: Duration = Duration::from_secs(20);

pub(crate) fn run(
    lab: &Lab,
    paths: &[PathInfo],
    seconds: u32,
    reverse: bool,
) -> Result<Vec<f64>, LabError> {
    let ports: Vec<u16> = (0..paths.len())
        .map(|k| u16::try_from(k).ok().and_then(|k| BASE_PORT.checked_add(k)))
        .collect::<Option<_>>()
        .ok_or_else(|| LabError::InvalidConfig {
            reason: "too many iperf3 paths at once".into(),
        })?;
    // Guards: the servers are stopped however this function ends.
    let _servers = (paths.iter().zip(&ports))
        .map(|(p, port)| {
            let mut c = Command::new("iperf3");
            c.args([
                "-s",
                "-1",
                "-B",
                &p.storage_addr.to_string(),
                "-p",
                &port.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
            lab.spawn(Side::Storage, c)
        })
        .collect::<Result<Vec<_>, _>>()?;
    wait_listening(lab, &ports)?;

    let timeout = Duration::from_secs(u64::from(seconds)) + CLIENT_SLACK;
    let results: Vec<Result<f64, LabError>> = thread::scope(|s| {
        let handles: Vec<_> = (paths.iter().zip(&ports))
            .map(|(p, port)| {
                let mut c = Command::new("iperf3");
                c.args(["-c", &p.storage_addr.to_string()])
                    .args(["-B", &p.client_addr.to_string()])
                    .args(["-p", &port.to_string(), "-t", &seconds.to_string()])
                    // cubic on the socket too, whatever the route says.
                    .args(["-J", "-C", "cubic"]);
                if reverse {
                    c.arg("-R");
                }
                let command = crate::cmd::describe(&c);
                s.spawn(move || {
                    let out = lab.output(Side::Client, c, timeout)?;
                    goodput(&command, &out.stdout, &out.stderr)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    results.into_iter().collect()
}

/// Polls the storage namespace's TCP table until every port is listening.
/// (Probing by connecting would use up a `-1` server's only test.)
fn wait_listening(lab: &Lab, ports: &[u16]) -> Result<(), LabError> {
    let deadline = Instant::now() + LISTEN_TIMEOUT;
    loop {
        let table = lab
            .enter(Side::Storage, || {
                std::fs::read_to_string("/proc/thread-self/net/tcp")
            })?
            .map_err(|e| LabError::io("reading /proc/net/tcp in the storage namespace", e))?;
        let listening = listening_ports(&table);
        if ports.iter().all(|p| listening.contains(p)) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(LabError::Timeout {
                command: format!("iperf3 -s (ports {ports:?})"),
                after: LISTEN_TIMEOUT,
            });
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// Local ports in state LISTEN (0A) in `/proc/net/tcp` text.
fn listening_ports(table: &str) -> Vec<u16> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let local = f.nth(1)?;
            let state = f.nth(1)?;
            let (_, port) = local.split_once(':')?;
            (state == "0A").then(|| u16::from_str_radix(port, 16).ok())?
        })
        .collect()
}

/// MB/s received, from `iperf3 -J` output.
fn goodput(command: &str, stdout: &[u8], stderr: &[u8]) -> Result<f64, LabError> {
    let json: serde_json::Value =
        serde_json::from_slice(stdout).map_err(|e| LabError::Command {
            command: command.to_owned(),
            status: format!("no JSON on stdout ({e})"),
            stderr: String::from_utf8_lossy(stderr).trim().to_owned(),
        })?;
    if let Some(err) = json.get("error").and_then(|e| e.as_str()) {
        return Err(LabError::Command {
            command: command.to_owned(),
            status: "iperf3 reported an error".into(),
            stderr: err.to_owned(),
        });
    }
    json.pointer("/end/sum_received/bits_per_second")
        .and_then(serde_json::Value::as_f64)
        .map(|bps| bps / 8e6)
        .ok_or_else(|| LabError::Parse {
            what: "iperf3 -J".into(),
            detail: "no end.sum_received.bits_per_second".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_ports_are_found() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue\n   \
                     0: 01004D0A:1451 00000000:0000 0A 00000000:00000000 00:00000000 00000000\n   \
                     1: 01004D0A:1452 02004D0A:9C40 01 00000000:00000000 00:00000000 00000000\n";
        assert_eq!(listening_ports(table), vec![0x1451]);
    }

    #[test]
    fn goodput_is_read_in_megabytes() {
        let out = br#"{"end":{"sum_received":{"bits_per_second":8e8}}}"#;
        assert_eq!(goodput("iperf3", out, b"").unwrap(), 100.0);
        let err = br#"{"error":"unable to connect"}"#;
        assert!(goodput("iperf3", err, b"").is_err());
    }
}
