//! The round trip and the largest packet a path really carries, measured
//! with ICMP echo from the path's own source address and device, with the
//! don't-fragment bit set (`ping -M probe -s SIZE`): a packet too large for
//! some hop on the way is dropped (or refused), never split, so the largest
//! echo that comes back is the path MTU. Needs CAP_NET_RAW.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// What the echoes showed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Echo {
    /// The smallest round trip of the small echoes, in ms.
    pub rtt_ms: Option<f64>,
    /// Each full-size packet tried (IP packet size) and whether its echo
    /// came back.
    pub tried: Vec<(u32, bool)>,
    /// The largest size that came back.
    pub carried: Option<u32>,
    /// Why nothing could be measured.
    pub error: Option<String>,
}

/// Sizes tried below the interface MTU, largest first: the MTUs links
/// commonly have (jumbo, FDDI/ATM, Ethernet, PPPoE, tunnels, IPv6's floor).
const COMMON_MTUS: [u32; 7] = [9000, 4470, 1500, 1492, 1480, 1400, 1280];
/// How long one echo is waited for.
const WAIT: Duration = Duration::from_millis(300);

/// Echoes to `dst` from `src` through `device`, up to `mtu` bytes.
pub fn probe(dst: IpAddr, src: Option<IpAddr>, device: Option<&str>, mtu: u32) -> Echo {
    match Pinger::new(dst, src, device) {
        Ok(mut p) => p.run(mtu),
        Err(e) => Echo {
            error: Some(if e.kind() == io::ErrorKind::PermissionDenied {
                "ICMP echo needs CAP_NET_RAW (run braid doctor as root)".to_owned()
            } else {
                format!("cannot send ICMP echo: {e}")
            }),
            ..Echo::default()
        },
    }
}

struct Pinger {
    fd: OwnedFd,
    dst: IpAddr,
    v6: bool,
    id: u16,
    seq: u16,
}

impl Pinger {
    fn new(dst: IpAddr, src: Option<IpAddr>, device: Option<&str>) -> io::Result<Self> {
        let v6 = dst.is_ipv6();
        let (domain, proto) = if v6 {
            (libc::AF_INET6, libc::IPPROTO_ICMPV6)
        } else {
            (libc::AF_INET, libc::IPPROTO_ICMP)
        };
        // SAFETY: plain socket(2), owned below.
        let raw = unsafe { libc::socket(domain, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if let Some(dev) = device {
            setsockopt_bytes(&fd, libc::SOL_SOCKET, libc::SO_BINDTODEVICE, dev.as_bytes())?;
        }
        if let Some(ip) = src {
            bind(&fd, SocketAddr::new(ip, 0))?;
        }
        // Don't fragment, and ignore a path MTU cached from before: the
        // answer must come from the packets themselves.
        let (level, opt, probe) = if v6 {
            (
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_PROBE,
            )
        } else {
            (
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_PROBE,
            )
        };
        setsockopt_bytes(&fd, level, opt, &probe.to_ne_bytes())?;
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 50_000,
        };
        // SAFETY: a timeval viewed as its bytes for setsockopt.
        let tv_bytes = unsafe {
            std::slice::from_raw_parts(
                std::ptr::addr_of!(tv).cast::<u8>(),
                std::mem::size_of::<libc::timeval>(),
            )
        };
        setsockopt_bytes(&fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, tv_bytes)?;
        Ok(Self {
            fd,
            dst,
            v6,
            id: (std::process::id() as u16) ^ 0x6272,
            seq: 0,
        })
    }

    fn run(&mut self, mtu: u32) -> Echo {
        let mut echo = Echo::default();
        let small = if self.v6 { 104 } else { 84 };
        for _ in 0..3 {
            match self.once(small) {
                Ok(Some(rtt)) => {
                    let ms = rtt.as_secs_f64() * 1000.0;
                    echo.rtt_ms = Some(echo.rtt_ms.map_or(ms, |m: f64| m.min(ms)));
                }
                Ok(None) => {}
                Err(e) => {
                    echo.error = Some(format!("ICMP echo: {e}"));
                    return echo;
                }
            }
        }
        if echo.rtt_ms.is_none() {
            echo.error = Some(format!(
                "{} answered no ICMP echo (a firewall may drop it)",
                self.dst
            ));
            return echo;
        }
        let mut sizes = vec![mtu];
        sizes.extend(COMMON_MTUS.iter().copied().filter(|s| *s < mtu));
        for size in sizes {
            // Two tries: one lost echo is not a size that does not pass.
            let back = (0..2).any(|_| matches!(self.once(size), Ok(Some(_))));
            echo.tried.push((size, back));
            if back {
                echo.carried = Some(size);
                break;
            }
        }
        echo
    }

    /// One echo of an IP packet of `size` bytes; its round trip, or `None`
    /// if no answer came within [`WAIT`].
    fn once(&mut self, size: u32) -> io::Result<Option<Duration>> {
        self.seq = self.seq.wrapping_add(1);
        let header = if self.v6 { 40 } else { 20 };
        let len = (size as usize).saturating_sub(header).max(8);
        let mut msg = vec![0u8; len];
        msg[0] = if self.v6 { 128 } else { 8 };
        msg[4..6].copy_from_slice(&self.id.to_be_bytes());
        msg[6..8].copy_from_slice(&self.seq.to_be_bytes());
        for (i, b) in msg[8..].iter_mut().enumerate() {
            *b = i as u8;
        }
        if !self.v6 {
            // ICMPv6's checksum is the kernel's to fill in; ICMP's is ours.
            let sum = checksum(&msg);
            msg[2..4].copy_from_slice(&sum.to_be_bytes());
        }
        let sent = Instant::now();
        if let Err(e) = send_to(&self.fd, &msg, SocketAddr::new(self.dst, 0)) {
            // Too big for our own interface: not carried.
            if e.raw_os_error() == Some(libc::EMSGSIZE) {
                return Ok(None);
            }
            return Err(e);
        }
        let mut buf = vec![0u8; 65536];
        while sent.elapsed() < WAIT {
            let Some((n, from)) = recv_from(&self.fd, &mut buf)? else {
                continue;
            };
            if from != self.dst {
                continue;
            }
            let icmp = if self.v6 {
                &buf[..n]
            } else {
                let ihl = usize::from(buf[0] & 0x0f) * 4;
                if n < ihl + 8 {
                    continue;
                }
                &buf[ihl..n]
            };
            let reply = if self.v6 { 129 } else { 0 };
            if icmp.len() >= 8
                && icmp[0] == reply
                && icmp[4..6] == self.id.to_be_bytes()
                && icmp[6..8] == self.seq.to_be_bytes()
            {
                return Ok(Some(sent.elapsed()));
            }
        }
        Ok(None)
    }
}

/// The Internet checksum (RFC 1071).
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn setsockopt_bytes(fd: &OwnedFd, level: i32, opt: i32, value: &[u8]) -> io::Result<()> {
    // SAFETY: the value is valid for its length during the call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            value.as_ptr().cast(),
            value.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A socket address in the kernel's layout, with its length.
fn raw_addr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for
            // sockaddr_in.
            let sin = unsafe { &mut *std::ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *std::ptr::addr_of_mut!(ss).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn bind(fd: &OwnedFd, a: SocketAddr) -> io::Result<()> {
    let (ss, len) = raw_addr(a);
    // SAFETY: a valid address of the given length.
    let rc = unsafe { libc::bind(fd.as_raw_fd(), std::ptr::addr_of!(ss).cast(), len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn send_to(fd: &OwnedFd, msg: &[u8], a: SocketAddr) -> io::Result<()> {
    let (ss, len) = raw_addr(a);
    // SAFETY: the message and address are valid for the given lengths.
    let rc = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            std::ptr::addr_of!(ss).cast(),
            len,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// One datagram and who sent it; `None` when the receive timeout passed.
fn recv_from(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<Option<(usize, IpAddr)>> {
    // SAFETY: plain data; zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: buffer and address valid for their lengths.
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
            std::ptr::addr_of_mut!(ss).cast(),
            &mut len,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted => {
                Ok(None)
            }
            _ => Err(e),
        };
    }
    let from = match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in (family says so).
            let sin = unsafe { &*std::ptr::addr_of!(ss).cast::<libc::sockaddr_in>() };
            IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes())
        }
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6.
            let sin6 = unsafe { &*std::ptr::addr_of!(ss).cast::<libc::sockaddr_in6>() };
            IpAddr::from(sin6.sin6_addr.s6_addr)
        }
        _ => return Ok(None),
    };
    Ok(Some((n as usize, from)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_rfc1071_example() {
        // RFC 1071 section 3's bytes sum to 0xddf2; the checksum is its
        // complement.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(checksum(&data), !0xddf2);
        // A message with its checksum in place sums to zero.
        let mut m = vec![8u8, 0, 0, 0, 0x12, 0x34, 0, 1, 0xab];
        let s = checksum(&m);
        m[2..4].copy_from_slice(&s.to_be_bytes());
        assert_eq!(checksum(&m), 0);
    }

    #[test]
    fn loopback_echoes_as_root() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            let e = probe("127.0.0.1".parse().unwrap(), None, None, 1500);
            assert!(e.error.is_some());
            return;
        }
        let e = probe("127.0.0.1".parse().unwrap(), None, Some("lo"), 9000);
        assert!(e.error.is_none(), "{e:?}");
        assert!(e.rtt_ms.is_some());
        assert_eq!(e.carried, Some(9000));
    }
}
