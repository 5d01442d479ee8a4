//! What a front end can serve, stated by the front end as data: the binary
//! reads it to refuse a configuration the front end cannot honour, rather
//! than keep its own copy of each protocol's limits.

/// One front end's capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// The protocol's name, as messages say it.
    pub protocol: &'static str,
    /// Its portals can be served over TLS.
    pub tls: bool,
    /// It takes part in fencing across the gateways of one Ceph image, so
    /// an `rbd:` export may be served by several gateways at once.
    pub fenced_across_gateways: bool,
    /// It serves forwarded storage (a multipath volume, `braid attach`) as
    /// well as storage on this host.
    pub forwarded: bool,
    /// The `tracing` target its log lines carry (its crate's
    /// `module_path!()`), so the binary can set its level without naming
    /// each front end: `braid demo` keeps every one at warnings.
    pub log_target: &'static str,
}
