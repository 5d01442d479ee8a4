//! This network namespace's links as the kernel describes them over
//! rtnetlink (`RTM_GETLINK`): name, link type, kind (bridge, veth, tun,
//! wireguard, ...) and the link a port is enslaved to.
//!
//! Netlink, not `/sys/class/net`: sysfs shows the links of the namespace it
//! was mounted in, which is not the caller's after a `setns` (the lab's
//! processes, a daemon started by a container tool), while netlink always
//! answers for the caller's own namespace.

use std::io;

/// One link.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// `ARPHRD_*` (1 Ethernet, 772 loopback, 65534 none).
    pub link_type: u16,
    /// `IFLA_INFO_KIND`: bridge, veth, tun, wireguard, bond, vlan, ...;
    /// absent for a physical NIC.
    pub kind: Option<String>,
    /// The index of the link this one is enslaved to (a bridge or bond).
    pub master: Option<u32>,
}

/// Every link of the caller's network namespace.
///
/// # Errors
///
/// The OS error from the netlink socket, or `InvalidData` for a reply that
/// does not parse.
pub fn links() -> io::Result<Vec<Link>> {
    // SAFETY: plain socket(2); the descriptor is owned by `fd` below.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = Fd(raw);
    let request = dump_request();
    // SAFETY: the buffer is valid for its length; the kernel is the peer
    // (a null address sends to it).
    let sent = unsafe { libc::send(fd.0, request.as_ptr().cast(), request.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    // A dump ends with NLMSG_DONE; the bound only guards against a kernel
    // that never says so.
    for _ in 0..10_000 {
        // SAFETY: recv writes at most buf.len() bytes into buf.
        let n = unsafe { libc::recv(fd.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let n = usize::try_from(n).map_err(|_| bad("negative length"))?;
        if parse_messages(&buf[..n], &mut out)? {
            return Ok(out);
        }
    }
    Err(bad("the link dump never ended"))
}

struct Fd(libc::c_int);

impl Drop for Fd {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

const NLMSG_HDR: usize = 16;
const IFINFOMSG: usize = 16;

fn dump_request() -> Vec<u8> {
    let len = (NLMSG_HDR + IFINFOMSG) as u32;
    let mut m = Vec::with_capacity(len as usize);
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&libc::RTM_GETLINK.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
    m.extend_from_slice(&[0u8; IFINFOMSG]); // any family, any link
    m
}

/// Parses one datagram of netlink messages into `out`; true once the dump
/// is done.
fn parse_messages(mut buf: &[u8], out: &mut Vec<Link>) -> io::Result<bool> {
    while buf.len() >= NLMSG_HDR {
        let len = u32_at(buf, 0) as usize;
        let kind = u16_at(buf, 4);
        if len < NLMSG_HDR || len > buf.len() {
            return Err(bad("a message longer than its datagram"));
        }
        let body = &buf[NLMSG_HDR..len];
        match kind {
            k if k == libc::NLMSG_DONE as u16 => return Ok(true),
            k if k == libc::NLMSG_ERROR as u16 => {
                let errno = body
                    .get(..4)
                    .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                return Err(io::Error::from_raw_os_error(-errno));
            }
            k if k == libc::RTM_NEWLINK => out.push(parse_link(body)?),
            _ => {}
        }
        buf = &buf[align(len).min(buf.len())..];
    }
    Ok(false)
}

fn parse_link(body: &[u8]) -> io::Result<Link> {
    if body.len() < IFINFOMSG {
        return Err(bad("a link message shorter than ifinfomsg"));
    }
    let mut link = Link {
        link_type: u16_at(body, 2),
        index: u32_at(body, 4),
        ..Link::default()
    };
    for (ty, value) in attrs(&body[IFINFOMSG..]) {
        match ty {
            libc::IFLA_IFNAME => link.name = c_string(value),
            libc::IFLA_MASTER if value.len() >= 4 => link.master = Some(u32_at(value, 0)),
            libc::IFLA_LINKINFO => {
                for (inner, v) in attrs(value) {
                    if inner == libc::IFLA_INFO_KIND {
                        link.kind = Some(c_string(v));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(link)
}

/// The (type, value) pairs of a run of route attributes; a truncated one
/// ends the run.
fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = usize::from(u16_at(buf, 0));
        if len < 4 || len > buf.len() {
            return None;
        }
        // NLA_F_NESTED and NLA_F_NET_BYTEORDER ride in the top bits.
        let ty = u16_at(buf, 2) & 0x3fff;
        let value = &buf[4..len];
        buf = &buf[align(len).min(buf.len())..];
        Some((ty, value))
    })
}

fn align(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("rtnetlink: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(ty: u16, value: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&ty.to_ne_bytes());
        a.extend_from_slice(value);
        a.resize(align(a.len()), 0);
        a
    }

    fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDR + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0u8; 10]);
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn a_bridge_port_parses_with_its_kind_and_master() {
        let mut body = vec![0u8, 0];
        body.extend_from_slice(&1u16.to_ne_bytes()); // ARPHRD_ETHER
        body.extend_from_slice(&7u32.to_ne_bytes()); // index
        body.extend_from_slice(&[0u8; 8]);
        body.extend(attr(libc::IFLA_IFNAME, b"vethc0\0"));
        body.extend(attr(libc::IFLA_MASTER, &3u32.to_ne_bytes()));
        let kind = attr(libc::IFLA_INFO_KIND, b"veth\0");
        body.extend(attr(libc::IFLA_LINKINFO | 0x8000, &kind));
        let mut dgram = message(libc::RTM_NEWLINK, &body);
        dgram.extend(message(libc::NLMSG_DONE as u16, &[0u8; 4]));
        let mut out = Vec::new();
        assert!(parse_messages(&dgram, &mut out).unwrap());
        assert_eq!(
            out,
            vec![Link {
                index: 7,
                name: "vethc0".into(),
                link_type: 1,
                kind: Some("veth".into()),
                master: Some(3),
            }]
        );
    }

    #[test]
    fn truncated_and_error_replies_are_errors_not_panics() {
        let mut out = Vec::new();
        let mut m = message(libc::RTM_NEWLINK, &[0u8; 4]);
        assert!(parse_messages(&m, &mut out).is_err());
        m.truncate(10);
        assert!(!parse_messages(&m, &mut out).unwrap());
        let mut long = message(libc::RTM_NEWLINK, &[0u8; 16]);
        long[0] = 200;
        assert!(parse_messages(&long, &mut out).is_err());
        let err = message(libc::NLMSG_ERROR as u16, &(-libc::EPERM).to_ne_bytes());
        let e = parse_messages(&err, &mut out).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn this_namespace_has_a_loopback_link() {
        let all = links().unwrap();
        let lo = all.iter().find(|l| l.name == "lo").expect("lo");
        assert_eq!(lo.link_type, 772);
        assert_eq!(lo.master, None);
    }
}
