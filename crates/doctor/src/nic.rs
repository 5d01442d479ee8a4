//! Network interfaces as `/sys/class/net` and `/proc/net/bonding` describe
//! them: negotiated speed and duplex, and bonds whose mode keeps a single
//! client on one link or reorders its segments.

use crate::finding::{Finding, Fix, Severity, Subject};
use crate::parse;
use crate::root::Root;
use crate::units;

/// One interface's sysfs facts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    /// `/sys/class/net/NAME`.
    pub sys: String,
    /// Backed by hardware (`device/` exists): a NIC, not a veth, bridge or
    /// bond.
    pub physical: bool,
    /// A bond master (`bonding/` exists).
    pub bond: bool,
    /// `operstate`: `up`, `down`, `unknown`, ...
    pub operstate: Option<String>,
    /// Mb/s; `None` when not reported (-1, EINVAL, virtual links).
    pub speed: Option<u32>,
    pub duplex: Option<String>,
    pub mtu: Option<u32>,
}

/// Reads one interface; `None` if it does not exist.
pub fn read(root: &Root, name: &str) -> Option<Iface> {
    let sys = format!("/sys/class/net/{name}");
    if !root.exists(&sys) {
        return None;
    }
    Some(Iface {
        name: name.to_owned(),
        physical: root.exists(&format!("{sys}/device")),
        bond: root.exists(&format!("{sys}/bonding")),
        operstate: root.read(&format!("{sys}/operstate")),
        speed: root
            .read(&format!("{sys}/speed"))
            .and_then(|s| s.parse::<i64>().ok())
            .and_then(|s| u32::try_from(s).ok())
            .filter(|s| *s > 0),
        duplex: root
            .read(&format!("{sys}/duplex"))
            .filter(|d| d != "unknown"),
        mtu: root.number(&format!("{sys}/mtu")),
        sys,
    })
}

/// Every interface but loopback.
pub fn all(root: &Root) -> Vec<Iface> {
    root.list("/sys/class/net")
        .into_iter()
        .filter(|n| n != "lo")
        .filter_map(|n| read(root, &n))
        .collect()
}

/// The slaves of a bond, from `bonding/slaves`.
pub fn bond_slaves(root: &Root, bond: &str) -> Vec<String> {
    root.read(&format!("/sys/class/net/{bond}/bonding/slaves"))
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

impl Iface {
    /// Up, or not saying (some drivers report `unknown` when up).
    pub fn up(&self) -> bool {
        matches!(self.operstate.as_deref(), Some("up" | "unknown") | None)
    }
}

/// Speed and duplex of a NIC. Virtual links report neither; they are
/// judged by what they carry (the live probe), not here.
pub fn check_link(i: &Iface) -> Vec<Finding> {
    let subject = Subject::Interface(i.name.clone());
    let mut out = Vec::new();
    if !i.physical {
        return out;
    }
    if let Some(speed) = i.speed {
        let mut f = Finding::ok(
            "link-speed",
            subject.clone(),
            format!(
                "negotiated {}",
                units::bits_per_s(u64::from(speed) * 1_000_000)
            ),
        )
        .read(format!("{}/speed", i.sys), speed.to_string());
        if speed < 1000 {
            f.severity = Severity::Warn;
            f.why = format!(
                "{} negotiated {speed} Mb/s: a path over it carries at most {} while a \
                 gigabit path carries 117 MB/s, and policies that share requests evenly \
                 slow to its pace; a worn cable, a bad patch or a port forced to a low \
                 speed are the usual causes",
                i.name,
                units::mbytes_per_s(f64::from(speed) * 1e6 / 8.0 * 0.94)
            );
            f = f.fix(Fix::Run(format!("ethtool -r {}", i.name)));
        }
        out.push(f);
    }
    if let Some(duplex) = &i.duplex {
        let mut f = Finding::ok("duplex", subject.clone(), format!("{duplex} duplex"))
            .read(format!("{}/duplex", i.sys), duplex.clone());
        if duplex == "half" {
            f.severity = Severity::Fail;
            f.why = format!(
                "{} runs half duplex: on a switched link that means one end was forced to a \
                 setting the other did not match, and every burst of a storage path then \
                 collides, is lost and is retransmitted after a timeout",
                i.name
            );
            f = f.fix(Fix::Run(format!("ethtool -s {} autoneg on", i.name)));
        }
        out.push(f);
    }
    out
}

/// A bond's mode and, for LACP, whether every slave joined the aggregate.
pub fn check_bond(root: &Root, i: &Iface) -> Vec<Finding> {
    if !i.bond {
        return Vec::new();
    }
    let subject = Subject::Interface(i.name.clone());
    let mode_path = format!("{}/bonding/mode", i.sys);
    let hash_path = format!("{}/bonding/xmit_hash_policy", i.sys);
    let proc_path = format!("/proc/net/bonding/{}", i.name);
    let mode_text = root.read(&mode_path);
    let info = root.read_raw(&proc_path).map(|t| parse::bonding(&t));
    let mode = mode_text
        .as_deref()
        .and_then(parse::first_word)
        .or_else(|| info.as_ref().map(|b| mode_from_proc(&b.mode)))
        .unwrap_or_default();
    let hash_text = root.read(&hash_path);
    let hash = hash_text
        .as_deref()
        .and_then(parse::first_word)
        .or_else(|| info.as_ref().and_then(|b| b.hash_policy.clone()));
    let slaves = bond_slaves(root, &i.name);
    let mut f = Finding::ok("bond-mode", subject.clone(), format!("{mode} bond"));
    match &mode_text {
        Some(t) => f = f.read(&mode_path, t.clone()),
        None => {
            if let Some(b) = &info {
                f = f.read(&proc_path, format!("Bonding Mode: {}", b.mode));
            }
        }
    }
    f = f.read(format!("{}/bonding/slaves", i.sys), slaves.join(" "));
    let hashes = matches!(mode.as_str(), "802.3ad" | "balance-xor");
    if hashes {
        if let Some(t) = &hash_text {
            f = f.read(&hash_path, t.clone());
        }
    }
    let list = slaves.join(", ");
    match mode.as_str() {
        "balance-rr" => {
            f.severity = Severity::Warn;
            f.why = format!(
                "balance-rr sends one TCP connection's segments over {list} in turn; they \
                 arrive out of order, the receiver takes that for loss and the sender backs \
                 off, so a path over {} gets less than the links could carry; separate paths \
                 over each NIC get all of it",
                i.name
            );
            f = f.fix(Fix::Manual(format!(
                "release {list} from {} (ip link set DEV nomaster), address each NIC, and give \
                 braid one path per NIC (--local)",
                i.name
            )));
        }
        _ if hashes && matches!(hash.as_deref(), Some("layer2" | "layer2+3" | "encap2+3")) => {
            f.severity = Severity::Warn;
            f.why = format!(
                "{mode} with xmit_hash_policy {} puts every connection between two hosts on \
                 the same slave of {list}: a client never gets more than one link's speed \
                 from this bond",
                hash.as_deref().unwrap_or("?")
            );
            f = f.fix(Fix::Run(format!("echo layer3+4 > {hash_path}")));
        }
        _ if hashes => {
            f.why = format!(
                "{mode} hashing by {}: each connection stays on one slave, so braid's \
                 connections (--connections-per-path) spread over {list}",
                hash.as_deref().unwrap_or("port")
            );
        }
        _ => {}
    }
    let mut out = vec![f];
    if mode == "802.3ad" {
        if let Some(b) = &info {
            let up = b.slaves.iter().filter(|s| s.mii_up).count();
            if let Some(ports) = b.aggregator_ports {
                let mut g = Finding::ok(
                    "bond-lacp",
                    subject,
                    format!("all {up} working slaves are in the active aggregator"),
                )
                .read(&proc_path, format!("Number of ports: {ports}"));
                if (ports as usize) < up {
                    g.severity = Severity::Warn;
                    g.why = format!(
                        "only {ports} of {up} working slaves joined {}'s active aggregator: \
                         the switch has not put the other ports in the same LACP group, so \
                         they carry nothing",
                        i.name
                    );
                    g = g.fix(Fix::Manual(format!(
                        "add every switch port of {list} to one LACP port channel"
                    )));
                }
                out.push(g);
            }
        }
    }
    out
}

/// CPUs online (`/sys/devices/system/cpu/online`, e.g. `0-3,6`).
pub fn cpus_online(root: &Root) -> Option<usize> {
    let text = root.read("/sys/devices/system/cpu/online")?;
    let mut n = 0;
    for part in text.split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse().ok()?)? + 1,
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    Some(n)
}

/// How a NIC's receive work spreads over the CPUs: its interrupts
/// (`/proc/interrupts`) and, with one receive queue, RPS
/// (`queues/rx-0/rps_cpus`).
pub fn check_irq(root: &Root, i: &Iface, cpus: usize) -> Vec<Finding> {
    if !i.physical || cpus < 2 {
        return Vec::new();
    }
    let subject = Subject::Interface(i.name.clone());
    let mut out = Vec::new();
    let interrupts = root.read_raw("/proc/interrupts").unwrap_or_default();
    if let Some((per_cpu, lines)) = parse::interrupts_of(&interrupts, &i.name) {
        let total: u64 = per_cpu.iter().sum();
        let (busiest, most) = per_cpu
            .iter()
            .copied()
            .enumerate()
            .max_by_key(|(_, c)| *c)
            .unwrap_or((0, 0));
        let shown: Vec<String> = per_cpu
            .iter()
            .enumerate()
            .map(|(c, n)| format!("CPU{c} {n}"))
            .collect();
        let mut f = Finding::ok(
            "irq-spread",
            subject.clone(),
            format!("{}'s interrupts are spread over the CPUs", i.name),
        )
        .read(
            "/proc/interrupts",
            format!("{lines} line(s) of {}: {}", i.name, shown.join(", ")),
        );
        // Only once there is enough to judge by.
        if total >= 10_000 && most * 10 >= total * 9 {
            f.severity = Severity::Warn;
            f.why = format!(
                "{:.0}% of {}'s interrupts land on CPU{busiest}: the receive work of every                  path through it waits for one core, which at high rates becomes the limit",
                most as f64 * 100.0 / total as f64,
                i.name
            );
            f = f.fix(Fix::Manual(format!(
                "spread {}'s interrupts: run irqbalance, or write CPU masks to                  /proc/irq/N/smp_affinity for its lines",
                i.name
            )));
        }
        out.push(f);
    }
    let queues: Vec<String> = root
        .list(&format!("{}/queues", i.sys))
        .into_iter()
        .filter(|q| q.starts_with("rx-"))
        .collect();
    if let [only] = queues.as_slice() {
        let path = format!("{}/queues/{only}/rps_cpus", i.sys);
        if let Some(mask) = root.read(&path) {
            let set = parse::cpumask(&mask).unwrap_or_default();
            let mut f = Finding::ok(
                "rps",
                subject,
                format!("one receive queue, spread over {} CPUs by RPS", set.len()),
            )
            .read(&path, mask.clone());
            if set.len() < 2 {
                let all = (1u64 << cpus.min(63)) - 1;
                f.severity = Severity::Warn;
                f.why = format!(
                    "{} has one receive queue and RPS is off: one CPU takes every packet of                      every path through it",
                    i.name
                );
                f = f.fix(Fix::Run(format!("echo {all:x} > {path}")));
            }
            out.push(f);
        }
    }
    out
}

/// The sysfs mode name for a `Bonding Mode:` line.
fn mode_from_proc(text: &str) -> String {
    let name = match text {
        t if t.contains("round-robin") => "balance-rr",
        t if t.contains("active-backup") => "active-backup",
        t if t.contains("(xor)") => "balance-xor",
        t if t.contains("broadcast") => "broadcast",
        t if t.contains("802.3ad") => "802.3ad",
        t if t.starts_with("transmit load") => "balance-tlb",
        t if t.starts_with("adaptive load") => "balance-alb",
        t => t,
    };
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_mode_names() {
        assert_eq!(mode_from_proc("load balancing (round-robin)"), "balance-rr");
        assert_eq!(
            mode_from_proc("IEEE 802.3ad Dynamic link aggregation"),
            "802.3ad"
        );
        assert_eq!(
            mode_from_proc("fault-tolerance (active-backup)"),
            "active-backup"
        );
    }

    #[test]
    fn slow_and_half_duplex_nics() {
        let i = Iface {
            name: "eth1".into(),
            sys: "/sys/class/net/eth1".into(),
            physical: true,
            speed: Some(100),
            duplex: Some("half".into()),
            ..Iface::default()
        };
        let f = check_link(&i);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].severity, Severity::Warn);
        assert_eq!(f[1].severity, Severity::Fail);
        let virt = Iface {
            physical: false,
            ..i
        };
        assert!(check_link(&virt).is_empty());
    }
}
