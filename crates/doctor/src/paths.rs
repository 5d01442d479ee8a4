//! A client's paths: what was seen of each (the route the kernel uses, the
//! interface it leaves by, echoes, the probe) and the checks over it that
//! need no I/O: the route against the binding, paths that share a link,
//! the MTU each end uses against what the path carries, and the probe's
//! throughput against the link and against the other paths.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use braid_netif::ethtool::Offloads;

use crate::finding::{Finding, Fix, Severity, Subject};
use crate::icmp::Echo;
use crate::probe::Measured;
use crate::units;

/// One path as seen on this host.
#[derive(Clone, Debug, PartialEq)]
pub struct PathFacts {
    pub index: usize,
    /// `local → portal`, as braid names the path.
    pub via: String,
    pub portal: SocketAddr,
    /// The source address braid binds, if any.
    pub local_addr: Option<IpAddr>,
    /// The device braid binds with SO_BINDTODEVICE, if any.
    pub device: Option<String>,
    /// The kernel's route for the path's socket (destination, source and
    /// device as braid sets them), or why there is none.
    pub route: Result<RouteSeen, String>,
    /// For a path bound to a device: the route a socket with only the
    /// source address would get (what policy routing does for it).
    pub source_route: Option<RouteSeen>,
    pub echo: Option<Echo>,
    pub probe: Option<Measured>,
}

impl PathFacts {
    pub fn subject(&self) -> Subject {
        Subject::Path {
            index: self.index,
            via: self.via.clone(),
        }
    }
}

/// A route as the kernel answered it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteSeen {
    /// The question, as `ip route get` would be asked it.
    pub query: String,
    pub dev: String,
    pub src: Option<IpAddr>,
    pub gateway: Option<IpAddr>,
    pub table: Option<u32>,
    pub congctl: Option<String>,
}

impl RouteSeen {
    /// The answer as `ip route get` prints it.
    pub fn answer(&self) -> String {
        let mut s = format!("dev {}", self.dev);
        if let Some(g) = self.gateway {
            s.push_str(&format!(" via {g}"));
        }
        if let Some(src) = self.src {
            s.push_str(&format!(" src {src}"));
        }
        match self.table {
            Some(254) | None => {}
            Some(t) => s.push_str(&format!(" table {t}")),
        }
        if let Some(c) = &self.congctl {
            s.push_str(&format!(" congctl {c}"));
        }
        s
    }

    fn evidence(&self) -> (String, String) {
        (
            format!("rtnetlink RTM_GETROUTE ({})", self.query),
            self.answer(),
        )
    }
}

/// One interface as netlink, ethtool and sysfs describe it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkSeen {
    pub name: String,
    pub index: u32,
    /// `veth`, `bond`, `vlan`, ...; `None` for a NIC.
    pub kind: Option<String>,
    /// The bond or bridge it is enslaved to.
    pub master: Option<String>,
    /// For a VLAN or macvlan: the NIC under it.
    pub lower: Option<String>,
    pub mtu: Option<u32>,
    /// A tbf rate on it: bits/s and per-packet overhead.
    pub shaped: Option<(u64, u16)>,
    /// Negotiated speed of a NIC, Mb/s (sysfs).
    pub speed_mbps: Option<u32>,
    pub offloads: Option<Offloads>,
    /// IPv4 and IPv6 addresses with their prefix length.
    pub addrs: Vec<(IpAddr, u8)>,
}

impl LinkSeen {
    /// What the link can carry, bits per second: its shaping if shaped,
    /// else a NIC's negotiated speed.
    pub fn rate_bits(&self) -> Option<u64> {
        self.shaped
            .map(|(r, _)| r)
            .or(self.speed_mbps.map(|s| u64::from(s) * 1_000_000))
    }

    /// How the rate was known, for evidence.
    pub fn rate_evidence(&self) -> Option<(String, String)> {
        if let Some((r, o)) = self.shaped {
            return Some((
                format!("rtnetlink RTM_GETQDISC (tc qdisc show dev {})", self.name),
                format!("tbf rate {} overhead {o}", units::bits_per_s(r)),
            ));
        }
        self.speed_mbps
            .map(|s| (format!("/sys/class/net/{}/speed", self.name), s.to_string()))
    }

    /// Whether `ip` lies in one of this link's subnets; the address and
    /// prefix if so.
    pub fn subnet_of(&self, ip: IpAddr) -> Option<(IpAddr, u8)> {
        self.addrs
            .iter()
            .copied()
            .find(|(a, p)| same_subnet(*a, *p, ip))
    }
}

/// Whether `b` is in `a/prefix`.
pub fn same_subnet(a: IpAddr, prefix: u8, b: IpAddr) -> bool {
    braid_netif::IfaceAddr {
        iface: String::new(),
        ip: a,
        prefix: Some(prefix),
        up: true,
        loopback: false,
    }
    .same_subnet(b)
}

/// `a/prefix` with the host bits cleared: `10.0.1.0/24`.
pub fn network(a: IpAddr, prefix: u8) -> String {
    match a {
        IpAddr::V4(v4) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(prefix.min(32)))
                .unwrap_or(0);
            format!(
                "{}/{prefix}",
                std::net::Ipv4Addr::from(u32::from(v4) & mask)
            )
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(prefix.min(128)))
                .unwrap_or(0);
            format!(
                "{}/{prefix}",
                std::net::Ipv6Addr::from(u128::from(v6) & mask)
            )
        }
    }
}

/// The links by name.
pub type Links = BTreeMap<String, LinkSeen>;

/// The interface that has `ip`.
pub fn owner(links: &Links, ip: IpAddr) -> Option<&LinkSeen> {
    links
        .values()
        .find(|l| l.addrs.iter().any(|(a, _)| *a == ip))
}

/// The interface a path should leave by, and the route that would make it
/// do so: the one whose subnet holds the portal (a connected network),
/// preferring the one that owns the path's source address.
fn home<'a>(p: &PathFacts, links: &'a Links) -> Option<(&'a LinkSeen, IpAddr, u8)> {
    let dst = p.portal.ip();
    if let Some(l) = p.device.as_ref().and_then(|d| links.get(d)) {
        return l.subnet_of(dst).map(|(a, n)| (l, a, n));
    }
    if let Some(l) = p.local_addr.and_then(|a| owner(links, a)) {
        return l.subnet_of(dst).map(|(a, n)| (l, a, n));
    }
    let mut on_link = links
        .values()
        .filter_map(|l| l.subnet_of(dst).map(|(a, n)| (l, a, n)));
    let first = on_link.next()?;
    // Several NICs in the portal's subnet: no one of them is the answer.
    on_link.next().is_none().then_some(first)
}

/// The route check of one path: it leaves by the interface it is bound to
/// (or that owns its source address).
pub fn route(p: &PathFacts, links: &Links) -> Finding {
    let subject = p.subject();
    let r = match &p.route {
        Ok(r) => r,
        Err(e) => {
            return Finding::new(
                "route",
                Severity::Fail,
                subject,
                format!("the kernel has no route for this path: {e}"),
            )
            .read("rtnetlink RTM_GETROUTE", e.clone())
            .fix(Fix::Manual(format!(
                "add a route to {} that leaves by the path's interface",
                p.portal.ip()
            )));
        }
    };
    let (src, ans) = r.evidence();
    let mut f = Finding::ok(
        "route",
        subject,
        format!(
            "leaves by {}{}",
            r.dev,
            r.src.map_or(String::new(), |s| format!(" from {s}"))
        ),
    )
    .read(src, ans);
    let want = p.device.clone().or_else(|| {
        p.local_addr
            .and_then(|a| owner(links, a))
            .map(|l| l.name.clone())
    });
    let Some(want) = want else {
        return f;
    };
    if want == r.dev {
        return f;
    }
    f.severity = Severity::Fail;
    f.why = format!(
        "path {} sends from {} but the kernel routes it out of {}, not {want}: its traffic \
         crosses {}'s link, whatever braid binds",
        p.index,
        p.local_addr.map_or(want.clone(), |a| a.to_string()),
        r.dev,
        r.dev
    );
    f.fix = Some(match home(p, links) {
        Some((l, addr, prefix)) if l.name == want => route_fix(l, addr, prefix, links),
        _ => Fix::Manual(format!(
            "add a route to {} by {want} (and, for addresses sharing a subnet, a rule by \
             source address)",
            p.portal.ip()
        )),
    });
    f
}

/// The commands that send a subnet out of `l`: a plain route when `l` is
/// the only NIC in the subnet, else a rule by source address and a table
/// of its own (numbered 1000 + the interface's index, so it is stable and
/// clear of the tables distributions use).
pub fn route_fix(l: &LinkSeen, addr: IpAddr, prefix: u8, links: &Links) -> Fix {
    let net = network(addr, prefix);
    let shared = links
        .values()
        .any(|o| o.name != l.name && o.addrs.iter().any(|(a, _)| same_subnet(addr, prefix, *a)));
    if !shared {
        return Fix::Run(format!("ip route replace {net} dev {} src {addr}", l.name));
    }
    let t = 1000 + l.index;
    Fix::commands([
        format!("ip route replace {net} dev {} src {addr} table {t}", l.name),
        format!(
            "ip rule del from {addr} lookup {t} pref {t} 2>/dev/null; ip rule add from {addr} \
             lookup {t} pref {t}"
        ),
    ])
}

/// Paths that leave by the same interface (or the same NIC under VLANs):
/// each path after the first that does gets a finding, with the route
/// that would send it by its own interface when one is there.
pub fn shared(paths: &[PathFacts], links: &Links) -> Vec<Finding> {
    let mut by_nic: BTreeMap<String, Vec<&PathFacts>> = BTreeMap::new();
    for p in paths {
        if let Ok(r) = &p.route {
            let nic = links
                .get(&r.dev)
                .and_then(|l| l.lower.clone())
                .unwrap_or_else(|| r.dev.clone());
            by_nic.entry(nic).or_default().push(p);
        }
    }
    let mut out = Vec::new();
    for (nic, group) in by_nic {
        if group.len() < 2 {
            if let Some(p) = group.first() {
                out.push(Finding::ok(
                    "shared-link",
                    p.subject(),
                    format!("the only path on {nic}"),
                ));
            }
            continue;
        }
        // The path that belongs on this NIC keeps it; the others move.
        let keeper = group
            .iter()
            .position(|p| home(p, links).is_some_and(|(l, _, _)| l.name == nic))
            .unwrap_or(0);
        let names = listing(group.iter().map(|p| p.index.to_string()).collect());
        for (i, p) in group.iter().enumerate() {
            let Ok(r) = &p.route else { continue };
            let (src, ans) = r.evidence();
            if i == keeper {
                out.push(
                    Finding::ok(
                        "shared-link",
                        p.subject(),
                        format!("{nic} is this path's own interface"),
                    )
                    .read(src, ans),
                );
                continue;
            }
            let fix = match home(p, links) {
                Some((l, addr, prefix)) if l.name != nic => route_fix(l, addr, prefix, links),
                _ => Fix::Manual(
                    "give each path its own NIC: braid ... --local IFACE for each, with a \
                     route to its portals by that NIC"
                        .into(),
                ),
            };
            out.push(
                Finding::new(
                    "shared-link",
                    Severity::Fail,
                    p.subject(),
                    format!(
                        "paths {names} leave by the same interface, {nic}: together they get \
                         one link's bandwidth, and one cable or port takes them all down"
                    ),
                )
                .read(src, ans)
                .fix(fix),
            );
        }
    }
    out
}

/// `1 and 2`, `1, 2 and 3`.
fn listing(mut v: Vec<String>) -> String {
    match v.len() {
        0 | 1 => v.pop().unwrap_or_default(),
        _ => {
            let last = v.pop().expect("two or more");
            format!("{} and {last}", v.join(", "))
        }
    }
}

/// The MTU of this end against what the path carries (largest
/// don't-fragment echo that came back) and what the other end announced
/// (the probe connection's MSS).
pub fn mtu(p: &PathFacts, links: &Links) -> Option<Finding> {
    let r = p.route.as_ref().ok()?;
    let link = links.get(&r.dev)?;
    let local = link.mtu?;
    let mut f = Finding::ok("mtu", p.subject(), format!("MTU {local} end to end"))
        .read(format!("/sys/class/net/{}/mtu", r.dev), local.to_string());
    let peer = p
        .probe
        .as_ref()
        .and_then(|m| m.tcp)
        .filter(|t| t.snd_mss > 0)
        .map(|t| {
            let header = if p.portal.is_ipv6() { 60 } else { 40 };
            let options = if t.timestamps { 12 } else { 0 };
            (t.snd_mss, t.snd_mss + header + options)
        });
    if let Some((mss, end)) = peer {
        f = f.read(
            "TCP_INFO of the probe's connection",
            format!("snd_mss {mss} (MTU {end} at the smaller end)"),
        );
    }
    match p.echo.as_ref() {
        Some(e) if e.carried.is_some() || !e.tried.is_empty() => {
            let tried: Vec<String> = e
                .tried
                .iter()
                .map(|(s, ok)| format!("{s}: {}", if *ok { "back" } else { "lost" }))
                .collect();
            let from = match (r.src, &p.device) {
                (Some(a), Some(d)) => format!("{a}%{d}"),
                (Some(a), None) => format!("{a} by {}", r.dev),
                (None, _) => r.dev.clone(),
            };
            f = f.read(
                format!(
                    "ICMP echo with don't-fragment to {} from {from}",
                    p.portal.ip()
                ),
                tried.join(", "),
            );
            if let Some(c) = e.carried.filter(|c| *c < local) {
                f.severity = Severity::Fail;
                f.why = format!(
                    "{} sends packets of up to {local} bytes but only {c} reach {}: one end \
                     uses jumbo frames and the other (or a switch between) does not; TCP may \
                     settle on the smaller segment, but anything larger is dropped without a \
                     word, which stalls connections that do not",
                    r.dev,
                    p.portal.ip()
                );
                f = f.fix(Fix::Run(format!("ip link set dev {} mtu {c}", r.dev)));
            } else if e.carried.is_none() {
                f.severity = Severity::Fail;
                f.why = format!(
                    "no don't-fragment echo of any size tried came back from {}",
                    p.portal.ip()
                );
            }
        }
        _ => {
            if let Some((_, end)) = peer.filter(|(_, end)| *end < local) {
                f.severity = Severity::Warn;
                f.why = format!(
                    "{} uses MTU {local} but the connection's segments fit MTU {end}: the \
                     other end (or a hop) uses a smaller MTU, and packets above it are \
                     dropped",
                    r.dev
                );
                f = f.fix(Fix::Run(format!("ip link set dev {} mtu {end}", r.dev)));
            }
        }
    }
    Some(f)
}

/// A path that carries far less than its link should: the probe's rate
/// against the link's, with the likely cause.
pub fn throughput(p: &PathFacts, links: &Links, window: Option<u64>) -> Option<Finding> {
    let m = p.probe.as_ref()?;
    let subject = p.subject();
    let probe_ev = |m: &Measured| {
        (
            "NBD READ probe over the path".to_owned(),
            format!(
                "{} ({} in {:.2} s)",
                m.rate().map_or("nothing read".into(), units::mbytes_per_s),
                units::bytes(m.bytes),
                m.secs
            ),
        )
    };
    if let Some(e) = &m.error {
        if m.bytes == 0 {
            return Some(
                Finding::new(
                    "path-probe",
                    Severity::Fail,
                    subject,
                    format!("reading over this path failed: {e}"),
                )
                .read("NBD READ probe over the path", e.clone())
                .fix(Fix::Manual(
                    "check that the portal answers on this path (braid status on the storage \
                     host lists its portals)"
                        .into(),
                )),
            );
        }
    }
    let rate = m.rate()?;
    let (ps, pv) = probe_ev(m);
    let mut f = Finding::ok(
        "path-throughput",
        subject,
        format!("carries {}", units::mbytes_per_s(rate)),
    )
    .read(ps, pv);
    if let Some(t) = m.tcp {
        f = f.read(
            "TCP_INFO of the probe's connection",
            format!(
                "min_rtt {}, retransmits {}, rcv_space {}",
                units::millis(f64::from(t.min_rtt_us) / 1000.0),
                t.retransmits,
                units::bytes(u64::from(t.rcv_space))
            ),
        );
    }
    let link = p.route.as_ref().ok().and_then(|r| links.get(&r.dev))?;
    let bits = link.rate_bits()?;
    if let Some((s, v)) = link.rate_evidence() {
        f = f.read(s, v);
    }
    // TCP over Ethernet carries about 94% of the line rate as payload.
    let expected = bits as f64 / 8.0 * 0.94;
    f.why = format!(
        "carries {} of the {} its link should",
        units::mbytes_per_s(rate),
        units::mbytes_per_s(expected)
    );
    if rate >= expected / 2.0 {
        return Some(f);
    }
    f.severity = Severity::Warn;
    let rtt = m
        .tcp
        .map(|t| f64::from(t.min_rtt_us) / 1e6)
        .filter(|r| *r > 0.0);
    let cause = match (window, rtt, m.tcp) {
        (Some(w), Some(rtt), _) if (w as f64 / rtt) < expected => format!(
            "its TCP receive window of at most {} over a {} round trip allows only {} \
             (see tcp-buffers)",
            units::bytes(w),
            units::millis(rtt * 1000.0),
            units::mbytes_per_s(w as f64 / rtt)
        ),
        (_, _, Some(t)) if t.retransmits > 0 => format!(
            "{} segments were retransmitted in {:.1} s: packets are lost on the way (duplex \
             mismatch, a bad cable, a full queue)",
            t.retransmits, m.secs
        ),
        _ => "the target's CPU or a slower hop beyond this link".to_owned(),
    };
    f.why = format!(
        "path {} carries {} on a {} link ({} expected); likely cause: {cause}",
        p.index,
        units::mbytes_per_s(rate),
        units::bits_per_s(bits),
        units::mbytes_per_s(expected)
    );
    f.fix = Some(Fix::Manual(format!(
        "see the other findings of path {} and of {}",
        p.index, link.name
    )));
    Some(f)
}

/// Paths far slower than the fastest: each one that carries less than
/// half of the best, with why its link is slower.
pub fn balance(paths: &[PathFacts], links: &Links) -> Vec<Finding> {
    let rates: Vec<(usize, f64)> = paths
        .iter()
        .enumerate()
        .filter_map(|(i, p)| Some((i, p.probe.as_ref()?.rate()?)))
        .collect();
    if rates.len() < 2 {
        return Vec::new();
    }
    let (best_i, best) = rates
        .iter()
        .copied()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .expect("two rates at least");
    let mut out = Vec::new();
    for (i, rate) in rates {
        let p = &paths[i];
        let mut f = Finding::ok(
            "path-balance",
            p.subject(),
            format!(
                "{} against the fastest path's {}",
                units::mbytes_per_s(rate),
                units::mbytes_per_s(best)
            ),
        )
        .read(
            "NBD READ probe, every path",
            paths
                .iter()
                .filter_map(|q| {
                    Some(format!(
                        "path {}: {}",
                        q.index,
                        units::mbytes_per_s(q.probe.as_ref()?.rate()?)
                    ))
                })
                .collect::<Vec<_>>()
                .join(", "),
        );
        if rate < best / 2.0 && i != best_i {
            let link = p.route.as_ref().ok().and_then(|r| links.get(&r.dev));
            if let Some((s, v)) = link.and_then(LinkSeen::rate_evidence) {
                f = f.read(s, v);
            }
            let cause = match link.and_then(|l| l.rate_bits().map(|b| (l, b))) {
                Some((l, b)) if (b as f64 / 8.0) < best => format!(
                    "its link {} is {}",
                    l.name,
                    if l.shaped.is_some() {
                        format!("shaped to {}", units::bits_per_s(b))
                    } else {
                        format!("negotiated at {}", units::bits_per_s(b))
                    }
                ),
                _ => "see its path-throughput finding".to_owned(),
            };
            f.severity = Severity::Warn;
            f.why = format!(
                "path {} carries {}, {:.0}% of path {}'s {}: braid's adaptive policy sizes \
                 each path's share by its speed, but round-robin and queue-depth policies \
                 wait for the slow path; {cause}",
                p.index,
                units::mbytes_per_s(rate),
                rate / best * 100.0,
                paths[best_i].index,
                units::mbytes_per_s(best)
            );
            f = f.fix(Fix::Manual(format!(
                "bring {} up to the others' speed (cable, switch port, shaping), or keep the \
                 adaptive policy",
                link.map_or("its link".to_owned(), |l| l.name.clone())
            )));
        }
        out.push(f);
    }
    out
}
