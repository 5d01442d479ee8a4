//! NICs that share a subnet: the settings that keep each address's
//! traffic on its own NIC. With the kernel's defaults a host answers ARP
//! for any of its addresses on every NIC and picks one NIC for everything
//! sent to the subnet ("ARP flux"), so two paths become one; strict
//! reverse-path filtering then drops what arrives on the other NIC.

use crate::finding::{Finding, Fix, Severity, Subject};
use crate::paths::{network, route_fix, same_subnet, Links, PathFacts};
use crate::tcp::Sysctls;

fn conf(iface: &str, key: &str) -> String {
    format!("/proc/sys/net/ipv4/conf/{iface}/{key}")
}

/// A sysctl key as `sysctl -w` takes it (a VLAN's dot becomes a slash).
fn key(iface: &str, name: &str) -> String {
    format!("net.ipv4.conf.{}.{name}", iface.replace('.', "/"))
}

/// The larger of `all` and the interface's value: how the kernel combines
/// arp_ignore, arp_announce and rp_filter (ip-sysctl.rst).
fn effective(sysctl: &Sysctls, iface: &str, name: &str) -> Option<(u8, u8, u8)> {
    let all: u8 = sysctl.get(&conf("all", name))?.parse().ok()?;
    let own: u8 = sysctl.get(&conf(iface, name))?.parse().ok()?;
    Some((all.max(own), all, own))
}

/// The other interfaces with an IPv4 address in one of `iface`'s subnets,
/// and that subnet.
pub fn neighbours(links: &Links, iface: &str) -> Option<(String, Vec<String>)> {
    let me = links.get(iface)?;
    for (a, p) in me.addrs.iter().filter(|(a, _)| a.is_ipv4()) {
        let others: Vec<String> = links
            .values()
            .filter(|o| o.name != iface)
            .filter(|o| o.addrs.iter().any(|(b, _)| same_subnet(*a, *p, *b)))
            .map(|o| o.name.clone())
            .collect();
        if !others.is_empty() {
            return Some((network(*a, *p), others));
        }
    }
    None
}

/// ARP and reverse-path settings of each interface in `used` that shares a
/// subnet with another.
pub fn arp(links: &Links, used: &[String], sysctl: &Sysctls) -> Vec<Finding> {
    let mut out = Vec::new();
    for iface in used {
        let Some((net, others)) = neighbours(links, iface) else {
            continue;
        };
        let subject = Subject::Interface(iface.clone());
        let together = format!("{iface} shares {net} with {}", others.join(", "));
        if let (Some(ig), Some(an)) = (
            effective(sysctl, iface, "arp_ignore"),
            effective(sysctl, iface, "arp_announce"),
        ) {
            let mut f = Finding::ok(
                "arp-flux",
                subject.clone(),
                format!("{together}; {iface} answers ARP only for its own addresses"),
            );
            for (name, (_, all, own)) in [("arp_ignore", ig), ("arp_announce", an)] {
                f = f
                    .read(conf("all", name), all.to_string())
                    .read(conf(iface, name), own.to_string());
            }
            let mut set = Vec::new();
            if ig.0 < 1 {
                set.push(format!("{}=1", key(iface, "arp_ignore")));
            }
            if an.0 < 2 {
                set.push(format!("{}=2", key(iface, "arp_announce")));
            }
            if !set.is_empty() {
                f.severity = Severity::Warn;
                f.why = format!(
                    "{together}, and {iface} answers ARP for every address of this host \
                     (arp_ignore {}) and announces any of them (arp_announce {}): peers learn \
                     one NIC's MAC for several addresses and send those paths into one link",
                    ig.0, an.0
                );
                f = f.fix(Fix::Run(format!("sysctl -w {}", set.join(" "))));
            }
            out.push(f);
        }
        if let Some((rp, all, own)) = effective(sysctl, iface, "rp_filter") {
            let mut f = Finding::ok(
                "rp-filter",
                subject,
                format!("rp_filter {rp}: replies arriving on the subnet's other NICs are kept"),
            )
            .read(conf("all", "rp_filter"), all.to_string())
            .read(conf(iface, "rp_filter"), own.to_string());
            if rp == 1 {
                f.severity = Severity::Warn;
                f.why = format!(
                    "{together}, and strict reverse-path filtering (rp_filter 1) drops a \
                     packet for {iface}'s address that arrives on another NIC of the subnet, \
                     so a path whose replies come in by the wrong NIC carries nothing"
                );
                let mut set = vec![format!("{}=2", key(iface, "rp_filter"))];
                if all == 1 {
                    set.insert(0, format!("{}=2", key("all", "rp_filter")));
                }
                f = f.fix(Fix::Run(format!("sysctl -w {}", set.join(" "))));
            }
            out.push(f);
        }
    }
    out
}

/// For a path bound to a device whose subnet it shares with another NIC:
/// whether traffic from its address that is not bound (the kernel's own
/// replies, other tools) also leaves by that device, which only a rule by
/// source address gives.
pub fn source_routing(p: &PathFacts, links: &Links) -> Option<Finding> {
    let dev = p.device.as_ref()?;
    let addr = p.local_addr?;
    neighbours(links, dev)?;
    let r = p.source_route.as_ref()?;
    let mut f = Finding::ok(
        "source-routing",
        p.subject(),
        format!("traffic from {addr} leaves by {dev} even when not bound to it"),
    )
    .read(format!("rtnetlink RTM_GETROUTE ({})", r.query), r.answer());
    if r.dev == *dev {
        return Some(f);
    }
    f.severity = Severity::Warn;
    f.why = format!(
        "braid binds this path to {dev}, but anything else sent from {addr} (the kernel's \
         own answers, tools that bind only an address) leaves by {}: with NICs sharing a \
         subnet, only a routing rule by source address keeps an address on its NIC",
        r.dev
    );
    let link = links.get(dev)?;
    let (a, prefix) = link.subnet_of(addr).unwrap_or((addr, 32));
    Some(f.fix(route_fix(link, a, prefix, links)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paths::LinkSeen;

    fn links() -> Links {
        let mk = |name: &str, index: u32, ip: &str| LinkSeen {
            name: name.into(),
            index,
            addrs: vec![(ip.parse().unwrap(), 24)],
            ..LinkSeen::default()
        };
        [
            mk("eth1", 3, "10.0.0.101"),
            mk("eth2", 4, "10.0.0.102"),
            mk("eth3", 5, "10.9.0.1"),
        ]
        .into_iter()
        .map(|l| (l.name.clone(), l))
        .collect()
    }

    fn sysctls(pairs: &[(&str, &str)]) -> Sysctls {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_flux_and_strict_rp_filter_warn_per_interface() {
        let l = links();
        let mut s = Vec::new();
        for i in ["all", "eth1", "eth2", "eth3"] {
            s.push((conf(i, "arp_ignore"), "0"));
            s.push((conf(i, "arp_announce"), "0"));
            s.push((conf(i, "rp_filter"), if i == "all" { "1" } else { "0" }));
        }
        let s: Vec<(&str, &str)> = s.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let f = arp(&l, &["eth1".into(), "eth3".into()], &sysctls(&s));
        // eth3 is alone in its subnet: nothing to say.
        assert!(f
            .iter()
            .all(|f| f.subject == Subject::Interface("eth1".into())));
        let flux = f.iter().find(|f| f.check == "arp-flux").unwrap();
        assert_eq!(flux.severity, Severity::Warn);
        assert_eq!(
            flux.fix,
            Some(Fix::Run(
                "sysctl -w net.ipv4.conf.eth1.arp_ignore=1 net.ipv4.conf.eth1.arp_announce=2"
                    .into()
            ))
        );
        let rp = f.iter().find(|f| f.check == "rp-filter").unwrap();
        assert_eq!(
            rp.fix,
            Some(Fix::Run(
                "sysctl -w net.ipv4.conf.all.rp_filter=2 net.ipv4.conf.eth1.rp_filter=2".into()
            ))
        );
    }

    #[test]
    fn source_rule_fix_uses_a_table_of_the_interface() {
        let l = links();
        let p = PathFacts {
            index: 2,
            via: "10.0.0.102%eth2 → 10.0.0.2:10809".into(),
            portal: "10.0.0.2:10809".parse().unwrap(),
            local_addr: Some("10.0.0.102".parse().unwrap()),
            device: Some("eth2".into()),
            route: Err("unused".into()),
            source_route: Some(crate::paths::RouteSeen {
                query: "ip route get 10.0.0.2 from 10.0.0.102".into(),
                dev: "eth1".into(),
                ..Default::default()
            }),
            echo: None,
            probe: None,
        };
        let f = source_routing(&p, &l).unwrap();
        assert_eq!(f.severity, Severity::Warn);
        let fix = f.fix.unwrap().to_string();
        assert!(
            fix.starts_with("ip route replace 10.0.0.0/24 dev eth2 src 10.0.0.102 table 1004\n"),
            "{fix}"
        );
        assert!(
            fix.contains("ip rule add from 10.0.0.102 lookup 1004 pref 1004"),
            "{fix}"
        );
    }
}
