//! Which of this host's addresses a client on another host could reach, for
//! `--listen all` and for the portals a target advertises.
//!
//! A storage host usually carries addresses no client can use: IPv4 and
//! IPv6 link-local ones, the bridges container runtimes and hypervisors
//! make for their guests (docker0, br-*, virbr0, cni0) and the ports
//! enslaved to them, and VPN tunnels. Advertising them costs every client
//! a dial that never answers, on every reconnect. What an interface is
//! comes from rtnetlink ([`IfaceKind::of`]); the decision is a pure function
//! of that ([`unreachable_reason`]) so it is tested without such
//! interfaces.
//!
//! This module decides nothing for an interface named explicitly
//! (`--listen docker0`): the operator's word wins there.

use std::net::IpAddr;

use crate::link::Link;
use crate::IfaceAddr;

/// What the kernel says about one interface ([`crate::link::links`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IfaceKind {
    /// The link kind (bridge, veth, tun, wireguard, bond, vlan, ...);
    /// absent for a physical NIC.
    pub kind: Option<String>,
    /// The `ARPHRD_*` link type (1 Ethernet, 65534 none).
    pub link_type: Option<u16>,
    /// The interface this one is enslaved to (bridge or bond port).
    pub master: Option<String>,
}

/// `ARPHRD_NONE`: a link with no hardware header, as layer-3 tunnels are.
const ARPHRD_NONE: u16 = 65534;

/// Interface name prefixes of bridges made by container runtimes and
/// hypervisors (docker, podman, libvirt, CNI plugins, LXC/LXD, VMware,
/// VirtualBox, flannel, calico).
const GUEST_BRIDGES: &[&str] = &[
    "docker",
    "br-",
    "virbr",
    "cni",
    "podman",
    "lxcbr",
    "lxdbr",
    "vmnet",
    "vboxnet",
    "flannel",
    "cali",
    "kube-bridge",
    "weave",
];

impl IfaceKind {
    /// The kind of interface `name` among `links`; an interface the dump
    /// does not describe is treated as a plain NIC.
    pub fn of(links: &[Link], name: &str) -> Self {
        let Some(link) = links.iter().find(|l| l.name == name) else {
            return Self::default();
        };
        Self {
            kind: link.kind.clone(),
            link_type: Some(link.link_type),
            master: link
                .master
                .and_then(|m| links.iter().find(|l| l.index == m))
                .map(|m| m.name.clone()),
        }
    }
}

/// Why a client on another host could not reach `addr`, or `None` when it
/// could. `kind` describes `addr`'s interface, `master_kind` the interface
/// it is enslaved to, if any.
pub fn unreachable_reason(
    addr: &IfaceAddr,
    kind: &IfaceKind,
    master_kind: Option<&IfaceKind>,
) -> Option<String> {
    if link_local(addr.ip) {
        return Some("a link-local address, which clients cannot route to".into());
    }
    if let Some(why) = guest_bridge(&addr.iface, kind) {
        return Some(why);
    }
    if let (Some(master), Some(mk)) = (&kind.master, master_kind) {
        if let Some(why) = guest_bridge(master, mk) {
            return Some(format!("enslaved to {master}, {why}"));
        }
    }
    if kind.kind.as_deref() == Some("wireguard") {
        return Some("a WireGuard tunnel".into());
    }
    if kind.kind.as_deref() == Some("tun") {
        return Some("a tun/tap device (a VPN or a guest's link)".into());
    }
    if kind.link_type == Some(ARPHRD_NONE) {
        return Some("a layer-3 tunnel".into());
    }
    None
}

/// Whether `ip` is link-local (169.254.0.0/16, fe80::/10).
pub fn link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

fn guest_bridge(name: &str, kind: &IfaceKind) -> Option<String> {
    let named = GUEST_BRIDGES.iter().any(|p| name.starts_with(p));
    // A bridge an operator made (br0, lan) is a storage network like any
    // other; only the names guest tooling gives its bridges are left out.
    // veth ends called cali*/weave* are such tooling's too.
    named.then(|| match kind.kind.as_deref() {
        Some("bridge") => "a bridge made by a container runtime or hypervisor".to_owned(),
        _ => "an interface made by a container runtime or hypervisor".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(iface: &str, ip: &str) -> IfaceAddr {
        IfaceAddr {
            iface: iface.into(),
            ip: ip.parse().unwrap(),
            prefix: Some(24),
            up: true,
            loopback: false,
        }
    }

    fn bridge() -> IfaceKind {
        IfaceKind {
            kind: Some("bridge".into()),
            link_type: Some(1),
            ..Default::default()
        }
    }

    #[test]
    fn a_plain_nic_or_veth_with_an_address_is_reachable() {
        let ether = IfaceKind {
            link_type: Some(1),
            ..Default::default()
        };
        assert_eq!(
            unreachable_reason(&addr("eth1", "10.0.1.5"), &ether, None),
            None
        );
        assert_eq!(
            unreachable_reason(&addr("brs1", "10.77.1.1"), &ether, None),
            None
        );
        // An operator's own bridge is a storage network.
        assert_eq!(
            unreachable_reason(&addr("br0", "10.0.1.5"), &bridge(), None),
            None
        );
    }

    #[test]
    fn link_local_addresses_are_left_out() {
        let ether = IfaceKind::default();
        let why = unreachable_reason(&addr("eth1", "169.254.7.1"), &ether, None).unwrap();
        assert!(why.contains("link-local"), "{why}");
        assert!(unreachable_reason(&addr("eth1", "fe80::1"), &ether, None).is_some());
        assert!(!link_local("169.255.0.1".parse().unwrap()));
        assert!(!link_local("fec0::1".parse().unwrap()));
    }

    #[test]
    fn guest_bridges_and_their_ports_are_left_out() {
        for name in [
            "docker0",
            "br-3f2a9c1d4e5b",
            "virbr0",
            "cni0",
            "podman0",
            "lxdbr0",
        ] {
            let why = unreachable_reason(&addr(name, "172.17.0.1"), &bridge(), None);
            assert!(why.unwrap().contains("container runtime"), "{name}");
        }
        let port = IfaceKind {
            master: Some("docker0".into()),
            ..Default::default()
        };
        let why = unreachable_reason(&addr("veth1a2b", "172.17.0.9"), &port, Some(&bridge()));
        assert!(why.unwrap().starts_with("enslaved to docker0"));
        // A port of an operator's bridge stays.
        let port = IfaceKind {
            master: Some("br0".into()),
            ..Default::default()
        };
        assert_eq!(
            unreachable_reason(&addr("eth2", "10.0.2.5"), &port, Some(&bridge())),
            None
        );
    }

    #[test]
    fn tunnels_are_left_out() {
        let wg = IfaceKind {
            kind: Some("wireguard".into()),
            link_type: Some(ARPHRD_NONE),
            ..Default::default()
        };
        assert!(unreachable_reason(&addr("wg0", "10.8.0.1"), &wg, None)
            .unwrap()
            .contains("WireGuard"));
        let tun = IfaceKind {
            kind: Some("tun".into()),
            link_type: Some(ARPHRD_NONE),
            ..Default::default()
        };
        assert!(unreachable_reason(&addr("tun0", "10.9.0.1"), &tun, None)
            .unwrap()
            .contains("tun"));
        let gre = IfaceKind {
            link_type: Some(ARPHRD_NONE),
            ..Default::default()
        };
        assert!(unreachable_reason(&addr("x0", "10.9.0.1"), &gre, None).is_some());
    }

    #[test]
    fn kinds_come_from_the_link_dump() {
        let links = vec![
            Link {
                index: 3,
                name: "docker0".into(),
                link_type: 1,
                kind: Some("bridge".into()),
                master: None,
                ..Link::default()
            },
            Link {
                index: 7,
                name: "vethc0".into(),
                link_type: 1,
                kind: Some("veth".into()),
                master: Some(3),
                ..Link::default()
            },
        ];
        let port = IfaceKind::of(&links, "vethc0");
        assert_eq!(port.master.as_deref(), Some("docker0"));
        assert_eq!(port.kind.as_deref(), Some("veth"));
        assert_eq!(IfaceKind::of(&links, "eth9"), IfaceKind::default());
    }
}
