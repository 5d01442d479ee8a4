//! The route the kernel really uses for a destination (`ip route get DST
//! from SRC oif DEV`), asked with `RTM_GETROUTE`, so that policy rules,
//! metrics and a socket's bound device are all taken into account by the
//! one piece of code that decides: the kernel's.

use std::io;
use std::net::IpAddr;

use crate::nl;

/// The kernel's answer for one destination.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Route {
    /// The output interface's index.
    pub oif: Option<u32>,
    /// The source address a socket without one would get.
    pub prefsrc: Option<IpAddr>,
    /// The next hop, when not on-link.
    pub gateway: Option<IpAddr>,
    /// The routing table the answer came from (254 is `main`).
    pub table: Option<u32>,
    /// `congctl` set on the route (`RTAX_CC_ALGO`).
    pub congctl: Option<String>,
    /// `mtu` locked on the route, or the path MTU the kernel learned
    /// (`RTAX_MTU`).
    pub mtu: Option<u32>,
}

/// `struct rtmsg`.
const RTMSG: usize = 12;
/// `RTM_F_LOOKUP_TABLE`: report the table the route was found in.
const RTM_F_LOOKUP_TABLE: u32 = 0x1000;
const RTAX_MTU: u16 = 2;
const RTAX_CC_ALGO: u16 = 16;

/// Asks the kernel how it would send to `dst` from `src` (a local address)
/// through `oif` (a bound device's index), either optional.
///
/// # Errors
///
/// The kernel's error (ENETUNREACH when no route matches; EINVAL for a
/// source address this host does not have), or `InvalidData`.
pub fn get(dst: IpAddr, src: Option<IpAddr>, oif: Option<u32>) -> io::Result<Route> {
    let sock = nl::Socket::route()?;
    sock.send(&nl::request(
        libc::RTM_GETROUTE,
        0,
        &request_body(dst, src, oif),
    ))?;
    let mut route = None;
    sock.replies(|kind, body| {
        if kind == libc::RTM_NEWROUTE {
            route = Some(parse(body)?);
            return Ok(true);
        }
        Ok(false)
    })?;
    route.ok_or_else(|| nl::bad("no route in the answer"))
}

fn request_body(dst: IpAddr, src: Option<IpAddr>, oif: Option<u32>) -> Vec<u8> {
    let (family, bits) = match dst {
        IpAddr::V4(_) => (libc::AF_INET as u8, 32u8),
        IpAddr::V6(_) => (libc::AF_INET6 as u8, 128u8),
    };
    let mut b = vec![0u8; RTMSG];
    b[0] = family;
    b[1] = bits;
    if src.is_some() {
        b[2] = bits;
    }
    b[8..12].copy_from_slice(&RTM_F_LOOKUP_TABLE.to_ne_bytes());
    b.extend(nl::attr(libc::RTA_DST, &octets(dst)));
    if let Some(s) = src {
        b.extend(nl::attr(libc::RTA_SRC, &octets(s)));
    }
    if let Some(i) = oif {
        b.extend(nl::attr(libc::RTA_OIF, &i.to_ne_bytes()));
    }
    b
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

fn addr(v: &[u8]) -> Option<IpAddr> {
    match v.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(v).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(v).ok()?)),
        _ => None,
    }
}

fn parse(body: &[u8]) -> io::Result<Route> {
    if body.len() < RTMSG {
        return Err(nl::bad("a route message shorter than rtmsg"));
    }
    let mut r = Route {
        table: Some(u32::from(body[4])),
        ..Route::default()
    };
    for (ty, v) in nl::attrs(&body[RTMSG..]) {
        match ty {
            libc::RTA_OIF => r.oif = nl::u32_of(v),
            libc::RTA_PREFSRC => r.prefsrc = addr(v),
            libc::RTA_GATEWAY => r.gateway = addr(v),
            libc::RTA_TABLE => r.table = nl::u32_of(v),
            libc::RTA_METRICS => {
                for (m, mv) in nl::attrs(v) {
                    match m {
                        RTAX_MTU => r.mtu = nl::u32_of(mv),
                        RTAX_CC_ALGO => r.congctl = Some(nl::c_string(mv)),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nl::attr;

    #[test]
    fn an_answer_parses_with_its_metrics() {
        let mut body = vec![0u8; RTMSG];
        body[0] = libc::AF_INET as u8;
        body[4] = 254;
        body.extend(attr(libc::RTA_OIF, &7u32.to_ne_bytes()));
        body.extend(attr(libc::RTA_PREFSRC, &[10, 77, 1, 2]));
        body.extend(attr(libc::RTA_TABLE, &254u32.to_ne_bytes()));
        let mut metrics = attr(RTAX_CC_ALGO, b"cubic\0");
        metrics.extend(attr(RTAX_MTU, &1500u32.to_ne_bytes()));
        body.extend(attr(libc::RTA_METRICS, &metrics));
        let r = parse(&body).unwrap();
        assert_eq!(r.oif, Some(7));
        assert_eq!(r.prefsrc, Some("10.77.1.2".parse().unwrap()));
        assert_eq!(r.table, Some(254));
        assert_eq!(r.congctl.as_deref(), Some("cubic"));
        assert_eq!(r.mtu, Some(1500));
        assert!(parse(&[0u8; 4]).is_err());
    }

    #[test]
    fn the_kernel_answers_for_loopback() {
        let lo = crate::link::links()
            .unwrap()
            .into_iter()
            .find(|l| l.name == "lo")
            .unwrap();
        let r = get("127.0.0.1".parse().unwrap(), None, None).unwrap();
        assert_eq!(r.oif, Some(lo.index));
        assert_eq!(r.prefsrc, Some("127.0.0.1".parse().unwrap()));
        let bound = get(
            "127.0.0.1".parse().unwrap(),
            Some("127.0.0.1".parse().unwrap()),
            Some(lo.index),
        )
        .unwrap();
        assert_eq!(bound.oif, Some(lo.index));
    }
}
