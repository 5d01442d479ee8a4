//! What an operator changes on a live volume (policy, a path in or out of
//! use, a path's knobs), and how `--path` rules become each path's knobs
//! at open.

use braid_policy::{by_name, PolicyOptions, UnknownPolicy};

use super::{EventKind, Volume, VolumeConfig};
use crate::discover::{LocalSpec, PathSpec};
use crate::engine::{PathConfig, PathId};
use crate::pathrule::{PathAttrs, PathRule};

/// Why a policy could not be switched to.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    #[error(transparent)]
    Unknown(#[from] UnknownPolicy),
    /// The policy would spread writes over connections a FLUSH on one does
    /// not cover.
    #[error(
        "policy {policy:?} spreads the volume over {connections} connections, but the server \
         does not offer CAN_MULTI_CONN (its connections may not share a cache, so a flush on one \
         would not cover writes on another); only failover is safe with this server"
    )]
    NotMultiConn { policy: String, connections: usize },
}

impl Volume {
    /// Switches policy on the live volume, refusing one that would spread
    /// writes where the target's FLUSH would not cover them (the same rule
    /// as at open).
    ///
    /// # Errors
    ///
    /// [`PolicyError`]: an unknown name, or a spreading policy on a target
    /// without CAN_MULTI_CONN.
    pub fn set_policy(&self, name: &str, opts: &PolicyOptions) -> Result<(), PolicyError> {
        let policy = by_name(name, opts)?;
        let connections = self.info.paths.len() * self.info.connections_per_path;
        if name != "failover" && connections > 1 && !self.info.flags.can_multi_conn() {
            return Err(PolicyError::NotMultiConn {
                policy: name.to_owned(),
                connections,
            });
        }
        let mut core = self.shared.lock();
        core.engine.set_policy(policy);
        let text = format!("policy switched to {name}");
        core.timeline
            .record(EventKind::PolicySwitched, None, text, None);
        Ok(())
    }

    /// Takes path `index` (1-based) out of use, or back into use.
    ///
    /// # Errors
    ///
    /// No such path.
    pub fn set_path_enabled(&self, index: usize, enabled: bool) -> Result<(), String> {
        let path = self.path_id(index)?;
        let mut core = self.shared.lock();
        let now = self.shared.now();
        core.engine.set_enabled(now, path, enabled);
        core.act(&self.shared);
        let (kind, text) = if enabled {
            (EventKind::PathEnabled, "enabled: carries I/O again")
        } else {
            (
                EventKind::PathDisabled,
                "disabled: drained, new requests go elsewhere",
            )
        };
        core.timeline.record(kind, Some(index), text, None);
        Ok(())
    }

    /// Sets knobs of path `index` (1-based); unset ones keep their value.
    /// Returns the path's knobs now.
    ///
    /// # Errors
    ///
    /// No such path.
    pub fn set_path_attrs(&self, index: usize, attrs: &PathAttrs) -> Result<PathConfig, String> {
        let path = self.path_id(index)?;
        let mut core = self.shared.lock();
        let now = self.shared.now();
        let mut config = core.engine.path_report(path, now).config;
        attrs.apply(&mut config);
        core.engine.set_path_config(now, path, config.clone());
        core.act(&self.shared);
        Ok(config)
    }

    fn path_id(&self, index: usize) -> Result<PathId, String> {
        let count = self.shared.lock().engine.path_count();
        if index == 0 || index > count {
            return Err(format!(
                "no path {index}: the volume has paths 1 to {count}"
            ));
        }
        Ok(PathId(index - 1))
    }
}

/// The local sides to open with: those given, then those the `--path`
/// rules name, each once. (Their portals join after discovery.)
pub(super) fn with_rules(cfg: &VolumeConfig) -> Vec<LocalSpec> {
    let mut locals = cfg.locals.clone();
    for l in cfg.paths.iter().filter_map(|r| r.local.as_ref()) {
        if !locals.contains(l) {
            locals.push(l.clone());
        }
    }
    locals
}

/// Each path's knobs: every rule that matches it, in order.
///
/// # Errors
///
/// A rule naming both a portal and a local side that no path pairs.
pub(super) fn path_configs(
    rules: &[PathRule],
    specs: &[PathSpec],
) -> Result<Vec<PathConfig>, String> {
    for rule in rules {
        if !specs.iter().any(|s| rule.matches(&s.local, &s.portal)) {
            let named = specs.iter().map(ToString::to_string).collect::<Vec<_>>();
            return Err(format!(
                "--path {}: no path matches it (the paths are: {}); check the portal and the \
                 local side's subnet",
                describe(rule),
                named.join(", ")
            ));
        }
    }
    Ok(specs
        .iter()
        .map(|s| {
            let mut config = PathConfig::default();
            for rule in rules.iter().filter(|r| r.matches(&s.local, &s.portal)) {
                rule.attrs.apply(&mut config);
            }
            config
        })
        .collect())
}

fn describe(rule: &PathRule) -> String {
    let portal = rule.portal.map(|p| p.to_string()).unwrap_or_default();
    match &rule.local {
        Some(LocalSpec::Addr(ip)) => format!("{portal}@{ip}"),
        Some(LocalSpec::Iface(name)) => format!("{portal}@{name}"),
        None => portal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::Local;
    use crate::uri::Endpoint;

    fn spec(local: &str, portal: &str) -> PathSpec {
        PathSpec {
            local: Local {
                device: Some(local.into()),
                addr: None,
            },
            portal: Endpoint::Tcp(portal.parse().unwrap()),
        }
    }

    #[test]
    fn each_path_takes_the_knobs_of_the_rules_that_match_it() {
        let specs = [
            spec("eth1", "10.0.1.5:10809"),
            spec("eth2", "10.0.2.5:10809"),
        ];
        let rules: Vec<PathRule> = [
            "@eth2,standby",
            "10.0.1.5,weight=3,priority=2",
            "@eth1,priority=1",
        ]
        .iter()
        .map(|r| r.parse().unwrap())
        .collect();
        let c = path_configs(&rules, &specs).unwrap();
        assert_eq!((c[0].weight, c[0].priority, c[0].standby), (3, 1, false));
        assert_eq!((c[1].weight, c[1].priority, c[1].standby), (0, 0, true));
    }

    #[test]
    fn a_rule_that_matches_no_path_is_refused() {
        let specs = [spec("eth1", "10.0.1.5:10809")];
        let rules = vec!["10.0.9.5@eth1,weight=1".parse().unwrap()];
        let e = path_configs(&rules, &specs).unwrap_err();
        assert!(
            e.contains("10.0.9.5:10809@eth1") && e.contains("eth1 → 10.0.1.5:10809"),
            "{e}"
        );
    }
}
