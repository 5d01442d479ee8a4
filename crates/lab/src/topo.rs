//! The lab's layout as data (namespaces, paths, addresses) and the `ip`, `tc`
//! and `nft` commands that build it. Pure functions producing command text;
//! running them is [`crate::Lab`]'s job.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::config::{Addressing, Rate, Shaping, Side};

/// Token bucket depth at 1gbit: about half a millisecond of the link. A
/// reply of 512 KiB after an idle moment must not be throttled below the
/// link rate, and at 1gbit 64 KiB measured the full rate for that pattern
/// while 4 KiB lost several percent.
pub const TBF_MIN_BURST: u64 = 64 * 1024;

/// Link time the token bucket holds (the time [`TBF_MIN_BURST`] takes at
/// 1gbit, 0.52 ms). A bucket holds what an idle link may then send at once,
/// which a wire never does: sized in bytes instead, 64 KiB were 5.3 ms of a
/// 100mbit link, and braid at queue depth 1 measured that path at 12.1-12.6
/// MB/s where iperf3 gets 11.8.
const TBF_BURST_MICROS: u64 = 524;

/// Queue allowed in front of the bucket, as time at the link rate. 10 ms
/// holds cubic's window at 1gbit without drops (5 ms cost retransmits and
/// throughput) while keeping queueing delay like a real switch port's.
pub const TBF_LATENCY_MS: u64 = 10;

/// The bucket of [`Shaping::Frames`]: 64 KiB, the burst a switch port
/// with a modest buffer lets through at line rate.
const FRAMES_BURST: u64 = 64 * 1024;

/// Ethernet's per-frame cost not in the skb: preamble+SFD 8, FCS 4,
/// inter-frame gap 12. With it, tbf meters what a real wire carries, so a
/// "1gbit" path gives the ~117.7 MB/s of goodput a real GbE link gives.
pub const TBF_OVERHEAD: u32 = 24;

/// Smallest Ethernet frame on the wire (64 bytes + preamble + gap).
pub const TBF_MPU: u32 = 84;

/// A full-sized frame as the skb holds it: the veth's 1500-byte MTU plus
/// the 14-byte Ethernet header.
const FULL_FRAME: u64 = 1514;

/// Link time one GSO skb may carry on a shaped path (0.4 ms).
///
/// The lab's two hosts share one machine's CPUs, so whatever the kernel
/// spends per skb is taken from braid and its peers. One segment per skb
/// made the lab itself the bottleneck: iperf3 over 2 x 1gbit kept two CPUs
/// 99% busy, against 9% with 33 segments, at the same goodput. A real host
/// pays that cost per TSO/GRO super-packet too, not per frame, so GSO is the
/// faithful model; capping an skb at 0.4 ms of link time keeps the bursts
/// the shaper releases at once short against a request's transfer time.
const GSO_SKB_MICROS: u64 = 400;

/// The description of a lab: enough to find and drive it again from another
/// process (the CLI stores it as JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabSpec {
    /// Prefix of every name: `brl-<pid>-<n>` (throwaway) or `braid-<name>`.
    pub tag: String,
    /// The persistent lab's name, if it has one.
    pub name: Option<String>,
    /// The storage host's namespace.
    pub storage_ns: String,
    /// The client host's namespace.
    pub client_ns: String,
    /// How addresses and routes are laid out.
    pub addressing: Addressing,
    /// How rates are enforced (older state files have none: the default).
    #[serde(default)]
    pub shaping: Shaping,
    /// The paths, path 1 first.
    pub paths: Vec<PathInfo>,
}

/// One path: a veth pair between the two namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathInfo {
    /// 1-based path number, as users count.
    pub index: usize,
    /// The veth end in the client namespace.
    pub client_iface: String,
    /// The veth end in the storage namespace.
    pub storage_iface: String,
    /// The client's address on this path.
    pub client_addr: Ipv4Addr,
    /// The storage host's address (portal) on this path.
    pub storage_addr: Ipv4Addr,
    /// Prefix length of both addresses.
    pub prefix_len: u8,
    /// The rate each direction is shaped to.
    pub rate: Rate,
}

impl PathInfo {
    pub(crate) fn new(addressing: Addressing, index: usize, rate: Rate) -> Self {
        let (client_addr, storage_addr, prefix_len) = addressing.addrs(index);
        PathInfo {
            index,
            client_iface: format!("brc{index}"),
            storage_iface: format!("brs{index}"),
            client_addr,
            storage_addr,
            prefix_len,
            rate,
        }
    }

    /// This path's interface on one side.
    pub fn iface(&self, side: Side) -> &str {
        match side {
            Side::Client => &self.client_iface,
            Side::Storage => &self.storage_iface,
        }
    }

    /// This path's address on one side.
    pub fn addr(&self, side: Side) -> Ipv4Addr {
        match side {
            Side::Client => self.client_addr,
            Side::Storage => self.storage_addr,
        }
    }
}

impl LabSpec {
    /// The namespace of one side.
    pub fn ns(&self, side: Side) -> &str {
        match side {
            Side::Client => &self.client_ns,
            Side::Storage => &self.storage_ns,
        }
    }

    /// The nftables table (in the client namespace) that blackholes path
    /// `index`; named after the lab so no one else's table is touched.
    pub(crate) fn nft_table(&self, index: usize) -> String {
        format!("{}_p{index}", self.tag.replace('-', "_"))
    }
}

/// Per-path routing table and rule priority for the same-subnet schemes.
fn table(index: usize) -> usize {
    100 + index
}

/// `ip -batch` lines (run in the client namespace) creating path's veth
/// pair, with its storage end placed straight into the storage namespace.
pub(crate) fn veth_lines(spec: &LabSpec, p: &PathInfo) -> Vec<String> {
    let segs = gso_max_segs(p.rate, spec.shaping);
    vec![format!(
        "link add {c} gso_max_segs {segs} type veth peer name {s} netns {sns} gso_max_segs {segs}",
        c = p.client_iface,
        s = p.storage_iface,
        sns = spec.storage_ns,
    )]
}

/// `ip -batch` lines giving a path's end on `side` its address, bringing it
/// up, and (same-subnet schemes) its source-routing rule. Run once.
pub(crate) fn addr_lines(spec: &LabSpec, side: Side, p: &PathInfo) -> Vec<String> {
    let dev = p.iface(side);
    // noprefixroute: the lab adds the routes itself, with congctl (below).
    let mut lines = vec![
        format!(
            "addr add {}/{} dev {dev} noprefixroute",
            p.addr(side),
            p.prefix_len
        ),
        format!("link set {dev} up"),
    ];
    if policy_routed(spec.addressing, side) {
        lines.push(format!(
            "rule add from {} lookup {t} pref {t}",
            p.addr(side),
            t = table(p.index)
        ));
    }
    lines
}

/// `ip -batch` lines (idempotent `route replace`) for a path's routes on
/// `side`. Re-run after a link-down cut, which deletes routes through the
/// link.
///
/// Every route carries `congctl cubic`: a new namespace inherits the host's
/// default congestion control, and a namespace may not switch its default to
/// an algorithm the host has not allowed (EPERM), while a route's congctl
/// has no such restriction.
pub(crate) fn route_lines(spec: &LabSpec, side: Side, p: &PathInfo) -> Vec<String> {
    let dev = p.iface(side);
    let local = p.addr(side);
    let peer = p.addr(other(side));
    let net = network(local, p.prefix_len);
    let cc = "congctl cubic";
    match spec.addressing {
        Addressing::Split => vec![format!("route replace {net} dev {dev} src {local} {cc}")],
        Addressing::SameSubnetFlux if side == Side::Client => {
            // The distro default: a prefix route per interface, metric in
            // interface order; the lowest metric carries everything.
            vec![format!(
                "route replace {net} dev {dev} src {local} metric {} {cc}",
                p.index
            )]
        }
        Addressing::SameSubnet | Addressing::SameSubnetFlux => {
            let mut lines = vec![
                // Source-routed: traffic from this address leaves here.
                format!(
                    "route replace {net} dev {dev} src {local} table {} {cc}",
                    table(p.index)
                ),
                // Unbound sockets reach the peer's address on its own path.
                format!("route replace {peer}/32 dev {dev} src {local} {cc}"),
            ];
            if p.index == 1 {
                lines.push(format!("route replace {net} dev {dev} src {local} {cc}"));
            }
            lines
        }
    }
}

/// `tc -batch` lines shaping the egress of a path's end on `side`, or
/// `None` for an unlimited rate (the caller deletes the root qdisc).
pub(crate) fn tbf_line(dev: &str, rate: Rate, shaping: Shaping) -> Option<String> {
    let bits = rate.bits_per_sec()?;
    let burst = match shaping {
        Shaping::Gso => tbf_burst(bits),
        Shaping::Frames => FRAMES_BURST,
    };
    let shaped = tbf_rate(bits, gso_max_segs(rate, shaping));
    Some(format!(
        "qdisc replace dev {dev} root tbf rate {shaped}bit burst {burst} \
         latency {TBF_LATENCY_MS}ms overhead {TBF_OVERHEAD} mpu {TBF_MPU}"
    ))
}

/// GSO segments per skb for a path of this rate: [`GSO_SKB_MICROS`] of
/// link time in full frames, at least one, and never more than the token
/// bucket holds (a larger skb would be cut up by tbf itself, in software).
/// Unshaped links keep the veth default; [`Shaping::Frames`] sends one
/// frame per skb.
pub(crate) fn gso_max_segs(rate: Rate, shaping: Shaping) -> u32 {
    let Some(bits) = rate.bits_per_sec() else {
        return 65535;
    };
    if shaping == Shaping::Frames {
        return 1;
    }
    let by_time = gso_segs_by_time(bits);
    let by_bucket = tbf_burst(bits) / FULL_FRAME;
    u32::try_from(by_time.min(by_bucket).max(1)).unwrap_or(u32::MAX)
}

/// [`TBF_BURST_MICROS`] of the link, and never less than one GSO skb of
/// the path and one more frame (tbf cannot pass an skb larger than its
/// bucket).
fn tbf_burst(bits: u64) -> u64 {
    let skb = gso_segs_by_time(bits) * FULL_FRAME;
    (bits / 8 * TBF_BURST_MICROS / 1_000_000).max(skb + FULL_FRAME)
}

/// Full frames in [`GSO_SKB_MICROS`] of link time, at least one.
fn gso_segs_by_time(bits: u64) -> u64 {
    (bits / 8 * GSO_SKB_MICROS / 1_000_000 / FULL_FRAME).max(1)
}

/// The rate to give tbf so that a path carries what a wire of `bits` would.
///
/// tbf adds [`TBF_OVERHEAD`] once per skb, but a GSO skb of `segs` frames
/// crosses a real wire as `segs` frames, each paying it: uncorrected, a
/// "1gbit" path with 33 segments per skb gave 119.4 MB/s of goodput, more
/// than a GbE link can carry. Slowing the bucket by what a full skb is
/// under-charged makes bulk traffic exact (117.6 MB/s measured) and
/// over-charges a lone full frame by at most 1.6%.
fn tbf_rate(bits: u64, segs: u32) -> u64 {
    let segs = u64::from(segs);
    let charged = segs * FULL_FRAME + u64::from(TBF_OVERHEAD);
    let wire = segs * (FULL_FRAME + u64::from(TBF_OVERHEAD));
    // u128: bits * charged overflows u64 above ~100 tbit.
    u64::try_from(u128::from(bits) * u128::from(charged) / u128::from(wire)).unwrap_or(bits)
}

/// The nftables script that blackholes a path: every IP packet in or out of
/// the client end dropped, ahead of everything else.
pub(crate) fn blackhole_script(table: &str, client_iface: &str) -> String {
    format!(
        "table inet {table} {{\n\
         \tchain in {{ type filter hook prerouting priority -400; policy accept; iifname \"{client_iface}\" drop; }}\n\
         \tchain out {{ type filter hook postrouting priority 400; policy accept; oifname \"{client_iface}\" drop; }}\n\
         }}\n"
    )
}

fn policy_routed(addressing: Addressing, side: Side) -> bool {
    match addressing {
        Addressing::Split => false,
        Addressing::SameSubnet => true,
        Addressing::SameSubnetFlux => side == Side::Storage,
    }
}

fn other(side: Side) -> Side {
    match side {
        Side::Client => Side::Storage,
        Side::Storage => Side::Client,
    }
}

fn network(addr: Ipv4Addr, prefix_len: u8) -> String {
    let mask = u32::MAX
        .checked_shl(32 - u32::from(prefix_len))
        .unwrap_or(0);
    format!("{}/{prefix_len}", Ipv4Addr::from(u32::from(addr) & mask))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_is_link_time_and_holds_an_skb() {
        let line = tbf_line("brc1", Rate::GBIT, Shaping::Gso).unwrap();
        assert!(line.contains("burst 65500 "), "{line}");
        let line = tbf_line("brc1", "10gbit".parse().unwrap(), Shaping::Gso).unwrap();
        assert!(line.contains("burst 655000 "), "{line}");
        let line = tbf_line("brc1", "100mbit".parse().unwrap(), Shaping::Gso).unwrap();
        assert!(line.contains("burst 6550 "), "{line}");
        // At 10mbit half a millisecond is less than a frame.
        let line = tbf_line("brc1", "10mbit".parse().unwrap(), Shaping::Gso).unwrap();
        assert!(line.contains("burst 3028 "), "{line}");
        assert_eq!(tbf_line("brc1", Rate::Unlimited, Shaping::Gso), None);
    }

    #[test]
    fn frames_shaping_sends_single_frames_through_a_64k_bucket_at_the_wire_rate() {
        for rate in ["100mbit", "1gbit", "10gbit"] {
            let rate: Rate = rate.parse().unwrap();
            assert_eq!(gso_max_segs(rate, Shaping::Frames), 1);
            let line = tbf_line("brc1", rate, Shaping::Frames).unwrap();
            assert!(line.contains("burst 65536 "), "{line}");
            // One frame per skb is charged its overhead exactly: no
            // correction of the rate.
            let bits = rate.bits_per_sec().unwrap();
            assert!(line.contains(&format!("rate {bits}bit ")), "{line}");
        }
        assert_eq!(gso_max_segs(Rate::Unlimited, Shaping::Frames), 65535);
    }

    #[test]
    fn gso_skbs_hold_a_fraction_of_a_millisecond_and_fit_the_bucket() {
        assert_eq!(gso_max_segs(Rate::GBIT, Shaping::Gso), 33);
        assert_eq!(gso_max_segs("100mbit".parse().unwrap(), Shaping::Gso), 3);
        assert_eq!(gso_max_segs("10mbit".parse().unwrap(), Shaping::Gso), 1);
        // 10gbit: 0.4 ms is 330 frames; the 625000-byte bucket holds 412.
        assert_eq!(gso_max_segs("10gbit".parse().unwrap(), Shaping::Gso), 330);
        assert_eq!(gso_max_segs(Rate::Unlimited, Shaping::Gso), 65535);
    }

    #[test]
    fn bucket_rate_charges_every_frame_of_a_full_skb_its_overhead() {
        // 33 full frames: the wire carries 33 x 1538 bytes, tbf is charged
        // 33 x 1514 + 24; at the corrected rate both take the same time.
        let bits = 1_000_000_000;
        let shaped = tbf_rate(bits, 33);
        let wire_s = (33.0 * 1538.0) * 8.0 / bits as f64;
        let charged_s = (33.0 * 1514.0 + 24.0) * 8.0 / shaped as f64;
        assert!(
            (wire_s - charged_s).abs() / wire_s < 1e-6,
            "{wire_s} {charged_s}"
        );
        // One segment per skb is already exact.
        assert_eq!(tbf_rate(bits, 1), bits);
        let line = tbf_line("brc1", Rate::GBIT, Shaping::Gso).unwrap();
        assert!(line.contains(&format!("rate {shaped}bit ")), "{line}");
    }

    #[test]
    fn network_masks_host_bits() {
        assert_eq!(network(Ipv4Addr::new(10, 77, 3, 2), 24), "10.77.3.0/24");
        assert_eq!(network(Ipv4Addr::new(10, 77, 0, 101), 24), "10.77.0.0/24");
    }
}
