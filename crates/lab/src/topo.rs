//! The lab's layout as data (namespaces, paths, addresses) and the `ip`, `tc`
//! and `nft` commands that build it. Pure functions producing command text;
//! running them is [`crate::Lab`]'s job.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::config::{Addressing, Rate, Side};

/// Token bucket depth floor. A reply of 512 KiB after an idle moment must
/// not be throttled below the link rate by timer granularity, and 64 KiB
/// (about half a millisecond at 1gbit) measured the full rate for that
/// pattern while 4 KiB lost several percent.
pub const TBF_MIN_BURST: u64 = 64 * 1024;

/// Time worth of bytes the token bucket may hold at high rates (0.5 ms);
/// above ~1gbit this exceeds [`TBF_MIN_BURST`].
const TBF_BURST_MICROS: u64 = 500;

/// Queue allowed in front of the bucket, as time at the link rate. 10 ms
/// holds cubic's window at 1gbit without drops (5 ms cost retransmits and
/// throughput) while keeping queueing delay like a real switch port's.
pub const TBF_LATENCY_MS: u64 = 10;

/// Ethernet's per-frame cost not in the skb: preamble+SFD 8, FCS 4,
/// inter-frame gap 12. With it, tbf meters what a real wire carries, so a
/// "1gbit" path gives the ~117.7 MB/s of goodput a real GbE link gives.
pub const TBF_OVERHEAD: u32 = 24;

/// Smallest Ethernet frame on the wire (64 bytes + preamble + gap).
pub const TBF_MPU: u32 = 84;

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
    let segs = gso_max_segs(p.rate);
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
pub(crate) fn tbf_line(dev: &str, rate: Rate) -> Option<String> {
    let bits = rate.bits_per_sec()?;
    let burst = TBF_MIN_BURST.max(bits / 8 * TBF_BURST_MICROS / 1_000_000);
    Some(format!(
        "qdisc replace dev {dev} root tbf rate {bits}bit burst {burst} \
         latency {TBF_LATENCY_MS}ms overhead {TBF_OVERHEAD} mpu {TBF_MPU}"
    ))
}

/// GSO segments per skb for a path of this rate. Shaped links send one
/// segment per skb: tbf counts the Ethernet overhead once per skb, so a
/// 64 KiB GSO skb would be under-charged (measured 119.4 MB/s on "1gbit",
/// more than a wire can carry), and bursts of 44 frames at once are not what
/// a NIC puts on a wire. Unshaped links keep the veth default.
pub(crate) fn gso_max_segs(rate: Rate) -> u32 {
    match rate {
        Rate::BitsPerSec(_) => 1,
        Rate::Unlimited => 65535,
    }
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
    fn burst_has_a_floor_and_grows_with_rate() {
        let line = tbf_line("brc1", Rate::GBIT).unwrap();
        assert!(line.contains("burst 65536 "), "{line}");
        let line = tbf_line("brc1", "10gbit".parse().unwrap()).unwrap();
        assert!(line.contains("burst 625000 "), "{line}");
        assert_eq!(tbf_line("brc1", Rate::Unlimited), None);
    }

    #[test]
    fn network_masks_host_bits() {
        assert_eq!(network(Ipv4Addr::new(10, 77, 3, 2), 24), "10.77.3.0/24");
        assert_eq!(network(Ipv4Addr::new(10, 77, 0, 101), 24), "10.77.0.0/24");
    }
}
