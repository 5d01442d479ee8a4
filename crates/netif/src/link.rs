//! This network namespace's links as the kernel describes them over
//! rtnetlink (`RTM_GETLINK`): name, link type, kind (bridge, veth, tun,
//! wireguard, ...) and the link a port is enslaved to.
//!
//! Netlink, not `/sys/class/net`: sysfs shows the links of the namespace it
//! was mounted in, which is not the caller's after a `setns` (the lab's
//! processes, a daemon started by a container tool), while netlink always
//! answers for the caller's own namespace.

use std::io;

use crate::nl;

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
    /// `IFLA_MTU`.
    pub mtu: Option<u32>,
    /// `IFLA_LINK`: the link a VLAN or macvlan sits on (for a veth, its
    /// peer's index in the peer's namespace).
    pub parent: Option<u32>,
    /// `IFLA_OPERSTATE` (RFC 2863: 6 up, 2 down, 0 unknown).
    pub operstate: Option<u8>,
}

/// Every link of the caller's network namespace.
///
/// # Errors
///
/// The OS error from the netlink socket, or `InvalidData` for a reply that
/// does not parse.
pub fn links() -> io::Result<Vec<Link>> {
    let sock = nl::Socket::route()?;
    // Any family, any link.
    sock.send(&nl::request(
        libc::RTM_GETLINK,
        libc::NLM_F_DUMP as u16,
        &[0u8; IFINFOMSG],
    ))?;
    let mut out = Vec::new();
    sock.replies(|kind, body| {
        if kind == libc::RTM_NEWLINK {
            out.push(parse_link(body)?);
        }
        Ok(false)
    })?;
    Ok(out)
}

const IFINFOMSG: usize = 16;

fn parse_link(body: &[u8]) -> io::Result<Link> {
    if body.len() < IFINFOMSG {
        return Err(nl::bad("a link message shorter than ifinfomsg"));
    }
    let mut link = Link {
        link_type: nl::u16_at(body, 2),
        index: nl::u32_at(body, 4),
        ..Link::default()
    };
    for (ty, value) in nl::attrs(&body[IFINFOMSG..]) {
        match ty {
            libc::IFLA_IFNAME => link.name = nl::c_string(value),
            libc::IFLA_MASTER => link.master = nl::u32_of(value),
            libc::IFLA_MTU => link.mtu = nl::u32_of(value),
            libc::IFLA_LINK => link.parent = nl::u32_of(value),
            libc::IFLA_OPERSTATE => link.operstate = value.first().copied(),
            libc::IFLA_LINKINFO => {
                for (inner, v) in nl::attrs(value) {
                    if inner == libc::IFLA_INFO_KIND {
                        link.kind = Some(nl::c_string(v));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(link)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::nl::tests::message;
    use crate::nl::{attr, walk};

    fn parse_messages(d: &[u8], out: &mut Vec<Link>) -> io::Result<bool> {
        walk(d, &mut |kind, body| {
            if kind == libc::RTM_NEWLINK {
                out.push(parse_link(body)?);
            }
            Ok(false)
        })
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
                ..Link::default()
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
