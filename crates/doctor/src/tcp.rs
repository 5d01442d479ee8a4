//! TCP settings against each path: the largest window the buffers allow
//! (`tcp_rmem`, `tcp_wmem`, `tcp_adv_win_scale`) against the path's
//! bandwidth-delay product (the link's rate times the measured round
//! trip), and the congestion control its connections get (the route's
//! `congctl`, else the namespace default).

use std::collections::BTreeMap;

use crate::finding::{Finding, Fix, Severity};
use crate::parse;
use crate::paths::{Links, PathFacts};
use crate::units;

/// Sysctl values by file (`/proc/sys/net/ipv4/tcp_rmem`).
pub type Sysctls = BTreeMap<String, String>;

pub const RMEM: &str = "/proc/sys/net/ipv4/tcp_rmem";
pub const WMEM: &str = "/proc/sys/net/ipv4/tcp_wmem";
pub const ADV_WIN_SCALE: &str = "/proc/sys/net/ipv4/tcp_adv_win_scale";
pub const CC: &str = "/proc/sys/net/ipv4/tcp_congestion_control";
pub const CC_AVAILABLE: &str = "/proc/sys/net/ipv4/tcp_available_congestion_control";

/// The receive window a buffer of `buf` bytes allows: the kernel keeps
/// `buf / 2^scale` for its own overhead (`tcp_adv_win_scale` > 0) or
/// offers only `buf / 2^-scale` (≤ 0), as ip-sysctl.rst documents.
pub fn window(buf: u64, scale: i32) -> u64 {
    if scale > 0 {
        buf - (buf >> scale.min(31))
    } else {
        buf >> (-scale).min(31)
    }
}

/// The largest receive window the host's settings allow.
pub fn max_window(sysctl: &Sysctls) -> Option<u64> {
    let rmem = parse::triple(sysctl.get(RMEM)?)?;
    let scale = sysctl
        .get(ADV_WIN_SCALE)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    Some(window(rmem[2], scale))
}

/// The path's round trip in seconds: the smallest echo, or the probe
/// connection's smallest.
pub fn rtt(p: &PathFacts) -> Option<(f64, String)> {
    if let Some(ms) = p.echo.as_ref().and_then(|e| e.rtt_ms) {
        return Some((ms / 1000.0, "ICMP echo, smallest of 3".into()));
    }
    let t = p.probe.as_ref()?.tcp?;
    (t.min_rtt_us > 0).then(|| {
        (
            f64::from(t.min_rtt_us) / 1e6,
            "TCP_INFO min_rtt of the probe's connection".into(),
        )
    })
}

/// Buffers against the path's bandwidth-delay product.
pub fn buffers(p: &PathFacts, links: &Links, sysctl: &Sysctls) -> Option<Finding> {
    let link = p.route.as_ref().ok().and_then(|r| links.get(&r.dev))?;
    let bits = link.rate_bits()?;
    let (rtt, rtt_source) = rtt(p)?;
    let bdp = (bits as f64 / 8.0 * rtt) as u64;
    let rmem = parse::triple(sysctl.get(RMEM)?)?;
    let wmem = parse::triple(sysctl.get(WMEM)?)?;
    let scale: i32 = sysctl
        .get(ADV_WIN_SCALE)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let rwin = window(rmem[2], scale);
    // A send buffer holds what is in flight and what waits, with the
    // same per-packet overhead: about half of it can be in flight.
    let swin = wmem[2] / 2;
    let mut f = Finding::ok(
        "tcp-buffers",
        p.subject(),
        format!(
            "windows of {} (receive) and {} (send) cover the {} in flight this path needs",
            units::bytes(rwin),
            units::bytes(swin),
            units::bytes(bdp)
        ),
    );
    if let Some((s, v)) = link.rate_evidence() {
        f = f.read(s, v);
    }
    f = f
        .read(rtt_source, units::millis(rtt * 1000.0))
        .read(RMEM, sysctl[RMEM].clone())
        .read(WMEM, sysctl[WMEM].clone());
    if let Some(s) = sysctl.get(ADV_WIN_SCALE) {
        f = f.read(ADV_WIN_SCALE, s.clone());
    }
    let mut short = Vec::new();
    let mut fix = Vec::new();
    // Room for twice the product: a window that only just fits stalls at
    // the first loss.
    let want = (4 * bdp).next_power_of_two();
    if rwin < bdp {
        short.push(format!(
            "reads are held to {} by a receive window of {}",
            units::mbytes_per_s(rwin as f64 / rtt),
            units::bytes(rwin)
        ));
        fix.push(format!(
            "sysctl -w net.ipv4.tcp_rmem='{} {} {}'",
            rmem[0],
            rmem[1],
            want.max(rmem[2])
        ));
    }
    if swin < bdp {
        short.push(format!(
            "writes are held to {} by a send buffer of {}",
            units::mbytes_per_s(swin as f64 / rtt),
            units::bytes(wmem[2])
        ));
        fix.push(format!(
            "sysctl -w net.ipv4.tcp_wmem='{} {} {}'",
            wmem[0],
            wmem[1],
            want.max(wmem[2])
        ));
    }
    if short.is_empty() {
        return Some(f);
    }
    f.severity = Severity::Warn;
    f.why = format!(
        "path {} needs {} in flight ({} × {}), but {}",
        p.index,
        units::bytes(bdp),
        units::bits_per_s(bits),
        units::millis(rtt * 1000.0),
        short.join(", and ")
    );
    Some(f.fix(Fix::commands(fix)))
}

/// Congestion control algorithms that do poorly for storage paths: reno
/// halves its window on every loss and regrows it slowly; the delay-based
/// ones yield to every other flow.
const POOR_CC: [&str; 5] = ["reno", "lp", "vegas", "veno", "nv"];

/// The congestion control the path's connections get.
pub fn congestion(p: &PathFacts, sysctl: &Sysctls) -> Option<Finding> {
    let route = p.route.as_ref().ok()?;
    let default = sysctl.get(CC);
    let (cc, source, value) = match (&route.congctl, default) {
        (Some(c), _) => (
            c.clone(),
            format!("rtnetlink RTM_GETROUTE ({})", route.query),
            format!("congctl {c}"),
        ),
        (None, Some(d)) => (d.clone(), CC.to_owned(), d.clone()),
        (None, None) => return None,
    };
    let mut f = Finding::ok("congestion-control", p.subject(), cc.clone()).read(source, value);
    if !POOR_CC.contains(&cc.as_str()) {
        return Some(f);
    }
    f.severity = Severity::Warn;
    f.why = format!(
        "{cc} {} on a storage path: a path that should fill its link sits well below it",
        if cc == "reno" {
            "halves its window on every loss and regrows it one segment per round trip"
        } else {
            "backs off whenever delay grows, yielding to every other flow"
        }
    );
    let available = sysctl.get(CC_AVAILABLE).cloned().unwrap_or_default();
    let better = ["cubic", "bbr"]
        .into_iter()
        .find(|c| available.split_whitespace().any(|a| a == *c));
    f.fix = Some(match (better, route.congctl.is_some()) {
        (Some(b), false) => Fix::Run(format!("sysctl -w net.ipv4.tcp_congestion_control={b}")),
        (Some(b), true) => Fix::Manual(format!(
            "change the route's congctl to {b} (ip route change ... congctl {b})"
        )),
        (None, _) => Fix::Manual("load a better algorithm: modprobe tcp_bbr".into()),
    });
    if !available.is_empty() {
        f = f.read(CC_AVAILABLE, available);
    }
    Some(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_by_adv_win_scale() {
        assert_eq!(window(1 << 20, 1), 1 << 19);
        assert_eq!(window(1 << 20, 2), 3 << 18);
        assert_eq!(window(1 << 20, 0), 1 << 20);
        assert_eq!(window(1 << 20, -2), 1 << 18);
    }
}
