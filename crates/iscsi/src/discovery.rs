//! SendTargets (RFC 7143, "SendTargets Operation"): the text a target
//! answers a discovery session with, naming each target and every portal
//! it is reached on, so that one discovery gives an initiator every path.

use std::net::SocketAddr;

use crate::text;

/// A target as discovery lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    pub name: String,
    /// Every portal it is served on, with the portal group tag of each.
    pub portals: Vec<(SocketAddr, u16)>,
}

/// Why a SendTargets request cannot be answered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SendTargetsError {
    #[error("SendTargets=All is only allowed in a discovery session")]
    AllInNormalSession,
}

/// The answer to `SendTargets=<value>`: `All` lists every target (in a
/// discovery session), a target's name lists that one, and an empty value
/// the session's own target. Unknown names list nothing, as the RFC asks.
///
/// # Errors
///
/// [`SendTargetsError::AllInNormalSession`].
pub fn answer(
    value: &str,
    targets: &[Listing],
    discovery: bool,
    own: Option<&str>,
) -> Result<Vec<u8>, SendTargetsError> {
    let chosen: Vec<&Listing> = match value {
        "All" if !discovery => return Err(SendTargetsError::AllInNormalSession),
        "All" => targets.iter().collect(),
        "" => targets
            .iter()
            .filter(|t| Some(t.name.as_str()) == own)
            .collect(),
        name => targets.iter().filter(|t| t.name == name).collect(),
    };
    let mut pairs: Vec<(&str, String)> = Vec::new();
    for t in chosen {
        pairs.push(("TargetName", t.name.clone()));
        for (addr, tag) in &t.portals {
            // IPv6 addresses go in brackets (SocketAddr's Display does it).
            pairs.push(("TargetAddress", format!("{addr},{tag}")));
        }
    }
    Ok(text::encode(&pairs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listings() -> Vec<Listing> {
        vec![
            Listing {
                name: "iqn.2026-11.org.example:a".into(),
                portals: vec![
                    ("10.0.1.5:3260".parse().unwrap(), 1),
                    ("[fd00::5]:3260".parse().unwrap(), 2),
                ],
            },
            Listing {
                name: "iqn.2026-11.org.example:b".into(),
                portals: vec![("10.0.1.5:3260".parse().unwrap(), 1)],
            },
        ]
    }

    #[test]
    fn all_lists_every_target_with_every_portal() {
        let text = answer("All", &listings(), true, None).unwrap();
        assert_eq!(
            text,
            b"TargetName=iqn.2026-11.org.example:a\0\
              TargetAddress=10.0.1.5:3260,1\0\
              TargetAddress=[fd00::5]:3260,2\0\
              TargetName=iqn.2026-11.org.example:b\0\
              TargetAddress=10.0.1.5:3260,1\0"
        );
    }

    #[test]
    fn a_name_or_the_own_target_lists_one_and_unknown_names_none() {
        let one = answer("iqn.2026-11.org.example:b", &listings(), true, None).unwrap();
        assert!(one.starts_with(b"TargetName=iqn.2026-11.org.example:b\0"));
        let own = answer("", &listings(), false, Some("iqn.2026-11.org.example:a")).unwrap();
        assert_eq!(own.iter().filter(|&&b| b == 0).count(), 3);
        assert!(answer("iqn.nope", &listings(), true, None)
            .unwrap()
            .is_empty());
        assert_eq!(
            answer("All", &listings(), false, None),
            Err(SendTargetsError::AllInNormalSession)
        );
    }
}
