//! The `x-braid:` metadata context namespace: what braid adds to NBD
//! (DESIGN.md, "Wire conventions"). The spec reserves `x-*` namespaces for
//! such use; clients that never ask for them never see them.
//!
//! | context | meaning |
//! |---|---|
//! | `x-braid:volume=<uuid>` | the export's stable identity |
//! | `x-braid:portal=<addr>:<port>` | one address the target serves on |
//! | `x-braid:conn=<id>` | the id of the connection that asked |
//! | `x-braid:fence=<id>,<id>...` | close those connections and drain them |
//!
//! Queries: `x-braid:` lists volume, portals and conn; `x-braid:volume`,
//! `x-braid:portal` and `x-braid:conn` (with or without a trailing `=`)
//! list one kind; `x-braid:fence=...` performs a fence and answers with the
//! same name once it has completed.

/// The namespace prefix, colon included.
pub const NAMESPACE: &str = "x-braid:";

/// One parsed `x-braid:` context name or query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BraidContext {
    /// `x-braid:` on its own: every listable context.
    All,
    /// `x-braid:volume` / `x-braid:volume=` (query) or with a value.
    Volume(Option<String>),
    Portal(Option<String>),
    Conn(Option<u64>),
    /// Connection ids to fence; never empty.
    Fence(Vec<u64>),
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
                Some(v) => v.parse().ok().map(|id| Self::Conn(Some(id))),
            },
            "fence" => {
                let ids = value?
                    .split(',')
                    .map(|s| s.trim().parse::<u64>())
                    .collect::<Result<Vec<_>, _>>()
                    .ok()?;
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
            Self::Fence(ids) => {
                let list: Vec<String> = ids.iter().map(u64::to_string).collect();
                format!("{NAMESPACE}fence={}", list.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Some(BraidContext::Conn(Some(17)))
        );
        assert_eq!(
            BraidContext::parse("x-braid:fence=1,2, 3"),
            Some(BraidContext::Fence(vec![1, 2, 3]))
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
            "x-braid:colour=red",
        ] {
            assert_eq!(BraidContext::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn names_parse_back() {
        for c in [
            BraidContext::Volume(Some("u".into())),
            BraidContext::Portal(Some("10.0.0.1:10809".into())),
            BraidContext::Conn(Some(4)),
            BraidContext::Fence(vec![4, 5]),
        ] {
            assert_eq!(BraidContext::parse(&c.name()), Some(c));
        }
    }
}
