//! The control socket's messages, typed: what `braid status`, `braid
//! policy` and `braid path` ask a running serve or attach, and what it
//! answers. The same types make `braid status --json`, so its shape is
//! this file; every struct refuses fields it does not know, and the tests
//! read real answers through them.
//!
//! This module has no dependencies but serde, so tests include it as a
//! file (`#[path]`) and check the JSON against the very same types.

use serde::{Deserialize, Serialize};

/// One request, one line of JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    Status,
    Policy {
        volume: String,
        policy: String,
    },
    /// Exactly one of `enable` and `set`.
    Path {
        volume: String,
        path: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        enable: Option<bool>,
        /// Knobs as `key=value`, as `--path` takes them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        set: Option<Vec<String>>,
    },
    /// Sets the ALUA access state of a serve's iSCSI portal (its target
    /// port group): `state` is one of active-optimized,
    /// active-non-optimized, standby, unavailable, transitioning.
    Alua {
        portal: String,
        state: String,
    },
    /// Clears an attached volume's loss of acknowledged writes, so that
    /// FLUSH and FUA writes succeed again.
    ClearLoss {
        volume: String,
    },
}

/// The answer to `policy` and `path`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ack {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A path's knobs after `set`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// What `clear-loss` cleared (none: there was no loss).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared: Option<LossStatus>,
}

impl Ack {
    pub fn ok() -> Self {
        Self {
            ok: true,
            ..Self::default()
        }
    }

    pub fn refused(error: impl Into<String>) -> Self {
        Self {
            ok: false,
            error: Some(error.into()),
            ..Self::default()
        }
    }
}

/// The answer to `status`: one process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Status {
    Attach {
        ok: bool,
        pid: u32,
        volumes: Vec<VolumeStatus>,
    },
    Serve {
        ok: bool,
        pid: u32,
        portals: Vec<String>,
        exports: Vec<ExportStatus>,
        connections: Vec<ConnStatus>,
        /// Each front end's own figures beside NBD's, under its own key.
        #[serde(flatten)]
        front_ends: FrontEndStatus,
    },
}

/// The front ends' own parts of a serve's status, each under its own key
/// of the serve's object, and absent when that front end is not served.
/// Flattened into the serve's object, so it cannot refuse unknown fields
/// itself; each part's own struct does.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FrontEndStatus {
    /// The iSCSI side, when served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iscsi: Option<IscsiStatus>,
}

/// A serve's iSCSI targets and portals.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiStatus {
    pub targets: Vec<String>,
    pub portals: Vec<IscsiPortalStatus>,
}

/// One iSCSI portal: its portal group (also its target port group and
/// relative target port) and ALUA access state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IscsiPortalStatus {
    pub portal: String,
    pub group: u16,
    pub state: String,
}

/// `braid status --json`: every process that answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Processes {
    pub processes: Vec<Status>,
}

/// One attached volume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeStatus {
    pub name: String,
    pub uri: String,
    pub socket: String,
    /// `x-braid:volume`; `None` from a plain NBD server.
    pub identity: Option<String>,
    pub size: u64,
    pub policy: String,
    /// The target fences failed paths' connections.
    pub fencing: bool,
    /// How: `x-braid:fence`, `reinstatement`, `reinstatement+lu-reset`
    /// (tgt), `persistent-reservation`, `held` (no fence known for the
    /// iSCSI target: a failed path's writes wait, then fail with EIO at
    /// the no-path timeout) or `none`.
    #[serde(default)]
    pub fence: String,
    /// The target says which process answers (or tells new sessions of a
    /// power on), so a restart is seen and the writes it may have lost are
    /// given back.
    pub replay: bool,
    /// Bytes acknowledged since the last FLUSH, kept for replay.
    pub replay_window_bytes: u64,
    /// Memory the window holds, and its bound (`--replay-window`).
    pub replay_window_pinned: u64,
    pub replay_window_limit: u64,
    /// More was acknowledged since the last FLUSH than the window holds: a
    /// restart now would be a loss.
    pub replay_overflowed: bool,
    /// Times a restarted target was given the window again.
    pub replays: u64,
    /// A replay is under way (new requests wait for it).
    pub replaying: bool,
    /// Acknowledged writes may have been lost: every FLUSH and FUA write
    /// fails until `braid clear-loss`.
    pub lost: Option<LossStatus>,
    /// FLUSHes and FUA writes failed because of a loss.
    pub lost_flushes: u64,
    /// FLUSHes braid sent on its own so that the window never fills for
    /// a client that does not flush (VMware), and of those, the failed.
    #[serde(default)]
    pub writeback_flushes: u64,
    #[serde(default)]
    pub writeback_failures: u64,
    pub paths: Vec<PathStatus>,
}

/// A loss of acknowledged writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossStatus {
    /// When it was found, seconds since the Unix epoch.
    pub since_unix: f64,
    pub cause: String,
}

/// One path of a volume: rates over the last second, latency of the
/// user's requests over the last 10 s and minute, counters since open.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathStatus {
    pub index: usize,
    pub local: String,
    pub portal: String,
    pub state: String,
    pub connections: usize,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub inflight_requests: u32,
    pub inflight_bytes: u64,
    /// The most requests the path may hold in flight (`queue-depth`; 0 is
    /// no limit), and the most it has held.
    pub queue_depth: u32,
    pub max_inflight: u32,
    pub latency_p50_us: u64,
    pub latency_p99_us: u64,
    pub latency_p999_us: u64,
    pub latency_1m_p50_us: u64,
    pub latency_1m_p99_us: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub reads: u64,
    pub writes: u64,
    pub others: u64,
    pub errors: u64,
    pub failures: u64,
    pub restores: u64,
    pub resent: u64,
    /// The path's knobs, `priority=0 weight=0 ...`.
    pub config: String,
}

/// One export of a serve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportStatus {
    pub name: String,
    pub description: String,
    pub size: u64,
    pub read_only: bool,
    pub identity: String,
    /// For an export that other servers serve too (a Ceph image's
    /// gateways): the other live ones, as this one sees them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peers: Option<Vec<PeerStatus>>,
}

/// Another live gateway of an export's image.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerStatus {
    /// Its RADOS client's address (what a fence blocklists).
    pub addr: String,
    pub host: String,
    pub pid: u32,
    /// Where clients reach it.
    pub portals: Vec<String>,
}

/// One client connection of a serve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnStatus {
    /// The connection's id (32 hex digits), as fences name it.
    pub id: String,
    pub peer: String,
    pub portal: String,
    /// `None` until the handshake has chosen one.
    pub export: Option<String>,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub reads: u64,
    pub writes: u64,
    pub others: u64,
    pub errors: u64,
    pub inflight: usize,
}
