//! The storage host's side: each export's backing and the devices under
//! it, md arrays, and the NICs that carry (or could carry) portals.

use std::collections::BTreeSet;
use std::net::IpAddr;

use braid_netif::IfaceAddr;

use crate::block::{self, BlockDev};
use crate::export::{self, ExportRef};
use crate::finding::{Finding, Fix, Report, Severity, Subject};
use crate::md;
use crate::nic;
use crate::parse;
use crate::root::Root;
use crate::{gather, subnet};

/// What to look at on a storage host.
#[derive(Clone, Debug, Default)]
pub struct ServeScope {
    /// The exports; with none, every md array and its members.
    pub exports: Vec<ExportRef>,
    /// Interfaces that carry portals; with none, every interface that is
    /// up.
    pub portal_ifaces: Vec<String>,
    /// The portals' addresses (live host only), to hold against the
    /// host's.
    pub portals: Vec<IpAddr>,
}

/// Checks the storage host seen through `root`.
pub fn check(root: &Root, scope: &ServeScope) -> Report {
    let mut findings = Vec::new();
    let mut devices: Vec<BlockDev> = Vec::new();
    let add = |devices: &mut Vec<BlockDev>, top: &BlockDev| {
        for d in block::stack(root, top) {
            if devices.iter().all(|x| x.name != d.name) {
                devices.push(d);
            }
        }
    };
    for e in &scope.exports {
        let (f, dev) = export::check(root, e);
        findings.push(f);
        if let Some(d) = dev {
            add(&mut devices, &d);
        }
    }
    let arrays = md::arrays(root);
    if scope.exports.is_empty() {
        for a in &arrays {
            if let Some(d) = block::by_name(root, &a.name) {
                add(&mut devices, &d);
            }
        }
    }
    let mem_total = root
        .read_raw("/proc/meminfo")
        .and_then(|t| parse::mem_total_kib(&t))
        .map(|k| k * 1024);
    for d in &devices {
        if let Some(a) = arrays.iter().find(|a| a.name == d.name) {
            findings.extend(md::check(a, mem_total));
        }
        findings.extend(block::check_queue(root, d));
    }
    findings.extend(check_nics(root, &scope.portal_ifaces));
    if root.is_host() && !scope.portals.is_empty() {
        findings.extend(live_portals(root, scope));
    }
    Report { findings }
}

/// Portals against this host's interfaces, and the ARP settings of portal
/// interfaces that share a subnet.
fn live_portals(root: &Root, scope: &ServeScope) -> Vec<Finding> {
    let mut out = Vec::new();
    match braid_netif::addrs() {
        Ok(addrs) => {
            let (reachable, _) = braid_netif::reachable(&addrs);
            out.extend(portals(&reachable, &scope.portals));
        }
        Err(e) => out.push(Finding::new(
            "portal-per-nic",
            Severity::Fail,
            Subject::Host,
            format!("cannot list this host's addresses: {e}"),
        )),
    }
    if let Ok(links) = gather::links(root) {
        let sysctl = gather::sysctls(root, &scope.portal_ifaces);
        out.extend(subnet::arp(&links, &scope.portal_ifaces, &sysctl));
    }
    out
}

/// Each interface a client could reach this host by, against the portals:
/// one with no portal is a link no path uses.
pub fn portals(reachable: &[IfaceAddr], portals: &[IpAddr]) -> Vec<Finding> {
    if portals.iter().any(IpAddr::is_unspecified) {
        return Vec::new();
    }
    let shown: Vec<String> = portals.iter().map(ToString::to_string).collect();
    let mut ifaces: Vec<&str> = reachable.iter().map(|a| a.iface.as_str()).collect();
    ifaces.dedup();
    let mut out = Vec::new();
    for iface in ifaces {
        let mine: Vec<IpAddr> = reachable
            .iter()
            .filter(|a| a.iface == iface)
            .map(|a| a.ip)
            .collect();
        let served: Vec<String> = mine
            .iter()
            .filter(|a| portals.contains(a))
            .map(ToString::to_string)
            .collect();
        let list = mine
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" ");
        let mut f = Finding::ok(
            "portal-per-nic",
            Subject::Interface(iface.to_owned()),
            format!("serves portal {}", served.join(", ")),
        )
        .read(format!("getifaddrs ({iface})"), list.clone())
        .read("braid serve portals", shown.join(" "));
        if served.is_empty() {
            f.severity = Severity::Warn;
            f.why = format!(
                "{iface} has {list} but braid serves no portal on it: no client path can \
                 use its link, so clients get one link fewer than this host has"
            );
            f = f.fix(Fix::Manual(format!(
                "serve on it too: braid serve --listen {iface} (or add \"{iface}\" to listen \
                 in serve.toml)"
            )));
        }
        out.push(f);
    }
    out
}

/// Link and bond checks of the portal interfaces (and their bonds'
/// slaves), or of every interface that is up.
pub fn check_nics(root: &Root, only: &[String]) -> Vec<Finding> {
    let mut names: BTreeSet<String> = BTreeSet::new();
    if only.is_empty() {
        names.extend(
            nic::all(root)
                .into_iter()
                .filter(nic::Iface::up)
                .map(|i| i.name),
        );
    } else {
        names.extend(only.iter().cloned());
    }
    for n in names.clone() {
        names.extend(nic::bond_slaves(root, &n));
    }
    let cpus = nic::cpus_online(root).unwrap_or(1);
    let mut out = Vec::new();
    for n in &names {
        if let Some(i) = nic::read(root, n) {
            out.extend(nic::check_bond(root, &i));
            out.extend(nic::check_link(&i));
            out.extend(nic::check_irq(root, &i, cpus));
        }
    }
    out
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

    #[test]
    fn a_nic_without_a_portal_is_named() {
        let host = [addr("eth1", "10.0.1.5"), addr("eth2", "10.0.2.5")];
        let f = portals(&host, &["10.0.1.5".parse().unwrap()]);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].severity, Severity::Ok);
        assert_eq!(f[1].severity, Severity::Warn);
        assert_eq!(f[1].subject, Subject::Interface("eth2".into()));
        assert!(portals(&host, &["0.0.0.0".parse().unwrap()]).is_empty());
    }
}
