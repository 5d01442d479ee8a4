//! NBD URIs as users write them (the NBD URI convention libnbd and qemu
//! use): `nbd://HOST[:PORT]/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`;
//! and [`VolumeUri`], either an NBD or an iSCSI URI ([`iscsi`]); one
//! percent-decoder for both.

pub mod iscsi;

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

/// Where the first connection goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(a) => write!(f, "{a}"),
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// A volume's URI: NBD, or iSCSI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeUri {
    Nbd(NbdUri),
    Iscsi(iscsi::IscsiUri),
}

impl VolumeUri {
    /// What the volume is called in logs: the export, or the target and
    /// LUN.
    pub fn name(&self) -> String {
        match self {
            Self::Nbd(u) => u.export.clone(),
            Self::Iscsi(u) => format!("{}/{}", u.target, u.lun),
        }
    }
}

impl std::fmt::Display for VolumeUri {
    /// The URI without secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Nbd(u) => write!(f, "{}/{}", u.endpoint, u.export),
            Self::Iscsi(u) => write!(f, "{u}"),
        }
    }
}

impl From<NbdUri> for VolumeUri {
    fn from(u: NbdUri) -> Self {
        Self::Nbd(u)
    }
}

impl From<iscsi::IscsiUri> for VolumeUri {
    fn from(u: iscsi::IscsiUri) -> Self {
        Self::Iscsi(u)
    }
}

impl std::str::FromStr for VolumeUri {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.starts_with("iscsi://") {
            Ok(Self::Iscsi(s.parse()?))
        } else {
            Ok(Self::Nbd(s.parse()?))
        }
    }
}

/// A parsed NBD URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUri {
    pub endpoint: Endpoint,
    /// The host as written (name or address), which TLS verifies.
    pub host: String,
    pub export: String,
    /// `nbds://`: TLS required.
    pub tls: bool,
}

/// The NBD port clients assume.
pub const DEFAULT_PORT: u16 = 10809;

impl std::str::FromStr for NbdUri {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!("{s:?} is not an NBD URI ({why}); write nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH")
        };
        let (scheme, rest) = s.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let (tls, unix) = match scheme {
            "nbd" | "nbd+tcp" => (false, false),
            "nbds" | "nbds+tcp" => (true, false),
            "nbd+unix" => (false, true),
            "nbds+unix" => (true, true),
            other => return Err(bad(&format!("unknown scheme {other:?}"))),
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = percent_decode(path).ok_or_else(|| bad("bad %-escape in the export name"))?;
        let endpoint = if unix {
            if !authority.is_empty() {
                return Err(bad("nbd+unix:// takes no host"));
            }
            let socket = query
                .into_iter()
                .flat_map(|q| q.split('&'))
                .find_map(|kv| kv.strip_prefix("socket="))
                .ok_or_else(|| bad("nbd+unix needs ?socket=PATH"))?;
            Endpoint::Unix(PathBuf::from(
                percent_decode(socket).ok_or_else(|| bad("bad %-escape in the socket path"))?,
            ))
        } else {
            Endpoint::Tcp(resolve_host(authority).map_err(|e| bad(&e))?)
        };
        let host = if unix {
            "localhost".to_owned()
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) if !h.ends_with(':') && p.chars().all(|c| c.is_ascii_digit()) => h,
                _ => authority,
            }
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned()
        };
        Ok(Self {
            endpoint,
            host,
            export,
            tls,
        })
    }
}

/// `HOST[:PORT]` with HOST a name, an IPv4 address or `[IPv6]`.
pub fn resolve_host(authority: &str) -> Result<SocketAddr, String> {
    resolve_host_port(authority, DEFAULT_PORT)
}

/// [`resolve_host`] with another default port.
pub fn resolve_host_port(authority: &str, default_port: u16) -> Result<SocketAddr, String> {
    if authority.is_empty() {
        return Err("no host".into());
    }
    if let Ok(sa) = authority.parse::<SocketAddr>() {
        return Ok(sa);
    }
    let bare = authority.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, default_port));
    }
    let with_port = if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:{default_port}")
    };
    with_port
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {authority:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("{authority:?} has no address"))
}

/// `%XX` escapes decoded, for every kind of URI braid reads; `None` for a
/// malformed escape or bytes that are not UTF-8.
pub(crate) fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            // from_str_radix takes a sign: "%+5" is no escape.
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_uris() {
        let u: NbdUri = "nbd://127.0.0.1:10810/vol".parse().unwrap();
        assert_eq!(
            u.endpoint,
            Endpoint::Tcp("127.0.0.1:10810".parse().unwrap())
        );
        assert_eq!(u.export, "vol");
        assert_eq!(u.host, "127.0.0.1");
        assert!(!u.tls);
        let u: NbdUri = "nbds://[::1]/a%20b".parse().unwrap();
        assert_eq!(u.host, "::1");
        assert_eq!(u.endpoint, Endpoint::Tcp("[::1]:10809".parse().unwrap()));
        assert_eq!(u.export, "a b");
        assert!(u.tls);
        let u: NbdUri = "nbd://10.0.0.1".parse().unwrap();
        assert_eq!(u.export, "");
    }

    #[test]
    fn unix_uris() {
        let u: NbdUri = "nbd+unix:///vol?socket=/run/braid/vol.sock"
            .parse()
            .unwrap();
        assert_eq!(u.endpoint, Endpoint::Unix("/run/braid/vol.sock".into()));
        assert_eq!(u.export, "vol");
        assert!("nbd+unix:///vol".parse::<NbdUri>().is_err());
    }

    #[test]
    fn either_kind_of_volume_uri() {
        let u: VolumeUri = "nbd://127.0.0.1:10810/vol".parse().unwrap();
        assert_eq!(
            (u.name(), u.to_string()),
            ("vol".into(), "127.0.0.1:10810/vol".into())
        );
        let u: VolumeUri = "iscsi://u%pw@127.0.0.1/iqn.2026-11.x:y/1".parse().unwrap();
        assert_eq!(u.name(), "iqn.2026-11.x:y/1");
        assert_eq!(u.to_string(), "iscsi://u@127.0.0.1:3260/iqn.2026-11.x:y/1");
        assert!("iscsi://127.0.0.1/iqn".parse::<VolumeUri>().is_err());
    }

    #[test]
    fn mistakes_say_what_to_write() {
        for bad in [
            "127.0.0.1/vol",
            "http://x/y",
            "nbd:///vol",
            "nbd://h/%zz",
            "nbd://h/%+5",
        ] {
            let e = bad.parse::<NbdUri>().unwrap_err();
            assert!(e.contains("nbd://HOST"), "{bad}: {e}");
        }
    }
}
