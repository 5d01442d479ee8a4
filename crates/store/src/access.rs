//! Who may use an export: allow-lists of client networks.

use std::net::IpAddr;
use std::str::FromStr;

/// A client network, `10.0.1.0/24`, `fd00::/8`, or one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// Whether `ip` lies in this network. IPv4 clients reaching an IPv6
    /// socket as `::ffff:a.b.c.d` are matched as IPv4.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Network {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?}: expected a network such as 10.0.1.0/24 or an address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
            None => max,
        };
        Ok(Self { addr, prefix })
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Whether a client at `peer` may use something allowed to `list`: an
/// empty list allows everyone; an unknown peer (a unix socket) is local and
/// always allowed.
pub fn allowed(list: &[Network], peer: Option<IpAddr>) -> bool {
    match peer {
        None => true,
        Some(ip) => list.is_empty() || list.iter().any(|n| n.contains(ip)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks() {
        let n: Network = "10.0.1.0/24".parse().unwrap();
        assert!(n.contains("10.0.1.77".parse().unwrap()));
        assert!(!n.contains("10.0.2.1".parse().unwrap()));
        assert!(n.contains("::ffff:10.0.1.5".parse().unwrap()));
        let one: Network = "192.168.0.9".parse().unwrap();
        assert!(one.contains("192.168.0.9".parse().unwrap()));
        assert!(!one.contains("192.168.0.8".parse().unwrap()));
        let all: Network = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("1.2.3.4".parse().unwrap()));
        let v6: Network = "fd00::/8".parse().unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(!v6.contains("10.0.0.1".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Network>().is_err());
        assert!("eth0".parse::<Network>().is_err());
    }

    #[test]
    fn empty_lists_allow_everyone_and_unix_clients_are_local() {
        assert!(allowed(&[], Some("1.2.3.4".parse().unwrap())));
        let l = vec!["10.0.0.0/8".parse().unwrap()];
        assert!(!allowed(&l, Some("1.2.3.4".parse().unwrap())));
        assert!(allowed(&l, None));
    }
}
