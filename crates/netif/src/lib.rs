//! This host's network interfaces and their addresses (`getifaddrs`), so a
//! target can serve on an interface and an initiator can bind a path to
//! one and pair it with the portals in its subnet; and, for `braid doctor`,
//! what the kernel says of them over rtnetlink and ethtool: links
//! ([`link`]), the route it really uses ([`route`]), shaping ([`qdisc`]),
//! offloads ([`ethtool`]).

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
pub mod ethtool;
pub mod link;
mod nl;
pub mod qdisc;
pub mod reach;
pub mod route;

/// One address of one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfaceAddr {
    pub iface: String,
    pub ip: IpAddr,
    /// Prefix length of the subnet (24 for a /24), when known.
    pub prefix: Option<u8>,
    pub up: bool,
    pub loopback: bool,
}

impl IfaceAddr {
    /// Whether `other` lies in this address's subnet.
    pub fn same_subnet(&self, other: IpAddr) -> bool {
        let Some(prefix) = self.prefix else {
            return false;
        };
        match (self.ip, other) {
            (IpAddr::V4(a), IpAddr::V4(b)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(prefix.min(32)))
                    .unwrap_or(0);
                u32::from(a) & mask == u32::from(b) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(b)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(prefix.min(128)))
                    .unwrap_or(0);
                u128::from(a) & mask == u128::from(b) & mask
            }
            _ => false,
        }
    }

    /// IPv6 link-local addresses need a scope id to be reached.
    pub fn link_local(&self) -> bool {
        matches!(self.ip, IpAddr::V6(_)) && reach::link_local(self.ip)
    }
}

/// Every IPv4 and IPv6 address of every interface.
///
/// # Errors
///
/// The OS error from `getifaddrs`.
pub fn addrs() -> io::Result<Vec<IfaceAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned, alive until
        // freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        // SAFETY: a non-null sockaddr from getifaddrs whose family names its
        // concrete type; only that type is read.
        let Some(ip) = (unsafe { sockaddr_ip(ifa.ifa_addr) }) else {
            continue;
        };
        // SAFETY: as above; the netmask has the address's family.
        let prefix = unsafe { sockaddr_ip(ifa.ifa_netmask) }.map(|m| match m {
            IpAddr::V4(v4) => u32::from(v4).count_ones() as u8,
            IpAddr::V6(v6) => u128::from(v6).count_ones() as u8,
        });
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let iface = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let flags = ifa.ifa_flags;
        out.push(IfaceAddr {
            iface,
            ip,
            prefix,
            up: flags & libc::IFF_UP as u32 != 0,
            loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
        });
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// An address of this host that `--listen all` leaves out, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeftOut {
    pub addr: IfaceAddr,
    pub reason: String,
}

/// Splits the up, non-loopback addresses of `addrs` into those a client on
/// another host could reach and those it could not (with the reason),
/// judging each interface by what the kernel says of it
/// ([`reach::unreachable_reason`]). If the kernel cannot be asked, every
/// address is kept: serving on too many portals is the safer mistake.
pub fn reachable(addrs: &[IfaceAddr]) -> (Vec<IfaceAddr>, Vec<LeftOut>) {
    let links = link::links().unwrap_or_default();
    let mut keep = Vec::new();
    let mut left = Vec::new();
    for a in addrs.iter().filter(|a| a.up && !a.loopback) {
        let kind = reach::IfaceKind::of(&links, &a.iface);
        let master = kind
            .master
            .as_deref()
            .map(|m| reach::IfaceKind::of(&links, m));
        match reach::unreachable_reason(a, &kind, master.as_ref()) {
            Some(reason) => left.push(LeftOut {
                addr: a.clone(),
                reason,
            }),
            None => keep.push(a.clone()),
        }
    }
    (keep, left)
}

/// # Safety
///
/// `sa` must be null or point to a valid sockaddr of the family it names.
unsafe fn sockaddr_ip(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    match i32::from((*sa).sa_family) {
        libc::AF_INET => {
            let sin = &*(sa as *const libc::sockaddr_in);
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                sin.sin_addr.s_addr,
            ))))
        }
        libc::AF_INET6 => {
            let sin6 = &*(sa as *const libc::sockaddr_in6);
            Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed_with_its_prefix() {
        let all = addrs().unwrap();
        let lo = all
            .iter()
            .find(|a| a.ip == IpAddr::V4(Ipv4Addr::LOCALHOST))
            .expect("127.0.0.1 on lo");
        assert!(lo.loopback && lo.up);
        assert_eq!(lo.prefix, Some(8));
        assert!(lo.same_subnet("127.0.0.2".parse().unwrap()));
        assert!(!lo.same_subnet("10.0.0.1".parse().unwrap()));
    }

    #[test]
    fn subnet_arithmetic() {
        let a = IfaceAddr {
            iface: "x".into(),
            ip: "10.77.1.2".parse().unwrap(),
            prefix: Some(24),
            up: true,
            loopback: false,
        };
        assert!(a.same_subnet("10.77.1.1".parse().unwrap()));
        assert!(!a.same_subnet("10.77.2.1".parse().unwrap()));
        assert!(!a.same_subnet("::1".parse().unwrap()));
        let z = IfaceAddr {
            prefix: Some(0),
            ..a
        };
        assert!(z.same_subnet("1.2.3.4".parse().unwrap()));
    }
}
