//! Whether librbd really runs an image without a write cache.
//!
//! The gateway asks for `rbd_cache = false`, but librbd lets a pool's or
//! an image's own setting (`rbd config pool set POOL rbd_cache true`,
//! `rbd config image set ...`) override what a client asked for, and a
//! persistent write-back cache (`rbd_plugins = pwl_cache`) is switched on
//! the same way. A gateway running with either acknowledges writes from
//! its own memory while reporting the image's shared instance (so no
//! client replays what its crash lost) and reads stale data that another
//! gateway overwrote. So after every open the effective settings are
//! read back (`Image::config`) and the image is refused, with the command
//! that turns the cache off for that image, unless `--rbd-cache` asked for
//! a cache (the gateway then serves alone, with its own instance).
//!
//! A snapshot is exempt: it never changes, so a cache of it cannot go
//! stale, and nothing is written to it.

use braid_rbd::{ConfigOption, ConfigSource};

use crate::source::RbdSpec;

/// Why `spec`, opened with the effective options `opts`, may not be
/// served: `None` when no cache is on, or when `--rbd-cache` asked for
/// one (`wanted`), or for a snapshot.
pub(super) fn refusal(spec: &RbdSpec, opts: &[ConfigOption], wanted: bool) -> Option<String> {
    if wanted || spec.snap.is_some() {
        return None;
    }
    let get = |name: &str| opts.iter().find(|o| o.name == name);
    let image = spec.rbd_name();
    if let Some(o) = get("rbd_cache").filter(|o| o.value == "true") {
        return Some(format!(
            "{spec}: librbd's cache is on for this image ({}), which overrides the rbd_cache = \
             false every braid gateway asks for: writes would be acknowledged from this \
             gateway's memory while all its gateways report one instance, so a crash would \
             lose them with no client replaying, and the other gateways would read old data. \
             Turn it off for this image: `rbd config image set {image} rbd_cache false` (or \
             serve the image from one gateway only, with --rbd-cache)",
            origin(o, &spec.pool, &image),
        ));
    }
    let plugins = get("rbd_plugins").map_or("", |o| o.value.as_str());
    let pwl = plugins.split(',').any(|p| p.trim() == "pwl_cache");
    if let Some(o) = get("rbd_persistent_cache_mode").filter(|o| pwl && o.value != "disabled") {
        return Some(format!(
            "{spec}: a persistent write-back cache is on for this image ({}, with rbd_plugins = \
             {plugins}): writes would be acknowledged from this host's cache device before they \
             reach the cluster, which the other gateways cannot read. Turn it off for this \
             image: `rbd config image set {image} rbd_persistent_cache_mode disabled`",
            origin(o, &spec.pool, &image),
        ));
    }
    None
}

/// Where an option's value was set, said with the command that shows it.
fn origin(o: &ConfigOption, pool: &str, image: &str) -> String {
    let name = &o.name;
    let value = &o.value;
    match o.source {
        ConfigSource::Image => {
            format!("{name} = {value} set on the image: rbd config image get {image} {name}")
        }
        ConfigSource::Pool => {
            format!("{name} = {value} set on pool {pool}: rbd config pool get {pool} {name}")
        }
        ConfigSource::Client => format!("{name} = {value} in this gateway's Ceph configuration"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(name: &str, value: &str, source: ConfigSource) -> ConfigOption {
        ConfigOption {
            name: name.into(),
            value: value.into(),
            source,
        }
    }

    fn defaults() -> Vec<ConfigOption> {
        vec![
            opt("rbd_cache", "false", ConfigSource::Client),
            opt("rbd_cache_policy", "writearound", ConfigSource::Client),
            opt(
                "rbd_persistent_cache_mode",
                "disabled",
                ConfigSource::Client,
            ),
            opt("rbd_plugins", "", ConfigSource::Client),
        ]
    }

    #[test]
    fn a_pool_or_image_override_is_refused_with_the_command_for_this_image() {
        let spec: RbdSpec = "vms/disk1".parse().unwrap();
        assert_eq!(refusal(&spec, &defaults(), false), None);
        for (source, shown) in [
            (
                ConfigSource::Pool,
                "set on pool vms: rbd config pool get vms rbd_cache",
            ),
            (
                ConfigSource::Image,
                "set on the image: rbd config image get vms/disk1 rbd_cache",
            ),
        ] {
            let mut opts = defaults();
            opts[0] = opt("rbd_cache", "true", source);
            let m = refusal(&spec, &opts, false).expect("refused");
            assert!(m.contains(shown), "{m}");
            assert!(
                m.contains("`rbd config image set vms/disk1 rbd_cache false`"),
                "{m}"
            );
            assert_eq!(
                refusal(&spec, &opts, true),
                None,
                "--rbd-cache asked for it"
            );
            let snap: RbdSpec = "vms/disk1@monday".parse().unwrap();
            assert_eq!(
                refusal(&snap, &opts, false),
                None,
                "a snapshot never changes"
            );
        }
    }

    #[test]
    fn a_persistent_write_back_cache_counts_only_with_its_plugin() {
        let spec: RbdSpec = "rbd/vol".parse().unwrap();
        let mut opts = defaults();
        opts[2] = opt("rbd_persistent_cache_mode", "ssd", ConfigSource::Image);
        assert_eq!(
            refusal(&spec, &opts, false),
            None,
            "mode without the plugin"
        );
        opts[3] = opt("rbd_plugins", "parent_cache,pwl_cache", ConfigSource::Pool);
        let m = refusal(&spec, &opts, false).expect("refused");
        assert!(
            m.contains("`rbd config image set rbd/vol rbd_persistent_cache_mode disabled`"),
            "{m}"
        );
    }
}
