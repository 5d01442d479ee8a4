//! Reading the live host for the path checks: links with their addresses,
//! shaping, offloads and speed (rtnetlink, getifaddrs, the ethtool ioctl,
//! sysfs), the sysctls that decide ARP, reverse-path filtering and TCP
//! buffers (`/proc/sys`), and the kernel's route for each path
//! (`RTM_GETROUTE`). Everything here answers for the caller's network
//! namespace.

use std::io;
use std::net::IpAddr;

use braid_initiator::conn::Local;
use braid_initiator::discover::PathSpec;
use braid_initiator::Endpoint;

use crate::nic;
use crate::paths::{LinkSeen, Links, RouteSeen};
use crate::root::Root;
use crate::tcp::{self, Sysctls};

/// Every link of this namespace.
///
/// # Errors
///
/// Netlink or getifaddrs failed.
pub fn links(root: &Root) -> io::Result<Links> {
    let all = braid_netif::link::links()?;
    let addrs = braid_netif::addrs()?;
    let qdiscs = braid_netif::qdisc::qdiscs().unwrap_or_default();
    let name_of = |i: u32| all.iter().find(|l| l.index == i).map(|l| l.name.clone());
    let mut out = Links::new();
    for l in &all {
        let stacked = matches!(l.kind.as_deref(), Some("vlan" | "macvlan" | "ipvlan"));
        let sysfs = nic::read(root, &l.name);
        let physical = sysfs.as_ref().is_some_and(|i| i.physical);
        out.insert(
            l.name.clone(),
            LinkSeen {
                name: l.name.clone(),
                index: l.index,
                kind: l.kind.clone(),
                master: l.master.and_then(name_of),
                lower: if stacked {
                    l.parent.and_then(name_of)
                } else {
                    None
                },
                mtu: l.mtu,
                shaped: braid_netif::qdisc::shaped_rate(&qdiscs, l.index),
                speed_mbps: if physical {
                    sysfs.and_then(|i| i.speed)
                } else {
                    None
                },
                offloads: braid_netif::ethtool::offloads(&l.name).ok(),
                addrs: addrs
                    .iter()
                    .filter(|a| a.iface == l.name)
                    .filter_map(|a| Some((a.ip, a.prefix?)))
                    .collect(),
            },
        );
    }
    Ok(out)
}

/// The sysctls the checks read, for `all` and each interface given.
pub fn sysctls(root: &Root, ifaces: &[String]) -> Sysctls {
    let mut keys = vec![
        tcp::RMEM.to_owned(),
        tcp::WMEM.to_owned(),
        tcp::ADV_WIN_SCALE.to_owned(),
        tcp::CC.to_owned(),
        tcp::CC_AVAILABLE.to_owned(),
    ];
    for i in std::iter::once("all").chain(ifaces.iter().map(String::as_str)) {
        for k in ["arp_ignore", "arp_announce", "rp_filter"] {
            keys.push(format!("/proc/sys/net/ipv4/conf/{i}/{k}"));
        }
    }
    keys.into_iter()
        .filter_map(|k| {
            let v = root.read(&k)?;
            // Multi-value files use tabs; show them as `sysctl` does.
            Some((k, v.split_whitespace().collect::<Vec<_>>().join(" ")))
        })
        .collect()
}

/// The route a path's socket gets (destination, its source address, its
/// bound device) and, for a path bound to a device, the route its source
/// address alone gets.
pub fn routes(spec: &PathSpec, links: &Links) -> (Result<RouteSeen, String>, Option<RouteSeen>) {
    let Endpoint::Tcp(portal) = &spec.portal else {
        return (Err("a unix socket has no route".into()), None);
    };
    let Local { device, addr } = &spec.local;
    let oif = match device {
        Some(d) => match links.get(d) {
            Some(l) => Some(l.index),
            None => return (Err(format!("no interface {d}")), None),
        },
        None => None,
    };
    let bound = ask(portal.ip(), *addr, oif.zip(device.clone()), links);
    let source = match (device, addr) {
        (Some(_), Some(_)) => ask(portal.ip(), *addr, None, links).ok(),
        _ => None,
    };
    (bound, source)
}

fn ask(
    dst: IpAddr,
    src: Option<IpAddr>,
    oif: Option<(u32, String)>,
    links: &Links,
) -> Result<RouteSeen, String> {
    let mut query = format!("ip route get {dst}");
    if let Some(s) = src {
        query.push_str(&format!(" from {s}"));
    }
    if let Some((_, d)) = &oif {
        query.push_str(&format!(" oif {d}"));
    }
    let r = braid_netif::route::get(dst, src, oif.map(|(i, _)| i))
        .map_err(|e| format!("{query}: {e}"))?;
    let dev = r
        .oif
        .and_then(|i| links.values().find(|l| l.index == i))
        .map_or_else(|| format!("if{}", r.oif.unwrap_or(0)), |l| l.name.clone());
    Ok(RouteSeen {
        query,
        dev,
        src: r.prefsrc.or(src),
        gateway: r.gateway,
        table: r.table,
        congctl: r.congctl,
    })
}
