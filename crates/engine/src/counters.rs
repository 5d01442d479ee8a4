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
    /// Restarts of the target seen (a new instance, or a reset a new
    /// session was told of that no witness explained): moves once per
    /// restart, whatever the number of paths that saw it.
    pub restarts: u64,
    /// Bytes given again to restarted targets: moves when a replay starts.
    pub replay_bytes: u64,
    /// Times the volume was found to have lost acknowledged writes (a
    /// restart the window could not cover, or a replay that failed).
    pub losses: u64,
    /// FLUSHes and FUA writes failed with EIO because of a loss: moves per
    /// request.
    pub lost_flushes: u64,
    /// FLUSHes the engine sent on its own to keep the replay window from
    /// filling (`writeback.rs`): moves when one is sent.
    pub writeback_flushes: u64,
    /// Of those, the ones that failed (a restart's cancel is not one).
    pub writeback_failures: u64,
}
