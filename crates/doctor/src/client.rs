//! The client's side: the paths braid would open to each volume (found as
//! `braid attach` finds them), what the host shows of each, a short probe,
//! and every check over that; then the NICs those paths use and the
//! kernel's block path.

use std::time::Duration;

use braid_initiator::discover::{self, PathSpec};
use braid_initiator::{Endpoint, NbdUri, VolumeConfig, VolumeUri};

use crate::finding::{Finding, Fix, Report, Severity, Subject};
use crate::paths::{self, Links, PathFacts};
use crate::root::Root;
use crate::{gather, icmp, kernel, nic, probe, serve, subnet, tcp};

/// What to check on a client.
#[derive(Clone, Debug, Default)]
pub struct ClientScope {
    pub volumes: Vec<VolumeConfig>,
    /// How long all probes may read together; `None` skips the probe.
    pub probe_budget: Option<Duration>,
}

/// The whole probe's default length: a few seconds, shared by the paths.
pub const PROBE_BUDGET: Duration = Duration::from_secs(4);

/// Checks the client seen through `root`. Under a captured tree only the
/// kernel path and the NICs are checked: routes, echoes and probes need
/// the live host.
pub fn check(root: &Root, scope: &ClientScope) -> Report {
    let no_path = scope
        .volumes
        .iter()
        .map(|v| v.no_path_timeout)
        .min_by_key(|t| t.unwrap_or(Duration::MAX))
        .unwrap_or(Some(Duration::from_secs(60)));
    let mut findings = Vec::new();
    if root.is_host() {
        findings.extend(live(root, scope));
    } else {
        findings.extend(serve::check_nics(root, &[]));
    }
    findings.extend(kernel::check(root, no_path));
    Report { findings }
}

fn live(root: &Root, scope: &ClientScope) -> Vec<Finding> {
    let mut out = Vec::new();
    let links = match gather::links(root) {
        Ok(l) => l,
        Err(e) => {
            out.push(
                Finding::new(
                    "netlink",
                    Severity::Fail,
                    Subject::Host,
                    format!("cannot list this host's links: {e}"),
                )
                .read("rtnetlink RTM_GETLINK", e.to_string()),
            );
            return out;
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            out.push(Finding::new(
                "probe",
                Severity::Fail,
                Subject::Host,
                format!("cannot start the probe's runtime: {e}"),
            ));
            return out;
        }
    };
    let mut used: Vec<String> = Vec::new();
    let mut all_paths = Vec::new();
    for cfg in &scope.volumes {
        let VolumeUri::Nbd(uri) = &cfg.uri else {
            out.push(Finding::new(
                "discovery",
                Severity::Warn,
                volume(cfg),
                "an iSCSI volume: these path checks speak NBD and were not run; \
                 `braid bench URI` shows what each of its paths carries"
                    .to_owned(),
            ));
            continue;
        };
        let (specs, export, tls) = match rt.block_on(braid_initiator::plan(cfg)) {
            Ok(plan) => {
                out.push(
                    Finding::ok(
                        "discovery",
                        volume(cfg),
                        format!("{} path(s) to {}", plan.paths.len(), uri.export),
                    )
                    .read(
                        format!("NBD handshake with {}", uri.endpoint),
                        format!(
                            "{} portal(s) advertised, size {}",
                            plan.discovery.portals.len(),
                            plan.discovery.export.size
                        ),
                    ),
                );
                (plan.paths, uri.export.clone(), plan.tls)
            }
            Err(e) => {
                out.push(
                    Finding::new(
                        "discovery",
                        Severity::Fail,
                        volume(cfg),
                        format!(
                            "cannot ask {} about the volume: {}; checking the paths the flags \
                             name instead",
                            uri.endpoint,
                            braid_initiator::conn::chain(&e)
                        ),
                    )
                    .fix(Fix::Manual(
                        "check that braid serve runs there and that this host reaches it".into(),
                    )),
                );
                (fallback_paths(cfg, uri), uri.export.clone(), None)
            }
        };
        let per_path = scope.probe_budget.map(|b| {
            (b / u32::try_from(specs.len().max(1)).unwrap_or(u32::MAX))
                .clamp(Duration::from_millis(500), Duration::from_secs(1))
        });
        let mut facts = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            let f = path_facts(i + 1, spec, &links, &export, tls.as_ref(), per_path, &rt);
            for d in f
                .route
                .iter()
                .map(|r| r.dev.clone())
                .chain(f.device.clone())
            {
                if !used.contains(&d) {
                    used.push(d);
                }
            }
            facts.push(f);
        }
        all_paths.push(facts);
    }
    let sysctl = gather::sysctls(root, &used);
    let window = tcp::max_window(&sysctl);
    for facts in &all_paths {
        for p in facts {
            out.push(paths::route(p, &links));
            out.extend(subnet::source_routing(p, &links));
            out.extend(paths::mtu(p, &links));
            out.extend(tcp::buffers(p, &links, &sysctl));
            out.extend(tcp::congestion(p, &sysctl));
            out.extend(paths::throughput(p, &links, window));
        }
        out.extend(paths::shared(facts, &links));
        out.extend(paths::balance(facts, &links));
    }
    out.extend(subnet::arp(&links, &used, &sysctl));
    let cpus = nic::cpus_online(root).unwrap_or(1);
    for name in &used {
        if let Some(l) = links.get(name) {
            let physical = nic::read(root, name).is_some_and(|i| i.physical);
            out.extend(offloads(l, physical));
        }
        let mut nics = vec![name.clone()];
        nics.extend(nic::bond_slaves(root, name));
        for n in nics {
            if let Some(i) = nic::read(root, &n) {
                out.extend(nic::check_bond(root, &i));
                out.extend(nic::check_link(&i));
                out.extend(nic::check_irq(root, &i, cpus));
            }
        }
    }
    out
}

fn volume(cfg: &VolumeConfig) -> Subject {
    Subject::Volume(cfg.uri.to_string())
}

/// Without discovery: the portals named (or the URI's), paired with the
/// local sides as braid pairs them.
fn fallback_paths(cfg: &VolumeConfig, uri: &NbdUri) -> Vec<PathSpec> {
    let portals: Vec<Endpoint> = if cfg.portals.is_empty() {
        vec![uri.endpoint.clone()]
    } else {
        cfg.portals.iter().copied().map(Endpoint::Tcp).collect()
    };
    let locals = discover::resolve_locals(&cfg.locals).unwrap_or_default();
    discover::pair(&locals, &portals)
}

fn path_facts(
    index: usize,
    spec: &PathSpec,
    links: &Links,
    export: &str,
    tls: Option<&braid_initiator::conn::TlsClient>,
    probe_time: Option<Duration>,
    rt: &tokio::runtime::Runtime,
) -> PathFacts {
    let (route, source_route) = gather::routes(spec, links);
    let portal = match &spec.portal {
        Endpoint::Tcp(a) => *a,
        Endpoint::Unix(_) => std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
    };
    let echo = route.as_ref().ok().map(|r| {
        let mtu = links.get(&r.dev).and_then(|l| l.mtu).unwrap_or(1500);
        icmp::probe(
            portal.ip(),
            spec.local.addr,
            spec.local.device.as_deref(),
            mtu,
        )
    });
    let probe = probe_time.map(|t| rt.block_on(probe::read(spec, export, tls, t)));
    PathFacts {
        index,
        via: spec.to_string(),
        portal,
        local_addr: spec.local.addr,
        device: spec.local.device.clone(),
        route,
        source_route,
        echo,
        probe,
    }
}

/// TSO, GSO and GRO of an interface a path uses.
fn offloads(l: &paths::LinkSeen, physical: bool) -> Option<Finding> {
    let o = l.offloads?;
    // GRO is the NIC driver's receive path; a veth or tunnel hands its
    // peer whole GSO packets with or without it.
    let gro = if physical { o.gro } else { None };
    let off: Vec<&str> = [("tso", o.tso), ("gso", o.gso), ("gro", gro)]
        .into_iter()
        .filter(|(_, on)| *on == Some(false))
        .map(|(n, _)| n)
        .collect();
    let show = |v: Option<bool>| match v {
        Some(true) => "on",
        Some(false) => "off",
        None => "?",
    };
    let mut f = Finding::ok(
        "offloads",
        Subject::Interface(l.name.clone()),
        if physical {
            "TSO, GSO and GRO are on"
        } else {
            "TSO and GSO are on (GRO is judged on NICs only)"
        },
    )
    .read(
        format!("ethtool ioctl SIOCETHTOOL on {} (ethtool -k)", l.name),
        format!(
            "tso {}, gso {}, gro {}",
            show(o.tso),
            show(o.gso),
            show(o.gro)
        ),
    );
    if off.is_empty() {
        return Some(f);
    }
    f.severity = Severity::Warn;
    f.why = format!(
        "{} off on {}: every segment then takes its own trip through the network stack, \
         and at 10 Gb/s that is most of a core, so the CPU, not the link, limits the path",
        off.join("/"),
        l.name
    );
    let args: Vec<String> = off.iter().map(|o| format!("{o} on")).collect();
    Some(f.fix(Fix::Run(format!(
        "ethtool -K {} {}",
        l.name,
        args.join(" ")
    ))))
}
