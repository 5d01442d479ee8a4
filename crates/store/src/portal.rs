//! Portals: the addresses a target serves on, from `--listen` values
//! (`ADDR[:PORT]`, `IFACE[:PORT]`, `all[:PORT]`) to bound listening sockets.
//!
//! A portal that belongs to an interface is bound to that device
//! (`SO_BINDTODEVICE`), and so is every connection accepted on it: replies
//! leave by the link the request came in on, even when every address of
//! the host shares one subnet and the routing table would send them all
//! out of one NIC. IPv6 link-local addresses are left out: clients could
//! not name them without a scope id.

use std::io;
use std::net::{IpAddr, SocketAddr};

use socket2::{Domain, Protocol, Socket, Type};

/// The IANA port for NBD.
pub const DEFAULT_PORT: u16 = 10809;

/// One `--listen` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenSpec {
    Addr(SocketAddr),
    Iface { name: String, port: u16 },
    All { port: u16 },
}

impl std::str::FromStr for ListenSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(sa) = s.parse::<SocketAddr>() {
            return Ok(Self::Addr(sa));
        }
        if let Ok(ip) = s.trim_matches(|c| c == '[' || c == ']').parse::<IpAddr>() {
            return Ok(Self::Addr(SocketAddr::new(ip, DEFAULT_PORT)));
        }
        let (name, port) = match s.rsplit_once(':') {
            Some((n, p)) => (
                n,
                p.parse::<u16>()
                    .map_err(|_| format!("--listen {s:?}: {p:?} is not a port number"))?,
            ),
            None => (s, DEFAULT_PORT),
        };
        if name.is_empty() || name.len() > 15 || name.contains(['/', ' ']) {
            return Err(format!(
                "--listen {s:?}: expected an address (10.0.0.5, [fe80::1]:10809), an interface name (eth0) or `all`"
            ));
        }
        if name == "all" {
            Ok(Self::All { port })
        } else {
            Ok(Self::Iface {
                name: name.to_owned(),
                port,
            })
        }
    }
}

/// A resolved portal: an address to bind, and the device it belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Portal {
    pub addr: SocketAddr,
    /// Interface to bind the socket to, for interface and `all` portals.
    pub device: Option<String>,
}

impl std::fmt::Display for Portal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.device {
            Some(d) => write!(f, "{} (on {d})", self.addr),
            None => write!(f, "{}", self.addr),
        }
    }
}

/// What `--listen` values resolved to: the portals, and the addresses
/// `all` left out because no client could reach them.
#[derive(Clone, Debug, Default)]
pub struct Resolved {
    pub portals: Vec<Portal>,
    pub left_out: Vec<braid_netif::LeftOut>,
}

/// Turns `--listen` values into portals. `all` takes the addresses a client
/// on another host could reach ([`braid_netif::reachable`]); a named
/// interface or address is taken as given.
///
/// # Errors
///
/// A message naming the value that matched nothing (an unknown interface,
/// an interface without addresses, `all` on a host with no address).
pub fn resolve(specs: &[ListenSpec]) -> Result<Resolved, String> {
    let addrs = braid_netif::addrs().map_err(|e| format!("cannot list interfaces: {e}"))?;
    let (reachable, left_out) = braid_netif::reachable(&addrs);
    let mut out: Vec<Portal> = Vec::new();
    let mut all_used = false;
    for spec in specs {
        let found: Vec<Portal> = match spec {
            ListenSpec::Addr(addr) => vec![Portal {
                addr: *addr,
                device: None,
            }],
            ListenSpec::Iface { name, port } => {
                if !addrs.iter().any(|a| &a.iface == name) {
                    let mut names: Vec<&str> = addrs.iter().map(|a| a.iface.as_str()).collect();
                    names.dedup();
                    return Err(format!(
                        "--listen {name}: no interface of that name with an address (have: {})",
                        names.join(", ")
                    ));
                }
                addrs
                    .iter()
                    .filter(|a| &a.iface == name && !a.link_local())
                    .map(|a| Portal {
                        addr: SocketAddr::new(a.ip, *port),
                        device: Some(a.iface.clone()),
                    })
                    .collect()
            }
            ListenSpec::All { port } => {
                all_used = true;
                reachable
                    .iter()
                    .map(|a| Portal {
                        addr: SocketAddr::new(a.ip, *port),
                        device: Some(a.iface.clone()),
                    })
                    .collect()
            }
        };
        if found.is_empty() {
            return Err(match spec {
                ListenSpec::All { .. } => format!(
                    "--listen all: this host has no non-loopback address that is up and \
                     reachable from other hosts{}; name an interface (--listen IFACE) to \
                     serve on it anyway",
                    left_out_list(&left_out)
                ),
                ListenSpec::Iface { name, .. } => {
                    format!("--listen {name}: the interface has no usable address")
                }
                ListenSpec::Addr(_) => unreachable!("an address always resolves to itself"),
            });
        }
        for p in found {
            if !out.iter().any(|o| o.addr == p.addr) {
                out.push(p);
            }
        }
    }
    let left_out = if all_used {
        // An address also named explicitly is served, so not left out.
        left_out
            .into_iter()
            .filter(|l| !out.iter().any(|p| p.addr.ip() == l.addr.ip))
            .collect()
    } else {
        Vec::new()
    };
    Ok(Resolved {
        portals: out,
        left_out,
    })
}

fn left_out_list(left: &[braid_netif::LeftOut]) -> String {
    if left.is_empty() {
        return String::new();
    }
    let each: Vec<String> = left
        .iter()
        .map(|l| format!("{} on {}: {}", l.addr.ip, l.addr.iface, l.reason))
        .collect();
    format!(" (left out: {})", each.join("; "))
}

/// Binds a listening TCP socket for a portal.
///
/// # Errors
///
/// The OS error, with the portal in the message (address in use, address
/// not on this host, binding to a device without CAP_NET_RAW).
pub fn bind(portal: &Portal) -> io::Result<std::net::TcpListener> {
    let ctx = |e: io::Error, what: &str| {
        io::Error::new(e.kind(), format!("portal {portal}: {what}: {e}"))
    };
    let socket = Socket::new(
        Domain::for_address(portal.addr),
        Type::STREAM,
        Some(Protocol::TCP),
    )
    .map_err(|e| ctx(e, "socket"))?;
    socket
        .set_reuse_address(true)
        .map_err(|e| ctx(e, "SO_REUSEADDR"))?;
    if portal.addr.is_ipv6() {
        socket
            .set_only_v6(true)
            .map_err(|e| ctx(e, "IPV6_V6ONLY"))?;
    }
    if let Some(dev) = &portal.device {
        socket
            .bind_device(Some(dev.as_bytes()))
            .map_err(|e| ctx(e, "SO_BINDTODEVICE (needs root or CAP_NET_RAW)"))?;
    }
    socket
        .bind(&portal.addr.into())
        .map_err(|e| ctx(e, "bind"))?;
    socket.listen(1024).map_err(|e| ctx(e, "listen"))?;
    socket
        .set_nonblocking(true)
        .map_err(|e| ctx(e, "O_NONBLOCK"))?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_specs() {
        assert_eq!(
            "10.0.0.5".parse::<ListenSpec>().unwrap(),
            ListenSpec::Addr("10.0.0.5:10809".parse().unwrap())
        );
        assert_eq!(
            "10.0.0.5:99".parse::<ListenSpec>().unwrap(),
            ListenSpec::Addr("10.0.0.5:99".parse().unwrap())
        );
        assert_eq!(
            "[::1]".parse::<ListenSpec>().unwrap(),
            ListenSpec::Addr("[::1]:10809".parse().unwrap())
        );
        assert_eq!(
            "::1".parse::<ListenSpec>().unwrap(),
            ListenSpec::Addr("[::1]:10809".parse().unwrap())
        );
        assert_eq!(
            "all".parse::<ListenSpec>().unwrap(),
            ListenSpec::All { port: 10809 }
        );
        assert_eq!(
            "eth0:2000".parse::<ListenSpec>().unwrap(),
            ListenSpec::Iface {
                name: "eth0".into(),
                port: 2000
            }
        );
        assert!("eth0:http".parse::<ListenSpec>().is_err());
        assert!("a/b".parse::<ListenSpec>().is_err());
    }

    #[test]
    fn loopback_interface_resolves() {
        let p = resolve(&[ListenSpec::Iface {
            name: "lo".into(),
            port: 1,
        }])
        .unwrap()
        .portals;
        assert!(p.iter().any(|p| p.addr.ip().is_loopback()));
        assert!(p.iter().all(|p| p.device.as_deref() == Some("lo")));
        let e = resolve(&[ListenSpec::Iface {
            name: "nosuch0".into(),
            port: 1,
        }])
        .unwrap_err();
        assert!(e.contains("nosuch0") && e.contains("lo"), "{e}");
    }

    #[test]
    fn binding_twice_names_the_portal() {
        let p = Portal {
            addr: "127.0.0.1:0".parse().unwrap(),
            device: None,
        };
        let l = bind(&p).unwrap();
        let taken = Portal {
            addr: l.local_addr().unwrap(),
            device: None,
        };
        let e = bind(&taken).unwrap_err();
        assert!(e.to_string().contains("portal 127.0.0.1:"), "{e}");
    }
}
