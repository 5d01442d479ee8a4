//! Telling the service manager how braid is doing: systemd's notify
//! protocol (`sd_notify(3)`), so a unit with `Type=notify` counts braid as
//! started only once every portal and socket listens, and units ordered
//! after it (a kernel NBD device on the attach socket) need no wait loop.
//!
//! The protocol is one datagram of `KEY=VALUE` lines to the unix socket
//! named by `$NOTIFY_SOCKET` (`@name` for the abstract namespace). Outside
//! systemd the variable is unset and every call here does nothing.

use std::io;
use std::os::unix::net::UnixDatagram;

/// Every socket is bound: clients can connect now.
pub fn ready(status: &str) {
    send(&format!("READY=1\nSTATUS={status}"));
}

/// braid is re-reading its configuration; `ready` follows when done.
pub fn reloading() {
    let now = monotonic_usec();
    send(&format!("RELOADING=1\nMONOTONIC_USEC={now}"));
}

/// CLOCK_MONOTONIC in microseconds, as systemd's reload protocol wants it.
fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

/// braid has begun to stop (flushing, closing paths).
pub fn stopping() {
    send("STOPPING=1");
}

/// Sends `state`; a failure is logged, never fatal: the service manager
/// will say that braid did not report, which names the problem better than
/// braid refusing to run.
fn send(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send_to(&path.to_string_lossy(), state) {
        tracing::warn!("cannot notify the service manager at {path:?}: {e}");
    }
}

fn send_to(path: &str, state: &str) -> io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    match path.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            sock.send_to(state.as_bytes(), path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_reaches_a_path_and_an_abstract_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        send_to(path.to_str().unwrap(), "READY=1\nSTATUS=x").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=x");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("braid-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        send_to(&format!("@{name}"), "STOPPING=1").unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }
}
