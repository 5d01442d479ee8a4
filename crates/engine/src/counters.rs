//! Counters of a whole volume, beside each path's own
//! ([`super::PathCounters`]): what the user saw go wrong, and what the
//! engine did about failed paths. Each field says exactly when it moves.

/// Volume-wide counters; they only grow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeCounters {
    /// User requests completed with an error, of any kind: moves once per
    /// request when its completion carries an error.
    pub errors_returned: u64,
    /// Of those, the ones whose error was EIO (the target's EIO, or no path
    /// in time).
    pub eio_returned: u64,
    /// Of those, the ones that failed because no path came back within the
    /// no-path timeout.
    pub no_path_timeouts: u64,
    /// Fences of failed paths' connections that the target confirmed:
    /// moves when the driver reports a fence done.
    pub fences: u64,
}
