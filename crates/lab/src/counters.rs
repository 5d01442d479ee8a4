//! Per-path traffic counters, read from the kernel's `/proc/net/dev` as
//! seen from inside the client namespace. Parsing only; reading is
//! [`crate::Lab::counters`].

/// Byte counters of a path's client-side veth, as the client sees them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Bytes sent from the client over this path.
    pub tx_bytes: u64,
    /// Bytes received by the client over this path.
    pub rx_bytes: u64,
    /// Packets sent from the client over this path.
    pub tx_packets: u64,
    /// Packets received by the client over this path.
    pub rx_packets: u64,
}

/// The counters of `iface` from `/proc/net/dev` text.
pub(crate) fn parse_net_dev(text: &str, iface: &str) -> Option<Counters> {
    let line = text.lines().find_map(|l| {
        let (name, rest) = l.split_once(':')?;
        (name.trim() == iface).then_some(rest)
    })?;
    let f: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // Receive: bytes packets errs drop fifo frame compressed multicast;
    // then transmit: bytes packets ...
    Some(Counters {
        rx_bytes: *f.first()?,
        rx_packets: *f.get(1)?,
        tx_bytes: *f.get(8)?,
        tx_packets: *f.get(9)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_dev_line_is_parsed() {
        let text = "Inter-|   Receive    |  Transmit\n \
                    face |bytes packets errs drop fifo frame compressed multicast|bytes packets\n    \
                    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n  \
                    brc1:    1500      10    0    0    0     0          0         0     9000      20    0    0    0     0       0          0\n";
        let c = parse_net_dev(text, "brc1").unwrap();
        assert_eq!(
            c,
            Counters {
                rx_bytes: 1500,
                rx_packets: 10,
                tx_bytes: 9000,
                tx_packets: 20
            }
        );
        assert_eq!(parse_net_dev(text, "brc2"), None);
    }
}
