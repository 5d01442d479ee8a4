//! Finding a volume's paths: what the first portal says about the volume
//! (identity, size, every portal), which local addresses pair with which
//! portals, and connecting one path's connections with the identity
//! checked on each.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use braid_proto::braid_ns::{BraidContext, ConnId, InstanceId, SessionToken};
use braid_proto::{ClientConfig, ExportDetails, Finish};

use crate::conn::{self, ConnectError, Local, Negotiated, TlsClient};
use crate::uri::Endpoint;

/// A `--local` value: an address or an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalSpec {
    Addr(IpAddr),
    Iface(String),
}

impl std::str::FromStr for LocalSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Self::Addr(ip));
        }
        if s.is_empty() || s.len() > 15 || s.contains(['/', ' ', ':']) {
            return Err(format!(
                "--local {s:?}: expected a local address (10.0.1.2) or an interface name (eth1)"
            ));
        }
        Ok(Self::Iface(s.to_owned()))
    }
}

/// What the first portal said about the volume.
#[derive(Clone, Debug)]
pub struct Discovery {
    pub export: ExportDetails,
    /// `x-braid:volume`, when the target is braid.
    pub identity: Option<String>,
    /// `x-braid:portal` values.
    pub portals: Vec<SocketAddr>,
    /// The target answered in the `x-braid:` namespace (and so fences).
    pub braid: bool,
    /// `x-braid:instance`: the target process answering.
    pub instance: Option<InstanceId>,
}

/// One path: where it leaves from and which portal it goes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathSpec {
    pub local: Local,
    pub portal: Endpoint,
}

impl std::fmt::Display for PathSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.local.addr, &self.local.device) {
            (None, None) => write!(f, "{}", self.portal),
            _ => write!(f, "{} → {}", self.local, self.portal),
        }
    }
}

/// Asks the first portal about the export.
///
/// # Errors
///
/// The portal cannot be reached, or refuses the export.
pub async fn discover(
    endpoint: &Endpoint,
    local: &Local,
    export: &str,
    timeout: Duration,
    tls: Option<&TlsClient>,
) -> Result<Discovery, ConnectError> {
    let stream = conn::dial(endpoint, local, timeout).await?;
    let cfg = ClientConfig {
        list_queries: vec![braid_proto::braid_ns::NAMESPACE.to_owned()],
        finish: Finish::Info,
        ..ClientConfig::go(export)
    };
    let n = conn::negotiate(stream, cfg, &endpoint.to_string(), timeout, tls).await?;
    let export = n.outcome.export.clone().ok_or_else(|| {
        ConnectError::Other(format!("{endpoint}: the server sent no export details"))
    })?;
    let mut identity = None;
    let mut portals = Vec::new();
    let mut instance = None;
    for name in &n.outcome.listed {
        match BraidContext::parse(name) {
            Some(BraidContext::Volume(Some(v))) => identity = Some(v),
            Some(BraidContext::Instance(Some(i))) => instance = Some(i),
            Some(BraidContext::Portal(Some(p))) => {
                if let Ok(a) = p.parse::<SocketAddr>() {
                    portals.push(a);
                }
            }
            _ => {}
        }
    }
    Ok(Discovery {
        export,
        identity,
        portals,
        braid: n.outcome.listed.iter().any(|l| l.starts_with("x-braid:")),
        instance,
    })
}

/// Resolves `--local` values to bindable addresses and devices.
///
/// # Errors
///
/// An interface that does not exist or has no address.
pub fn resolve_locals(specs: &[LocalSpec]) -> Result<Vec<(Local, Option<u8>)>, String> {
    let ifaces = braid_netif::addrs().map_err(|e| format!("cannot list interfaces: {e}"))?;
    specs
        .iter()
        .map(|spec| match spec {
            LocalSpec::Addr(ip) => {
                let prefix = ifaces.iter().find(|a| a.ip == *ip).and_then(|a| a.prefix);
                Ok((
                    Local {
                        device: None,
                        addr: Some(*ip),
                    },
                    prefix,
                ))
            }
            LocalSpec::Iface(name) => {
                let mut mine: Vec<_> = ifaces
                    .iter()
                    .filter(|a| &a.iface == name && !a.link_local())
                    .collect();
                mine.sort_by_key(|a| !a.ip.is_ipv4());
                let a = mine.first().ok_or_else(|| {
                    format!("--local {name}: no interface of that name with an address")
                })?;
                Ok((
                    Local {
                        device: Some(name.clone()),
                        addr: Some(a.ip),
                    },
                    a.prefix,
                ))
            }
        })
        .collect()
}

/// Pairs local bindings with portals so that every link is used: with as
/// many locals as portals, in the order given when each pair can reach
/// (same subnet, or unknown); otherwise every local with every portal in
/// its subnet; with no locals, one path per portal.
pub fn pair(locals: &[(Local, Option<u8>)], portals: &[Endpoint]) -> Vec<PathSpec> {
    if locals.is_empty() {
        return portals
            .iter()
            .map(|p| PathSpec {
                local: Local::default(),
                portal: p.clone(),
            })
            .collect();
    }
    let reaches = |(local, prefix): &(Local, Option<u8>), portal: &Endpoint| -> bool {
        match (local.addr, prefix, portal) {
            (Some(ip), Some(prefix), Endpoint::Tcp(sa)) => braid_netif::IfaceAddr {
                iface: String::new(),
                ip,
                prefix: Some(*prefix),
                up: true,
                loopback: false,
            }
            .same_subnet(sa.ip()),
            _ => true,
        }
    };
    if locals.len() == portals.len() && locals.iter().zip(portals).all(|(l, p)| reaches(l, p)) {
        return locals
            .iter()
            .zip(portals)
            .map(|((l, _), p)| PathSpec {
                local: l.clone(),
                portal: p.clone(),
            })
            .collect();
    }
    let mut out = Vec::new();
    for l in locals {
        for p in portals {
            if reaches(l, p) {
                out.push(PathSpec {
                    local: l.0.clone(),
                    portal: p.clone(),
                });
            }
        }
    }
    if out.is_empty() {
        // Nothing is known to reach: let the kernel decide, per pair.
        for l in locals {
            for p in portals {
                out.push(PathSpec {
                    local: l.0.clone(),
                    portal: p.clone(),
                });
            }
        }
    }
    out
}

/// What a connection of a path must agree on.
#[derive(Clone, Debug)]
pub struct Expect {
    pub export: String,
    /// TLS for every connection, when the volume uses it.
    pub tls: Option<TlsClient>,
    pub size: u64,
    pub identity: Option<String>,
    /// Where the expectation came from, for messages.
    pub source: String,
    /// This volume's session token, presented on every connection
    /// (`x-braid:session`): a fence may close only connections opened with
    /// it.
    pub session: SessionToken,
}

/// One connection of a path, negotiated and checked.
pub struct PathConn {
    pub negotiated: Negotiated,
    /// The target's id of this connection (`x-braid:conn`).
    pub server_id: Option<ConnId>,
    /// Context id of `base:allocation`, when selected.
    pub allocation: Option<u32>,
    /// The target process that answered (`x-braid:instance`).
    pub instance: Option<InstanceId>,
}

/// Connects one connection of `path` and checks it serves the same volume.
///
/// # Errors
///
/// Unreachable, refused, or a different volume (both identities named).
pub async fn connect_path(
    path: &PathSpec,
    expect: &Expect,
    timeout: Duration,
) -> Result<PathConn, ConnectError> {
    let stream = conn::dial(&path.portal, &path.local, timeout).await?;
    let cfg = ClientConfig {
        list_queries: vec![
            BraidContext::Session(expect.session).name(),
            "x-braid:conn".into(),
            "x-braid:volume".into(),
            "x-braid:instance".into(),
        ],
        set_contexts: vec![braid_proto::server::BASE_ALLOCATION.into()],
        ..ClientConfig::go(expect.export.clone())
    };
    let n = conn::negotiate(
        stream,
        cfg,
        &path.portal.to_string(),
        timeout,
        expect.tls.as_ref(),
    )
    .await?;
    let details = n
        .outcome
        .export
        .as_ref()
        .ok_or_else(|| ConnectError::Other(format!("{}: no export details", path.portal)))?;
    let mut identity = None;
    let mut server_id = None;
    let mut instance = None;
    for name in &n.outcome.listed {
        match BraidContext::parse(name) {
            Some(BraidContext::Volume(Some(v))) => identity = Some(v),
            Some(BraidContext::Conn(Some(id))) => server_id = Some(id),
            Some(BraidContext::Instance(Some(i))) => instance = Some(i),
            _ => {}
        }
    }
    if let (Some(want), got) = (&expect.identity, &identity) {
        if got.as_ref() != Some(want) {
            return Err(ConnectError::NotSameVolume {
                portal: path.portal.to_string(),
                found: format!("volume {}", got.as_deref().unwrap_or("(no braid identity)")),
                first: expect.source.clone(),
                expected: format!("volume {want}"),
            });
        }
    }
    let identified = expect.identity.as_ref().map(|v| format!("volume {v}"));
    if let Err(e) = size_fits(&path.portal, expect.size, details.size, identified) {
        return Err(e.unwrap_or_else(|| ConnectError::NotSameVolume {
            portal: path.portal.to_string(),
            found: format!("{:?} of {} bytes", expect.export, details.size),
            first: expect.source.clone(),
            expected: format!("{} bytes", expect.size),
        }));
    }
    let allocation = n.allocation();
    Ok(PathConn {
        negotiated: n,
        server_id,
        allocation,
        instance,
    })
}

/// Whether a path that reports `found` bytes may serve a volume opened at
/// `opened` bytes. Where the target named the volume (`identified`, the
/// identity checked and matched) a larger size is an image that grew under
/// the running volume: the path is used and the volume keeps the size it
/// was opened at, as NBD cannot tell its own clients of another (a new
/// attach sees it). A smaller one is an image that shrank:
/// [`ConnectError::Shrank`]. Without an identity, the size is the only
/// sign that two paths lead to one volume: any other size is refused
/// (`Err(None)`; the caller names the volume as its protocol does).
///
/// # Errors
///
/// As above.
pub(crate) fn size_fits(
    portal: &Endpoint,
    opened: u64,
    found: u64,
    identified: Option<String>,
) -> Result<(), Option<ConnectError>> {
    match (found.cmp(&opened), identified) {
        (std::cmp::Ordering::Equal, _) => Ok(()),
        (std::cmp::Ordering::Greater, Some(volume)) => {
            tracing::info!(
                %portal, %volume, found, opened,
                "the image grew: this path is used, and the volume keeps the size it was \
                 opened at until it is attached again"
            );
            Ok(())
        }
        (std::cmp::Ordering::Less, Some(volume)) => Err(Some(ConnectError::Shrank {
            portal: portal.to_string(),
            volume,
            found,
            opened,
        })),
        (_, None) => Err(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(ip: &str, prefix: u8) -> (Local, Option<u8>) {
        (
            Local {
                device: None,
                addr: Some(ip.parse().unwrap()),
            },
            Some(prefix),
        )
    }

    fn portal(a: &str) -> Endpoint {
        Endpoint::Tcp(a.parse().unwrap())
    }

    #[test]
    fn no_locals_one_path_per_portal() {
        let p = pair(&[], &[portal("10.0.1.1:1"), portal("10.0.2.1:1")]);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].local, Local::default());
    }

    #[test]
    fn split_subnets_pair_by_subnet() {
        let locals = [local("10.0.2.2", 24), local("10.0.1.2", 24)];
        let portals = [portal("10.0.1.1:1"), portal("10.0.2.1:1")];
        let p = pair(&locals, &portals);
        assert_eq!(p.len(), 2);
        for path in &p {
            let Endpoint::Tcp(sa) = path.portal else {
                panic!()
            };
            let l = path.local.addr.unwrap().to_string();
            let want = if sa.ip().to_string() == "10.0.1.1" {
                "10.0.1.2"
            } else {
                "10.0.2.2"
            };
            assert_eq!(l, want);
        }
    }

    #[test]
    fn same_subnet_pairs_in_order() {
        let locals = [local("10.0.0.2", 24), local("10.0.0.3", 24)];
        let portals = [portal("10.0.0.11:1"), portal("10.0.0.12:1")];
        let p = pair(&locals, &portals);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].local.addr.unwrap().to_string(), "10.0.0.2");
        assert_eq!(p[1].local.addr.unwrap().to_string(), "10.0.0.3");
    }

    #[test]
    fn local_specs() {
        assert_eq!(
            "10.0.0.2".parse::<LocalSpec>().unwrap(),
            LocalSpec::Addr("10.0.0.2".parse().unwrap())
        );
        assert_eq!(
            "eth1".parse::<LocalSpec>().unwrap(),
            LocalSpec::Iface("eth1".into())
        );
        assert!("a/b".parse::<LocalSpec>().is_err());
        assert!(resolve_locals(&[LocalSpec::Iface("nosuch9".into())]).is_err());
        let lo = resolve_locals(&[LocalSpec::Iface("lo".into())]).unwrap();
        assert_eq!(lo[0].0.device.as_deref(), Some("lo"));
    }

    #[test]
    fn a_named_volume_may_grow_under_its_paths_but_not_shrink() {
        let p = portal("10.0.1.1:1");
        let named = || Some("volume 1234".to_owned());
        assert!(size_fits(&p, 8 << 20, 8 << 20, named()).is_ok());
        assert!(size_fits(&p, 8 << 20, 16 << 20, named()).is_ok());
        let Err(Some(e)) = size_fits(&p, 8 << 20, 4 << 20, named()) else {
            panic!("a shrunk volume was taken as a path")
        };
        assert!(matches!(e, ConnectError::Shrank { .. }) && e.other_volume());
        let told = e.to_string();
        assert!(
            told.contains("4194304 bytes, less than the 8388608")
                && told.contains("shrank under a running attach")
                && told.contains("detach and attach again"),
            "{told}"
        );
    }

    #[test]
    fn without_an_identity_only_the_same_size_is_the_same_volume() {
        let p = portal("10.0.1.1:1");
        assert!(size_fits(&p, 8 << 20, 8 << 20, None).is_ok());
        assert!(matches!(size_fits(&p, 8 << 20, 16 << 20, None), Err(None)));
        assert!(matches!(size_fits(&p, 8 << 20, 4 << 20, None), Err(None)));
    }
}
