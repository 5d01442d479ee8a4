//! One path on the command line: `PORTAL[@LOCAL][,key=value...]`, e.g.
//! `10.0.1.5@eth1,weight=3,priority=1`, or `@eth2,standby` for whichever
//! portal the local side pairs with.
//!
//! The keys are the per-path knobs the policies read (see
//! [`crate::engine::PathConfig`]): `priority` (failover order, lower
//! first), `weight` (weighted paths, lower first), `standby`
//! (round-robin-subset's standby set), `relative-throughput` (service-time)
//! `repeat-count` (round-robin's requests per turn, dm's `rr_min_io`) and
//! `queue-depth` (every policy: the most requests kept in flight on the
//! path).
//! This module parses and matches; the volume applies.

use std::net::{IpAddr, SocketAddr};

use crate::conn::Local;
use crate::discover::LocalSpec;
use crate::engine::PathConfig;
use crate::uri::Endpoint;

/// The NBD port, for portals given without one.
const NBD_PORT: u16 = 10809;

/// Knobs given for a path; unset ones keep their value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathAttrs {
    pub priority: Option<u32>,
    pub weight: Option<u32>,
    pub relative_throughput: Option<u32>,
    pub standby: Option<bool>,
    pub repeat_count: Option<u32>,
    pub queue_depth: Option<u32>,
}

impl PathAttrs {
    /// Parses `key=value` items (and a bare `standby`), separated by
    /// commas.
    ///
    /// # Errors
    ///
    /// A message naming the item and the keys there are.
    pub fn parse<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<Self, String> {
        let mut a = Self::default();
        for item in items.into_iter().map(str::trim).filter(|i| !i.is_empty()) {
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (item, None),
            };
            let number = || -> Result<u32, String> {
                value
                    .ok_or_else(|| format!("{key} needs a value ({key}=N)"))?
                    .parse()
                    .map_err(|_| format!("{item:?}: {key} takes a whole number"))
            };
            match key {
                "priority" => a.priority = Some(number()?),
                "weight" => a.weight = Some(number()?),
                "relative-throughput" | "relative_throughput" => {
                    a.relative_throughput = Some(number()?);
                }
                "repeat-count" | "repeat_count" => a.repeat_count = Some(number()?),
                "queue-depth" | "queue_depth" => a.queue_depth = Some(number()?),
                "standby" => {
                    a.standby = Some(match value {
                        None | Some("yes" | "true" | "1" | "on") => true,
                        Some("no" | "false" | "0" | "off") => false,
                        Some(v) => return Err(format!("standby={v:?}: write yes or no")),
                    });
                }
                _ => {
                    return Err(format!(
                        "{item:?}: unknown path setting {key:?}; there are priority, weight, \
                         standby, relative-throughput, repeat-count and queue-depth"
                    ))
                }
            }
        }
        Ok(a)
    }

    /// `config` with these settings over it.
    pub fn apply(&self, config: &mut PathConfig) {
        if let Some(v) = self.priority {
            config.priority = v;
        }
        if let Some(v) = self.weight {
            config.weight = v;
        }
        if let Some(v) = self.relative_throughput {
            config.relative_throughput = v;
        }
        if let Some(v) = self.standby {
            config.standby = v;
        }
        if let Some(v) = self.repeat_count {
            config.repeat_count = v;
        }
        if let Some(v) = self.queue_depth {
            config.queue_depth = v;
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// One `--path` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathRule {
    /// The portal; `None` matches any.
    pub portal: Option<SocketAddr>,
    /// The portal was given without a port: it stands for the volume's
    /// protocol's (NBD's until [`Self::default_port`] says otherwise).
    pub port_implied: bool,
    /// The local side; `None` matches any.
    pub local: Option<LocalSpec>,
    pub attrs: PathAttrs,
}

impl std::str::FromStr for PathRule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let mut items = s.split(',');
        let head = items.next().unwrap_or_default().trim();
        let (portal, local) = match head.rsplit_once('@') {
            Some((p, l)) => (p, Some(l)),
            None => (head, None),
        };
        let port_implied = !portal.is_empty() && portal.parse::<SocketAddr>().is_err();
        let portal = (!portal.is_empty())
            .then(|| parse_portal(portal))
            .transpose()
            .map_err(|e| format!("--path {s:?}: {e}"))?;
        let local = local
            .map(|l| l.parse::<LocalSpec>())
            .transpose()
            .map_err(|e| format!("--path {s:?}: {e}"))?;
        if portal.is_none() && local.is_none() {
            return Err(format!(
                "--path {s:?}: name a portal, a local side or both (10.0.1.5@eth1,weight=3)"
            ));
        }
        let attrs = PathAttrs::parse(items).map_err(|e| format!("--path {s:?}: {e}"))?;
        Ok(Self {
            portal,
            port_implied,
            local,
            attrs,
        })
    }
}

impl PathRule {
    /// The rule for a volume whose protocol listens on `port` by default
    /// (3260 for iSCSI): a portal given without a port gets that one.
    #[must_use]
    pub fn default_port(mut self, port: u16) -> Self {
        if self.port_implied {
            if let Some(p) = &mut self.portal {
                p.set_port(port);
            }
        }
        self
    }

    /// Whether this rule names the path from `local` to `portal`.
    pub fn matches(&self, local: &Local, portal: &Endpoint) -> bool {
        let portal_ok = match (self.portal, portal) {
            (None, _) => true,
            (Some(want), Endpoint::Tcp(have)) => want == *have,
            (Some(_), Endpoint::Unix(_)) => false,
        };
        let local_ok = match &self.local {
            None => true,
            Some(LocalSpec::Addr(ip)) => local.addr == Some(*ip),
            Some(LocalSpec::Iface(name)) => local.device.as_deref() == Some(name),
        };
        portal_ok && local_ok
    }
}

fn parse_portal(s: &str) -> Result<SocketAddr, String> {
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Ok(sa);
    }
    s.trim_matches(|c| c == '[' || c == ']')
        .parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, NBD_PORT))
        .map_err(|_| format!("{s:?} is not a portal address (10.0.1.5, 10.0.1.5:10810, [fd00::5])"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_portal_without_a_port_takes_the_volumes_protocols() {
        let r: PathRule = "10.0.1.5,weight=2".parse().unwrap();
        assert_eq!(r.portal, Some("10.0.1.5:10809".parse().unwrap()));
        let r = r.default_port(3260);
        assert_eq!(r.portal, Some("10.0.1.5:3260".parse().unwrap()));
        let given: PathRule = "10.0.1.5:3261@eth1".parse().unwrap();
        assert_eq!(
            given.default_port(3260).portal,
            Some("10.0.1.5:3261".parse().unwrap()),
            "a port given stays"
        );
    }

    #[test]
    fn a_path_names_portal_local_and_knobs() {
        let r: PathRule = "10.0.1.5@eth1,weight=3,priority=1".parse().unwrap();
        assert_eq!(r.portal, Some("10.0.1.5:10809".parse().unwrap()));
        assert_eq!(r.local, Some(LocalSpec::Iface("eth1".into())));
        assert_eq!(r.attrs.weight, Some(3));
        assert_eq!(r.attrs.priority, Some(1));
        let r: PathRule = "[fd00::5]:10810@10.0.2.2,standby,repeat-count=8"
            .parse()
            .unwrap();
        assert_eq!(r.portal, Some("[fd00::5]:10810".parse().unwrap()));
        assert_eq!(r.local, Some(LocalSpec::Addr("10.0.2.2".parse().unwrap())));
        assert_eq!(r.attrs.standby, Some(true));
        assert_eq!(r.attrs.repeat_count, Some(8));
        let r: PathRule = "@eth2,standby=no,relative-throughput=10".parse().unwrap();
        assert_eq!(r.portal, None);
        assert_eq!(r.attrs.standby, Some(false));
        assert_eq!(r.attrs.relative_throughput, Some(10));
        let r: PathRule = "10.0.1.5".parse().unwrap();
        assert!(r.attrs.is_empty() && r.local.is_none());
    }

    #[test]
    fn mistakes_name_what_is_wrong() {
        for (bad, says) in [
            (",weight=1", "name a portal"),
            ("10.0.1.5,wieght=1", "unknown path setting \"wieght\""),
            ("10.0.1.5,weight=x", "whole number"),
            ("10.0.1.5,weight", "needs a value"),
            ("10.0.1.5,standby=maybe", "yes or no"),
            ("10.0.1.x@eth1", "not a portal address"),
            ("10.0.1.5@a/b", "--local"),
        ] {
            let e = bad.parse::<PathRule>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn rules_match_by_portal_and_local_side() {
        let portal = Endpoint::Tcp("10.0.1.5:10809".parse().unwrap());
        let eth1 = Local {
            device: Some("eth1".into()),
            addr: Some("10.0.1.2".parse().unwrap()),
        };
        let r = |s: &str| s.parse::<PathRule>().unwrap();
        assert!(r("10.0.1.5@eth1").matches(&eth1, &portal));
        assert!(r("10.0.1.5@10.0.1.2").matches(&eth1, &portal));
        assert!(r("@eth1").matches(&eth1, &portal));
        assert!(r("10.0.1.5").matches(&Local::default(), &portal));
        assert!(!r("10.0.1.5@eth2").matches(&eth1, &portal));
        assert!(!r("10.0.1.6").matches(&eth1, &portal));
        assert!(!r("10.0.1.5:10810").matches(&eth1, &portal));
    }

    #[test]
    fn attrs_apply_over_a_config() {
        let mut c = PathConfig {
            weight: 7,
            ..Default::default()
        };
        PathAttrs::parse(["priority=2", "standby"])
            .unwrap()
            .apply(&mut c);
        assert_eq!(
            c,
            PathConfig {
                priority: 2,
                weight: 7,
                standby: true,
                ..Default::default()
            }
        );
    }
}
