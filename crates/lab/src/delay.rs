//! Added one-way delay on a path, for tests that need a round trip longer
//! than the lab's sub-millisecond one (a bandwidth-delay product bigger
//! than a TCP buffer).
//!
//! The kernel the lab targets has neither netem nor the fq qdisc (whose
//! earliest-departure-time pacing a tc program could use), so the delay is
//! a small userspace line: in the sending side's namespace a route sends
//! everything for the peer's address on that path into a TUN device; a
//! thread reads each IP packet from it, holds it for the delay, and sends
//! it out of the path's veth through an `AF_PACKET` socket addressed to the
//! peer's MAC. Packet sockets go through the veth's qdisc, so the path's
//! tbf rate still applies, and every packet of every protocol (TCP, ICMP)
//! is delayed the same, as on a long link. The cost is two system calls per
//! packet; the TUN device has no offloads, so packets are MTU-sized.
//!
//! Dropping the [`Delay`] stops the thread; closing the TUN device removes
//! it and the route through it.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::netns;
use crate::LabError;

/// Packets held at once; past it the line drops, as a full queue would.
const MAX_HELD: usize = 20_000;

/// A delay in force. Dropping it ends the delay.
#[derive(Debug)]
pub struct Delay {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The TUN device's name, for messages.
    pub device: String,
}

impl Drop for Delay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // The thread checks the flag at least every 20 ms.
            let _ = t.join();
        }
    }
}

/// Where and how to delay.
pub(crate) struct Line {
    pub ns: String,
    /// The TUN device to create (`brdN`).
    pub tun: String,
    /// The veth the packets finally leave by, and the peer's MAC on it.
    pub veth: String,
    pub peer_mac: [u8; 6],
    pub delay: Duration,
}

/// Creates the TUN device inside the namespace and starts the thread that
/// relays its packets, late, to the veth. The caller routes traffic into
/// the device (it must exist first).
pub(crate) fn start(line: Line) -> Result<Delay, LabError> {
    let (tun, packet, ifindex) = netns::enter(&line.ns, || open(&line))??;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let device = line.tun.clone();
    let thread = std::thread::Builder::new()
        .name(format!("lab-delay-{}", line.tun))
        .spawn(move || relay(tun, packet, ifindex, &line, &flag))
        .map_err(|e| LabError::io("cannot start the delay thread", e))?;
    Ok(Delay {
        stop,
        thread: Some(thread),
        device,
    })
}

/// The TUN device, a packet socket for the veth, and the veth's index;
/// called inside the namespace.
fn open(line: &Line) -> Result<(File, OwnedFd, i32), LabError> {
    let io = |what: &str| {
        let e = std::io::Error::last_os_error();
        LabError::io(format!("{what} for the delay on {}", line.veth), e)
    };
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|e| LabError::io("cannot open /dev/net/tun (is the tun module there?)", e))?;
    let mut req = [0u8; 40];
    req[..line.tun.len()].copy_from_slice(line.tun.as_bytes());
    let flags: libc::c_short = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    req[16..18].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: TUNSETIFF reads and writes an ifreq, which `req` is (name,
    // then the flags of the union), alive for the call.
    if unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, req.as_mut_ptr()) } < 0 {
        return Err(io("TUNSETIFF"));
    }
    // SAFETY: the name is a NUL-terminated C string of a live buffer.
    let name = std::ffi::CString::new(line.veth.as_str()).map_err(|_| LabError::InvalidConfig {
        reason: format!("{:?} is not an interface name", line.veth),
    })?;
    // SAFETY: if_nametoindex reads the NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        return Err(io("if_nametoindex"));
    }
    let proto = (libc::ETH_P_IP as u16).to_be();
    // SAFETY: plain socket(2); owned by the OwnedFd below.
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            i32::from(proto),
        )
    };
    if raw < 0 {
        return Err(io("AF_PACKET socket"));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let packet = unsafe { OwnedFd::from_raw_fd(raw) };
    // Non-blocking reads, so the thread can look at the clock and the stop
    // flag between packets.
    // SAFETY: fcntl on our own descriptor.
    unsafe {
        let fl = libc::fcntl(tun.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(tun.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
    Ok((tun, packet, ifindex as i32))
}

fn relay(mut tun: File, packet: OwnedFd, ifindex: i32, line: &Line, stop: &AtomicBool) {
    let mut held: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut buf = vec![0u8; 65536];
    let mut dest: libc::sockaddr_ll = {
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        unsafe { std::mem::zeroed() }
    };
    dest.sll_family = libc::AF_PACKET as u16;
    dest.sll_protocol = (libc::ETH_P_IP as u16).to_be();
    dest.sll_ifindex = ifindex;
    dest.sll_halen = 6;
    dest.sll_addr[..6].copy_from_slice(&line.peer_mac);
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while held.front().is_some_and(|(due, _)| *due <= now) {
            let (_, p) = held.pop_front().expect("front exists");
            // SAFETY: `p` is valid for its length and `dest` is a
            // sockaddr_ll of the size given.
            unsafe {
                libc::sendto(
                    packet.as_raw_fd(),
                    p.as_ptr().cast(),
                    p.len(),
                    0,
                    std::ptr::addr_of!(dest).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                );
            }
        }
        let wait = held
            .front()
            .map_or(Duration::from_millis(20), |(due, _)| {
                due.saturating_duration_since(Instant::now())
            })
            .min(Duration::from_millis(20));
        let mut pfd = libc::pollfd {
            fd: tun.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(wait.as_millis()).unwrap_or(20);
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, ms) };
        if ready <= 0 {
            continue;
        }
        // Everything queued now, each packet stamped on arrival.
        for _ in 0..256 {
            match tun.read(&mut buf) {
                Ok(n) if n > 0 => {
                    if held.len() < MAX_HELD {
                        held.push_back((Instant::now() + line.delay, buf[..n].to_vec()));
                    }
                }
                _ => break,
            }
        }
    }
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub(crate) fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let v: Vec<u8> = s
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).ok())
        .collect::<Option<_>>()?;
    v.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse() {
        assert_eq!(
            parse_mac("02:a1:00:ff:10:9c"),
            Some([2, 0xa1, 0, 0xff, 0x10, 0x9c])
        );
        assert_eq!(parse_mac("02:a1:00"), None);
        assert_eq!(parse_mac("zz:a1:00:ff:10:9c"), None);
    }
}
