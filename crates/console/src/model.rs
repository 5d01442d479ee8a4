//! What the console shows, typed: the daemon fills these from what it
//! already knows (its control socket's status, its metrics) and the page
//! reads the same JSON the push stream carries. Nothing here knows an
//! initiator or a target.

use serde::{Deserialize, Serialize};

/// One daemon's state at one moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Snapshot {
    Attach(AttachView),
    Serve(ServeView),
}

/// `braid attach`: its volumes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AttachView {
    pub pid: u32,
    pub volumes: Vec<VolumeView>,
    /// The policies a volume can be switched to.
    pub policies: Vec<String>,
}

/// One attached volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VolumeView {
    pub name: String,
    pub uri: String,
    /// The volume's identity; `None` from a plain NBD server.
    pub identity: Option<String>,
    pub size: u64,
    /// What the paths speak (`nbd`, `iscsi`).
    pub transport: String,
    pub policy: String,
    pub fencing: bool,
    pub replay: ReplayView,
    pub paths: Vec<PathView>,
    /// The volume's recent events, oldest first.
    pub events: Vec<EventView>,
}

/// The replay window: writes acknowledged since the last FLUSH, kept for a
/// restarted target.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplayView {
    pub available: bool,
    pub window_bytes: u64,
    pub overflowed: bool,
    pub replays: u64,
    pub lost_flushes: u64,
    /// A replay is under way: new requests wait for it.
    #[serde(default)]
    pub replaying: bool,
    /// Acknowledged writes may be gone (every FLUSH and FUA write fails):
    /// when it was found and why.
    #[serde(default)]
    pub lost: Option<String>,
}

/// One path of a volume, with rates over the last seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PathView {
    /// 1-based.
    pub index: usize,
    /// The local side (`10.0.1.2%eth1`, or `*`).
    pub local: String,
    /// The local NIC, when the path is bound to one.
    pub nic: Option<String>,
    pub portal: String,
    /// `active`, `failed`, `disabled`, ...
    pub state: String,
    /// The ALUA state of the portal's port, where the target has ALUA.
    pub access: Option<String>,
    pub connections: usize,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub latency_p50_us: u64,
    pub latency_p99_us: u64,
    pub inflight_requests: u32,
    pub inflight_bytes: u64,
    /// The path's part of the volume's bytes over the last seconds, 0 to 1.
    pub share: f64,
    pub read_bytes: u64,
    pub written_bytes: u64,
    pub errors: u64,
    pub failures: u64,
    pub restores: u64,
    /// The knobs (`priority=0 weight=0 ...`).
    pub config: String,
    /// The most requests the path may hold, when limited.
    pub depth_limit: Option<u32>,
}

/// One event of a timeline.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventView {
    /// The volume (attach) or export (serve) it is about; empty for the
    /// daemon as a whole.
    pub scope: String,
    /// Grows by one per event of its scope.
    pub seq: u64,
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// `path-failed`, `fenced`, ...: the page styles each kind from one
    /// table, and shows a kind it does not know plainly.
    pub kind: String,
    /// 1-based path number, where the event is about one.
    pub path: Option<usize>,
    pub text: String,
    /// What the event measured (a failover's or a failback's time).
    pub took_ms: Option<u64>,
}

/// `braid serve`: portals, exports, clients.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServeView {
    pub pid: u32,
    pub portals: Vec<PortalView>,
    pub exports: Vec<ExportView>,
    pub connections: Vec<ConnView>,
    /// A Ceph gateway's lease on its record, in seconds.
    pub gateway_lease_s: Option<f64>,
    /// Recent events (connections, fences, ALUA changes), oldest first.
    pub events: Vec<EventView>,
    /// The ALUA states a portal can be set to.
    pub alua_states: Vec<String>,
}

/// One portal: where clients connect.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PortalView {
    pub address: String,
    /// `nbd` or `iscsi`.
    pub protocol: String,
    /// The NIC it is bound to, when bound.
    pub nic: Option<String>,
    /// iSCSI: the portal's target port group.
    pub group: Option<u16>,
    /// iSCSI: the ALUA access state of its port group.
    pub alua: Option<String>,
    pub connections: usize,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
}

/// One export.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExportView {
    pub name: String,
    pub identity: String,
    /// What serves it (a file, a device, memory, an RBD image).
    pub backend: String,
    pub size: u64,
    pub read_only: bool,
    /// Connections an initiator's fence closed.
    pub fences: u64,
    /// A Ceph gateway's live peers (their portals); `None` where the
    /// export has no peers.
    pub peers: Option<Vec<String>>,
}

/// One client connection.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnView {
    pub id: String,
    pub peer: String,
    pub portal: String,
    pub export: Option<String>,
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub inflight: usize,
    pub errors: u64,
}

/// An operator's action, as the page posts it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Action {
    /// Switch a volume's policy.
    Policy { volume: String, policy: String },
    /// Drain (`enable: false`) or enable a path.
    Path {
        volume: String,
        path: usize,
        enable: bool,
    },
    /// Set the ALUA state of an iSCSI portal.
    Alua { portal: String, state: String },
}

/// `braid doctor`'s report, as its `--json` has it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DoctorReport {
    pub findings: Vec<DoctorFinding>,
}

/// One finding of `braid doctor`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DoctorFinding {
    pub check: String,
    /// `ok`, `warn` or `fail`.
    pub severity: String,
    pub subject: String,
    pub evidence: Vec<DoctorEvidence>,
    pub why: String,
    pub fix: Option<String>,
}

/// What a check read, and where.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DoctorEvidence {
    pub source: String,
    pub value: String,
}
