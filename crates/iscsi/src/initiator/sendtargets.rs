//! SendTargets from the initiator's side (RFC 7143, "SendTargets
//! Operation"): the request, and the answer read into targets and the
//! addresses each is reached on.
//!
//! The answer repeats keys (a `TargetAddress` per portal, a `TargetName`
//! per target), so it is read here rather than by [`crate::text::parse`],
//! which refuses repeated keys as a login must.

/// The data segment of the request: every target this discovery session
/// may see.
pub const SEND_TARGETS_ALL: &[u8] = b"SendTargets=All\0";

/// One target in a SendTargets answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discovered {
    pub name: String,
    /// Every address it is reached on, in the order given.
    pub addresses: Vec<Address>,
}

/// A `TargetAddress` value: `host[:port][,tag]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    /// A name, an IPv4 address, or an IPv6 address without brackets.
    pub host: String,
    pub port: Option<u16>,
    pub portal_group_tag: Option<u16>,
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        if let Some(t) = self.portal_group_tag {
            write!(f, ",{t}")?;
        }
        Ok(())
    }
}

/// Why a SendTargets answer cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SendTargetsError {
    #[error("the SendTargets answer is not UTF-8")]
    NotUtf8,
    #[error("the SendTargets answer has {0:?} where key=value was expected")]
    NoEquals(String),
    #[error("TargetAddress {0:?} comes before any TargetName")]
    AddressFirst(String),
    #[error("TargetAddress {0:?} is not host[:port][,tag]")]
    BadAddress(String),
}

/// Reads a SendTargets answer. Keys other than `TargetName` and
/// `TargetAddress` (a `TargetAlias`, say) are skipped.
///
/// # Errors
///
/// [`SendTargetsError`].
pub fn parse(data: &[u8]) -> Result<Vec<Discovered>, SendTargetsError> {
    let mut out: Vec<Discovered> = Vec::new();
    for raw in data.split(|&b| b == 0).filter(|p| !p.is_empty()) {
        let pair = std::str::from_utf8(raw).map_err(|_| SendTargetsError::NotUtf8)?;
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| SendTargetsError::NoEquals(pair.chars().take(80).collect()))?;
        match key {
            "TargetName" => out.push(Discovered {
                name: value.to_owned(),
                addresses: Vec::new(),
            }),
            "TargetAddress" => {
                let a = address(value).ok_or_else(|| {
                    SendTargetsError::BadAddress(value.chars().take(80).collect())
                })?;
                out.last_mut()
                    .ok_or_else(|| SendTargetsError::AddressFirst(value.to_owned()))?
                    .addresses
                    .push(a);
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Reads `host[:port][,tag]` (the host may be `[IPv6]`).
pub fn address(v: &str) -> Option<Address> {
    let (hostport, tag) = match v.rsplit_once(',') {
        Some((hp, t)) => (hp, Some(t.parse::<u16>().ok()?)),
        None => (v, None),
    };
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?.parse().ok()?),
        };
        (h, port)
    } else {
        match hostport.split_once(':') {
            // A bare IPv6 address has many colons: no port then.
            Some((h, p)) if !p.contains(':') => (h, Some(p.parse().ok()?)),
            Some(_) => (hostport, None),
            None => (hostport, None),
        }
    };
    if host.is_empty() || host.len() > 255 {
        return None;
    }
    Some(Address {
        host: host.to_owned(),
        port,
        portal_group_tag: tag,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_with_their_portals_in_order() {
        let t = parse(
            b"TargetName=iqn.2026-11.org.example:a\0\
              TargetAddress=10.0.1.5:3260,1\0\
              TargetAddress=[fd00::5]:3261,2\0\
              TargetAlias=disk a\0\
              TargetName=iqn.2026-11.org.example:b\0\
              TargetAddress=nas.example.org\0",
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].name, "iqn.2026-11.org.example:a");
        assert_eq!(
            t[0].addresses,
            [
                Address {
                    host: "10.0.1.5".into(),
                    port: Some(3260),
                    portal_group_tag: Some(1)
                },
                Address {
                    host: "fd00::5".into(),
                    port: Some(3261),
                    portal_group_tag: Some(2)
                }
            ]
        );
        assert_eq!(t[0].addresses[1].to_string(), "[fd00::5]:3261,2");
        assert_eq!(t[1].addresses[0].host, "nas.example.org");
        assert_eq!(t[1].addresses[0].port, None);
        assert!(parse(b"").unwrap().is_empty());
    }

    #[test]
    fn malformed_answers_are_refused() {
        assert_eq!(
            parse(b"TargetAddress=10.0.0.1\0"),
            Err(SendTargetsError::AddressFirst("10.0.0.1".into()))
        );
        assert!(matches!(
            parse(b"TargetName=x\0TargetAddress=10.0.0.1:99999\0"),
            Err(SendTargetsError::BadAddress(_))
        ));
        assert!(matches!(
            parse(b"junk\0"),
            Err(SendTargetsError::NoEquals(_))
        ));
        assert_eq!(parse(b"TargetName=\xff\0"), Err(SendTargetsError::NotUtf8));
        for bad in ["", "[fd00::1", "h:1,x", ":3260", "[::1]x"] {
            assert_eq!(address(bad), None, "{bad:?}");
        }
        assert_eq!(address("fd00::1").unwrap().port, None);
        assert_eq!(address("169.254.1.2:3260,1").unwrap().host, "169.254.1.2");
    }
}
