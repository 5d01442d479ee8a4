//! Who may log in to a target, with which CHAP credentials, and which
//! targets each initiator may see: the per-initiator entries of an access
//! list, what an initiator not in it gets (nothing, unless the list says
//! otherwise), and the credential of discovery sessions, which is its own.
//!
//! Initiators are known by their InitiatorName, compared without regard to
//! ASCII case (RFC 3722 folds names to lower case before comparing). A
//! name is only a claim: what binds a login to it is the CHAP secret of
//! its entry, so an entry without one grants its targets to anyone who
//! says the name.

use crate::chap::Credentials;

/// What one initiator (or every initiator not listed) is granted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    /// CHAP credentials its logins must prove; `None`: AuthMethod None.
    pub chap: Option<Credentials>,
    /// Target names it may see and log in to; `None`: every target.
    pub targets: Option<Vec<String>>,
}

impl Grant {
    /// Whether this grant reaches the target named `target`.
    pub fn sees(&self, target: &str) -> bool {
        self.targets
            .as_ref()
            .is_none_or(|t| t.iter().any(|n| n == target))
    }
}

/// One initiator's entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub initiator: String,
    pub grant: Grant,
}

/// The whole access list a target checks logins against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    pub initiators: Vec<Entry>,
    /// What an initiator with no entry gets; `None`: it is refused.
    pub others: Option<Grant>,
    /// CHAP credentials of discovery sessions (any initiator that may log
    /// in at all); `None`: discovery needs no authentication.
    pub discovery: Option<Credentials>,
}

impl Access {
    /// No list: every initiator may see every target, with `chap` (one
    /// credential for everyone, discovery included) or without.
    pub fn open(chap: Option<Credentials>) -> Self {
        Self {
            initiators: Vec::new(),
            discovery: chap.clone(),
            others: Some(Grant {
                chap,
                targets: None,
            }),
        }
    }

    /// The grant of the initiator named `initiator`: its entry's, else
    /// what others get; `None` if it may not log in.
    pub fn grant(&self, initiator: &str) -> Option<&Grant> {
        self.initiators
            .iter()
            .find(|e| e.initiator.eq_ignore_ascii_case(initiator))
            .map(|e| &e.grant)
            .or(self.others.as_ref())
    }

    /// Whether `initiator` may see `target` (in discovery, and at login).
    pub fn sees(&self, initiator: &str, target: &str) -> bool {
        self.grant(initiator).is_some_and(|g| g.sees(target))
    }

    /// Whether any login must prove CHAP credentials.
    pub fn any_chap(&self) -> bool {
        self.discovery.is_some()
            || self.others.as_ref().is_some_and(|g| g.chap.is_some())
            || self.initiators.iter().any(|e| e.grant.chap.is_some())
    }
}

impl Default for Access {
    fn default() -> Self {
        Self::open(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(user: &str) -> Credentials {
        Credentials {
            user: user.into(),
            secret: b"twelve-bytes".to_vec(),
            mutual: None,
        }
    }

    #[test]
    fn entries_are_found_by_name_in_any_case_and_others_get_the_default() {
        let a = Access {
            initiators: vec![Entry {
                initiator: "iqn.2026-11.org.example:a".into(),
                grant: Grant {
                    chap: Some(creds("a")),
                    targets: Some(vec!["t1".into()]),
                },
            }],
            others: None,
            discovery: None,
        };
        let g = a.grant("IQN.2026-11.org.EXAMPLE:a").expect("found");
        assert_eq!(g.chap.as_ref().map(|c| c.user.as_str()), Some("a"));
        assert!(a.sees("iqn.2026-11.org.example:a", "t1"));
        assert!(!a.sees("iqn.2026-11.org.example:a", "t2"));
        assert!(a.grant("iqn.2026-11.org.example:b").is_none());
        assert!(!a.sees("iqn.2026-11.org.example:b", "t1"));
        assert!(a.any_chap());

        let open = Access::open(None);
        assert!(open.sees("iqn.2026-11.org.example:b", "anything"));
        assert!(!open.any_chap());
        let one = Access::open(Some(creds("all")));
        assert_eq!(one.discovery, Some(creds("all")));
        assert_eq!(
            one.grant("x").and_then(|g| g.chap.clone()),
            Some(creds("all"))
        );
    }
}
