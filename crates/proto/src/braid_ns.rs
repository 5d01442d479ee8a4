//! The `x-braid:` metadata context namespace: what braid adds to NBD
//! (DESIGN.md, "Wire conventions"). The spec reserves `x-*` namespaces for
//! such use; clients that never ask for them never see them.
//!
//! | context | meaning |
//! |---|---|
//! | `x-braid:volume=<uuid>` | the export's stable identity |
//! | `x-braid:portal=<addr>:<port>` | one address the target serves on |
//! | `x-braid:conn=<id>` | the id of the connection that asked (32 hex digits) |
//! | `x-braid:session=<token>` | the initiator session the connection belongs to (32 hex digits) |
//! | `x-braid:instance=<id>` | the target process: new at each start (32 hex digits) |
//! | `x-braid:fence=<id>,<id>...` | close those connections and drain them |
//!
//! Queries: `x-braid:` lists volume, portals, conn and instance;
//! `x-braid:volume`, `x-braid:portal`, `x-braid:conn` and
//! `x-braid:instance` (with or without a trailing `=`) list one kind; `x-braid:session=<token>` presents the connection's
//! session token, which the server lists back; `x-braid:fence=...`
//! performs a fence and answers with the same name once it has completed.
//!
//! Fences are scoped, as iSCSI scopes session reinstatement: there, a
//! login with the same initiator name and ISID replaces (and so ends) the
//! sessions it names, and no other initiator can. Here the ISID's part is
//! played by a random 128-bit session token the initiator presents on each
//! of its connections: a fence, asked over a connection presenting token
//! `T` for export `E`, may name only connections of `E` opened with `T`.
//! Connection ids are 128 random bits, so they cannot be guessed either.

use std::fmt;

/// The namespace prefix, colon included.
pub const NAMESPACE: &str = "x-braid:";

/// The target's id of one connection: 128 random bits, unguessable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u128);

/// A target process's instance: random at each start. A path that comes
/// back to another instance reached a server that may have lost writes it
/// acknowledged but never flushed (NFS's write verifier, in NBD terms).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceId(pub u128);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// An initiator session's token, presented on each of its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionToken(pub u128);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Display for SessionToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// 1 to 32 hex digits.
fn hex128(s: &str) -> Option<u128> {
    let s = s.trim();
    if s.is_empty() || s.len() > 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u128::from_str_radix(s, 16).ok()
}

/// One parsed `x-braid:` context name or query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BraidContext {
    /// `x-braid:` on its own: every listable context.
    All,
    /// `x-braid:volume` / `x-braid:volume=` (query) or with a value.
    Volume(Option<String>),
    Portal(Option<String>),
    Conn(Option<ConnId>),
    /// The session token a connection presents.
    Session(SessionToken),
    Instance(Option<InstanceId>),
    /// Connection ids to fence; never empty.
    Fence(Vec<ConnId>),
}

impl BraidContext {
    /// Parses a name or query; `None` if it is not in the namespace or is
    /// malformed (the spec has servers ignore unknown queries).
    pub fn parse(name: &str) -> Option<Self> {
        let leaf = name.strip_prefix(NAMESPACE)?;
        if leaf.is_empty() {
            return Some(Self::All);
        }
        let (key, value) = match leaf.split_once('=') {
            Some((k, v)) => (k, Some(v).filter(|v| !v.is_empty())),
            None => (leaf, None),
        };
        match key {
            "volume" => Some(Self::Volume(value.map(str::to_owned))),
            "portal" => Some(Self::Portal(value.map(str::to_owned))),
            "conn" => match value {
                None => Some(Self::Conn(None)),
                Some(v) => hex128(v).map(|id| Self::Conn(Some(ConnId(id)))),
            },
            "session" => hex128(value?).map(|t| Self::Session(SessionToken(t))),
            "instance" => match value {
                None => Some(Self::Instance(None)),
                Some(v) => hex128(v).map(|id| Self::Instance(Some(InstanceId(id)))),
            },
            "fence" => {
                let ids = value?
                    .split(',')
                    .map(|s| hex128(s).map(ConnId))
                    .collect::<Option<Vec<_>>>()?;
                (!ids.is_empty()).then_some(Self::Fence(ids))
            }
            _ => None,
        }
    }

    /// The context name, as listed by a server.
    pub fn name(&self) -> String {
        match self {
            Self::All => NAMESPACE.to_owned(),
            Self::Volume(v) => format!("{NAMESPACE}volume={}", v.as_deref().unwrap_or("")),
            Self::Portal(p) => format!("{NAMESPACE}portal={}", p.as_deref().unwrap_or("")),
            Self::Conn(c) => match c {
                Some(id) => format!("{NAMESPACE}conn={id}"),
                None => format!("{NAMESPACE}conn="),
            },
            Self::Session(t) => format!("{NAMESPACE}session={t}"),
            Self::Instance(i) => match i {
                Some(id) => format!("{NAMESPACE}instance={id}"),
                None => format!("{NAMESPACE}instance="),
            },
            Self::Fence(ids) => {
                let list: Vec<String> = ids.iter().map(ConnId::to_string).collect();
                format!("{NAMESPACE}fence={}", list.join(","))
            }
        }
    }
}

/// Whether a server's list answer confirms a fence of `ids`: it names the
/// same set of connections, in whatever order (servers list them sorted).
pub fn confirms_fence(listed: &[String], ids: &[ConnId]) -> bool {
    let mut want = ids.to_vec();
    want.sort_unstable();
    want.dedup();
    listed.iter().any(|name| match BraidContext::parse(name) {
        Some(BraidContext::Fence(mut got)) => {
            got.sort_unstable();
            got.dedup();
            got == want
        }
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_is_confirmed_by_the_same_ids_in_any_order() {
        let (a, b) = (ConnId(0xcf5a << 100), ConnId(0x01da << 100));
        let listed = vec![
            "x-braid:session=0000000000000000000000000000002a".to_owned(),
            format!("x-braid:fence={b},{a}"),
        ];
        assert!(confirms_fence(&listed, &[a, b]), "asked unsorted");
        assert!(confirms_fence(&listed, &[b, a, a]));
        assert!(!confirms_fence(&listed, &[a]), "a subset is another fence");
        assert!(!confirms_fence(&listed, &[a, b, ConnId(1)]));
        assert!(!confirms_fence(&listed[..1], &[a, b]));
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(BraidContext::parse("x-braid:"), Some(BraidContext::All));
        assert_eq!(
            BraidContext::parse("x-braid:volume"),
            Some(BraidContext::Volume(None))
        );
        assert_eq!(
            BraidContext::parse("x-braid:volume="),
            Some(BraidContext::Volume(None))
        );
        assert_eq!(
            BraidContext::parse("x-braid:volume=abc"),
            Some(BraidContext::Volume(Some("abc".into())))
        );
        assert_eq!(
            BraidContext::parse("x-braid:portal=[::1]:10809"),
            Some(BraidContext::Portal(Some("[::1]:10809".into())))
        );
        assert_eq!(
            BraidContext::parse("x-braid:conn=17"),
            Some(BraidContext::Conn(Some(ConnId(0x17))))
        );
        assert_eq!(
            BraidContext::parse("x-braid:fence=1,2, a"),
            Some(BraidContext::Fence(vec![ConnId(1), ConnId(2), ConnId(10)]))
        );
        assert_eq!(
            BraidContext::parse("x-braid:session=00000000000000000000000000000abc"),
            Some(BraidContext::Session(SessionToken(0xabc)))
        );
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "base:allocation",
            "x-braid",
            "x-braid:fence",
            "x-braid:fence=",
            "x-braid:fence=1,x",
            "x-braid:conn=-1",
            "x-braid:conn=123456789012345678901234567890123",
            "x-braid:session",
            "x-braid:session=xyz",
            "x-braid:colour=red",
        ] {
            assert_eq!(BraidContext::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn ids_are_written_as_32_hex_digits() {
        assert_eq!(
            BraidContext::Conn(Some(ConnId(255))).name(),
            "x-braid:conn=000000000000000000000000000000ff"
        );
    }

    #[test]
    fn names_parse_back() {
        for c in [
            BraidContext::Volume(Some("u".into())),
            BraidContext::Portal(Some("10.0.0.1:10809".into())),
            BraidContext::Conn(Some(ConnId(u128::MAX))),
            BraidContext::Session(SessionToken(7)),
            BraidContext::Instance(Some(InstanceId(9))),
            BraidContext::Fence(vec![ConnId(4), ConnId(u128::MAX - 1)]),
        ] {
            assert_eq!(BraidContext::parse(&c.name()), Some(c));
        }
    }
}
