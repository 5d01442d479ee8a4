//! [`Volume`]: one NBD export reached over every path at once.
//!
//! Opening a volume asks the first portal what the volume is and where else
//! it is served, pairs local bindings with portals, and connects every
//! path with the identity checked on each connection. From then on each
//! call is submitted to the engine, whose actions the driver carries out;
//! failed paths are fenced and reconnected in the background.
//!
//! The modules, each using only those before it: `link` (a connection,
//! whatever it speaks), `timeline`, `report` (leaves); `core` (the engine
//! and the one place its actions are carried out; it starts the recovery
//! tasks through `core::Tasks`, not by name); `transport` (what a
//! protocol does for the volume: the [`transport::Transport`] trait);
//! `recover` (reconnecting and fencing, through the trait); `open`
//! (turning a plan into a running volume, which hands `recover`'s tasks to
//! the core); then each protocol, which knows the others not: `nbd` and
//! `iscsi`. Nothing before them names a protocol. `tests/module_graph.rs`
//! keeps it so.

mod admin;
mod core;
mod events;
mod iscsi;
mod link;
mod nbd;
mod open;
mod plan;
mod recover;
mod report;
#[cfg(test)]
mod tests;
mod timeline;
mod transport;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use braid_block::Extent;
use braid_block::{ErrorKind, Flags};
use braid_policy::PolicyOptions;
use braid_proto::TransmissionFlags;
use bytes::Bytes;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::conn::ConnectError;
use crate::discover::LocalSpec;
use crate::engine::{EngineConfig, IoError, Op, PathId};
use crate::pathrule::PathRule;
use crate::uri::VolumeUri;

pub use self::admin::PolicyError;
use self::core::Shared;
pub use self::core::{Done, Finish};
pub use self::plan::{plan, Plan};
pub use self::report::{Loss, PathFigures, ReplayReport, VolumeReport};
pub use self::timeline::{EventKind, Timeline, TimelineEvent};

/// How to open a volume.
#[derive(Clone, Debug)]
pub struct VolumeConfig {
    pub uri: VolumeUri,
    /// Portals to use instead of those the target advertises (needed for
    /// plain NBD servers, which advertise none).
    pub portals: Vec<SocketAddr>,
    /// Local addresses or interfaces to send from, one path each (paired
    /// with portals).
    pub locals: Vec<LocalSpec>,
    /// Paths named with their knobs (`--path PORTAL@LOCAL,weight=3`): their
    /// portals and local sides join the two lists above, and each path
    /// takes the knobs of every rule that matches it.
    pub paths: Vec<PathRule>,
    /// Connections per path; default 1.
    pub connections_per_path: Option<usize>,
    /// Policy name; `None` is `adaptive` (or `failover` where the target
    /// does not allow spreading).
    pub policy: Option<String>,
    pub policy_options: PolicyOptions,
    /// Bounds on each path's no-reply timeout.
    pub timeout_floor: Duration,
    pub timeout_ceiling: Duration,
    /// How long I/O waits when no path works; `None` waits forever.
    pub no_path_timeout: Option<Duration>,
    /// How long a busy path whose connection still answers may go without
    /// a reply before it is failed: four times the slowest reply it has
    /// given, within these bounds (a FLUSH over a large dirty cache can
    /// take minutes; a higher bound waits longer on a target that hangs).
    pub slow_reply_min: Duration,
    pub slow_reply_max: Duration,
    pub connect_timeout: Duration,
    /// Chunk size for splitting large requests (policies other than
    /// `adaptive`, which sizes chunks itself).
    pub chunk: Option<u64>,
    /// Re-send a failed path's writes without asking the target to fence
    /// its connections first. Unsafe: a write still queued on the target
    /// can land after its re-sent copy and a newer write. For tests that
    /// show why fencing exists.
    pub danger_no_fence: bool,
    /// TLS for every connection (required by `nbds://` URIs).
    pub tls: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
    /// Memory the replay window may hold: writes acknowledged since the
    /// last FLUSH, kept to give a restarted target again (see the engine's
    /// `window.rs`).
    pub replay_window: u64,
    /// iSCSI: the initiator name to log in as (default: this host's
    /// open-iscsi name, or one made of its host name).
    pub initiator_name: Option<String>,
    /// iSCSI: CHAP credentials, and the target's for mutual CHAP.
    pub chap: Option<braid_iscsi::chap::Credentials>,
    /// iSCSI: fence failed paths by persistent reservation (see
    /// [`crate::iscsi::reserve`]) instead of the fence known for the
    /// target, if any (see [`crate::iscsi::fence`]).
    pub persistent_reservations: bool,
}

impl VolumeConfig {
    pub fn new(uri: impl Into<VolumeUri>) -> Self {
        let engine = EngineConfig::default();
        Self {
            uri: uri.into(),
            portals: Vec::new(),
            locals: Vec::new(),
            paths: Vec::new(),
            connections_per_path: None,
            policy: None,
            policy_options: PolicyOptions::default(),
            timeout_floor: engine.timeout_floor,
            timeout_ceiling: engine.timeout_ceiling,
            no_path_timeout: engine.no_path_timeout,
            slow_reply_min: engine.slow_reply_min,
            slow_reply_max: engine.slow_reply_max,
            connect_timeout: Duration::from_secs(5),
            chunk: None,
            danger_no_fence: false,
            tls: None,
            replay_window: engine.replay_window,
            initiator_name: None,
            chap: None,
            persistent_reservations: false,
        }
    }
}

/// Why a volume could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The request itself is wrong (policy, bindings, portals).
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("no path to the volume could be opened:\n  {}", .0.join("\n  "))]
    NoPath(Vec<String>),
}

/// What is known about an open volume.
#[derive(Clone, Debug)]
pub struct VolumeInfo {
    pub export: String,
    pub size: u64,
    pub flags: TransmissionFlags,
    pub min_block: u32,
    pub preferred_block: u32,
    pub max_payload: u32,
    /// `x-braid:volume`, if the target is braid.
    pub identity: Option<String>,
    /// Path names, `local → portal`, in path order.
    pub paths: Vec<String>,
    pub connections_per_path: usize,
    /// The target fences failed connections.
    pub fencing: bool,
    /// How a failed path's writes are kept from landing after their
    /// re-sent copies: `x-braid:fence` (braid serve over NBD), `none` (a
    /// plain NBD server, or `--danger-no-fence`), or over iSCSI
    /// `reinstatement`, `reinstatement+lu-reset` (tgt),
    /// `persistent-reservation`, `held` (no fence known for the target:
    /// the writes wait, then fail with EIO at the no-path timeout).
    pub fence: &'static str,
    /// The target answers BLOCK_STATUS for `base:allocation`.
    pub block_status: bool,
    /// What the paths speak: `nbd` or `iscsi`.
    pub transport: &'static str,
}

/// One request to the volume, as its caller gives it.
#[derive(Debug)]
pub struct Request {
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    pub flags: Flags,
    /// A WRITE's data (`len` bytes).
    pub write: Option<Bytes>,
}

impl Request {
    /// `op` on `len` bytes at `offset`, with no flags or data.
    pub fn new(op: Op, offset: u64, len: u64) -> Self {
        Self {
            op,
            offset,
            len,
            flags: Flags::empty(),
            write: None,
        }
    }

    /// A WRITE of `data` at `offset`.
    pub fn write(offset: u64, data: Bytes, flags: Flags) -> Self {
        Self {
            op: Op::Write,
            offset,
            len: data.len() as u64,
            flags,
            write: Some(data),
        }
    }
}

/// Settings every background task needs.
pub(crate) struct Settings {
    pub connect_timeout: Duration,
    /// The target fences failed connections (where it names them).
    pub fencing: bool,
    /// What the paths speak, and what their connections agree on.
    pub transport: Box<dyn transport::Transport>,
}

/// How often the engine's clock advances (timeouts, probes, deadlines).
const TICK: Duration = Duration::from_millis(25);

/// A multipath volume.
pub struct Volume {
    shared: Arc<Shared>,
    info: VolumeInfo,
    ticker: Mutex<Option<JoinHandle<()>>>,
}

impl Volume {
    /// Discovers the volume and connects every path.
    ///
    /// # Errors
    ///
    /// See [`OpenError`]: the messages say what to change.
    pub async fn open(cfg: VolumeConfig) -> Result<Self, OpenError> {
        // Every line the volume logs, from any task, is in this span (and
        // a path's in its own inside it), so several volumes in one
        // process can be told apart.
        let span = tracing::info_span!("volume", export = ?cfg.uri.name());
        let run = async {
            // The one place a protocol is chosen: by the URI.
            match cfg.uri.clone() {
                VolumeUri::Nbd(u) => nbd::open(cfg, u, span.clone()).await,
                VolumeUri::Iscsi(u) => iscsi::open(cfg, u, span.clone()).await,
            }
        };
        run.instrument(span.clone()).await
    }

    pub fn info(&self) -> &VolumeInfo {
        &self.info
    }

    /// Submits any request and waits for it; the building block of the
    /// calls below.
    ///
    /// # Errors
    ///
    /// The target's error, or EIO when no path was available in time;
    /// EINVAL for a write that is not whole blocks of the target's
    /// minimum block size (a read that is not is widened to whole blocks
    /// and cut back).
    pub async fn submit(&self, req: Request) -> Result<Done, IoError> {
        let (finish, rx) = Finish::channel();
        self.start(req, finish);
        rx.await.unwrap_or_else(|_| Err(core::closed()))
    }

    /// Submits any request; `finish` is told its result (as
    /// [`Self::submit`] returns it) from the task that completes it. What
    /// a local NBD front end forwards requests through: its reply goes
    /// out from the path's reader, with no task waiting per request.
    pub fn start(&self, req: Request, finish: Finish) {
        let (op, offset, len) = (req.op, req.offset, req.len);
        let offered = match op {
            Op::BlockStatus => self.info.block_status,
            Op::Trim => self.info.flags.has(TransmissionFlags::SEND_TRIM),
            Op::WriteZeroes => self.info.flags.has(TransmissionFlags::SEND_WRITE_ZEROES),
            Op::Cache => self.info.flags.has(TransmissionFlags::SEND_CACHE),
            Op::Read | Op::Write | Op::Flush => true,
        };
        if !offered {
            return finish.call(Err(IoError::Target {
                kind: ErrorKind::NotSupported,
                message: format!("the target does not offer {op:?}"),
            }));
        }
        let block = u64::from(self.info.min_block.max(1));
        if block > 1 && !(offset.is_multiple_of(block) && len.is_multiple_of(block)) {
            match op {
                Op::Read => return self.read_widened(offset, len, block, finish),
                Op::Write | Op::WriteZeroes | Op::Trim => {
                    return finish.call(Err(IoError::Target {
                        kind: ErrorKind::Invalid,
                        message: format!(
                            "{len} bytes at {offset} are not whole {block}-byte blocks, the \
                             smallest the target writes"
                        ),
                    }))
                }
                _ => {}
            }
        }
        core::start(&self.shared, req, finish);
    }

    /// A read widened to whole blocks, cut back to what was asked.
    fn read_widened(&self, offset: u64, len: u64, block: u64, finish: Finish) {
        let start = offset / block * block;
        let end = (offset + len).div_ceil(block) * block;
        let (from, to) = (offset - start, offset - start + len);
        let cut = Finish::new(move |result: Result<Done, IoError>| {
            finish.call(result.map(|done| {
                let data = done
                    .data
                    .into_iter()
                    .filter_map(|(at, b)| {
                        let end = at + b.len() as u64;
                        let (lo, hi) = (at.max(from), end.min(to));
                        (lo < hi)
                            .then(|| (lo - from, b.slice((lo - at) as usize..(hi - at) as usize)))
                    })
                    .collect();
                // Never piped: this caller took no pipe (`Finish::new`).
                Done {
                    data,
                    extents: done.extents,
                    piped: Vec::new(),
                }
            }));
        });
        core::start(
            &self.shared,
            Request::new(Op::Read, start, end - start),
            cut,
        );
    }

    /// Reads `len` bytes at `offset`; the pieces come back in order.
    ///
    /// # Errors
    ///
    /// As [`Self::submit`].
    pub async fn read(&self, offset: u64, len: u64) -> Result<Vec<(u64, Bytes)>, IoError> {
        Ok(self.submit(Request::new(Op::Read, offset, len)).await?.data)
    }

    /// Writes `data` at `offset`; with `fua`, stable before it returns.
    ///
    /// # Errors
    ///
    /// As [`Self::submit`].
    pub async fn write(&self, offset: u64, data: Bytes, fua: bool) -> Result<(), IoError> {
        let flags = if fua { Flags::FUA } else { Flags::empty() };
        self.submit(Request::write(offset, data, flags))
            .await
            .map(drop)
    }

    /// Makes every write acknowledged so far stable.
    ///
    /// # Errors
    ///
    /// As [`Self::submit`].
    pub async fn flush(&self) -> Result<(), IoError> {
        self.submit(Request::new(Op::Flush, 0, 0)).await.map(drop)
    }

    /// Zeroes a range (`trim` lets the target punch a hole instead).
    ///
    /// # Errors
    ///
    /// As [`Self::submit`]; ENOTSUP when the target cannot write zeroes.
    pub async fn write_zeroes(&self, offset: u64, len: u64, trim: bool) -> Result<(), IoError> {
        let flags = if trim { Flags::empty() } else { Flags::NO_HOLE };
        self.submit(Request {
            flags,
            ..Request::new(Op::WriteZeroes, offset, len)
        })
        .await
        .map(drop)
    }

    /// Allocation of a range (`base:allocation`), from `offset` on.
    ///
    /// # Errors
    ///
    /// As [`Self::submit`].
    pub async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, IoError> {
        let done = self
            .submit(Request::new(Op::BlockStatus, offset, len))
            .await?;
        Ok(done.extents)
    }

    /// Whether a FLUSH now would make durable anything that is not
    /// already, or has a loss to report (see the engine's `unflushed`).
    pub fn unflushed(&self) -> bool {
        self.shared.lock().engine.unflushed()
    }

    /// Every path's figures now.
    pub fn report(&self) -> VolumeReport {
        let core = self.shared.lock();
        let now = self.shared.now();
        let paths = (0..core.engine.path_count())
            .map(|i| {
                let spec = &core.paths[i].spec;
                PathFigures {
                    index: i + 1,
                    local: spec.local.to_string(),
                    portal: spec.portal.to_string(),
                    figures: core.engine.path_report(PathId(i), now),
                }
            })
            .collect();
        VolumeReport {
            policy: core.engine.policy_name().to_owned(),
            paths,
            counters: core.engine.volume_counters().clone(),
            replay: self.replay_report(&core),
            uptime: now,
        }
    }

    fn replay_report(&self, core: &self::core::Core) -> ReplayReport {
        let r = core.engine.replay_report();
        ReplayReport {
            available: r.available,
            window_bytes: r.window_bytes,
            window_pinned: r.window_pinned,
            window_limit: r.window_limit,
            overflowed: r.overflowed,
            replays: r.restarts,
            replaying: r.replaying,
            last_replay: r.last_replay,
            lost: r.lost.map(|(at, cause)| self.loss(at, cause)),
            lost_flushes: r.lost_flushes,
        }
    }

    fn loss(&self, at: Duration, cause: String) -> Loss {
        let ago = self.shared.now().saturating_sub(at);
        Loss {
            since: std::time::SystemTime::now() - ago,
            cause,
        }
    }

    /// Clears a loss of acknowledged writes (the operator has dealt with
    /// it: restored from a backup, checked the file system): FLUSH and FUA
    /// writes succeed again. Returns the loss cleared, if there was one.
    pub fn clear_loss(&self) -> Option<Loss> {
        let mut core = self.shared.lock();
        let cleared = core.engine.clear_loss();
        drop(core);
        let loss = cleared.map(|(at, cause)| self.loss(at, cause));
        if let Some(l) = &loss {
            let line = format!(
                "loss of acknowledged writes cleared by the operator ({})",
                l.cause
            );
            tracing::warn!("{line}");
            self.shared
                .lock()
                .timeline
                .record(timeline::EventKind::LossCleared, None, line, None);
        }
        loss
    }

    /// The volume's recent events, and a way to hear of each new one.
    pub fn timeline(&self) -> Timeline {
        self.shared.lock().timeline.clone()
    }

    /// Disconnects every connection cleanly (NBD_CMD_DISC), bounded in time.
    pub async fn close(&self) {
        self.shared
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.ticker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
        let handles: Vec<_> = {
            let mut core = self.shared.lock();
            core.paths
                .iter_mut()
                .flat_map(|p| {
                    p.generation += 1;
                    p.conns.drain(..).flatten().collect::<Vec<_>>()
                })
                .collect()
        };
        self.shared.settings.transport.leave(&handles).await;
        futures_join(handles.into_iter().map(|h| h.close(Duration::from_secs(2)))).await;
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        self.shared
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        if let Some(t) = self.ticker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
        let mut core = self.shared.lock();
        for p in core.paths.iter_mut() {
            p.generation += 1;
            p.conns.clear();
        }
    }
}

async fn tick(shared: std::sync::Weak<Shared>) {
    let mut interval = tokio::time::interval(TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks = 0u64;
    loop {
        interval.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut core = shared.lock();
        let now = shared.now();
        for i in 0..core.paths.len() {
            let wires: Vec<_> = core.paths[i]
                .conns
                .iter()
                .flatten()
                .filter_map(|c| c.wire())
                .collect();
            if !wires.is_empty() {
                let bytes = wires.iter().map(|w| w.bytes).sum();
                let min_rtt = wires.iter().filter_map(|w| w.min_rtt).min();
                let health = crate::engine::KernelHealth {
                    stalled: wires.iter().any(|w| w.stalled),
                    window_closed: wires.iter().any(|w| w.window_closed),
                    last_ack: wires.iter().map(|w| w.last_ack).min().unwrap_or_default(),
                };
                core.engine.wire(now, PathId(i), bytes, min_rtt, health);
            }
        }
        core.engine.tick(now);
        core.act(&shared);
        ticks += 1;
        // What the policy sees, twice a second, for -vv (trace).
        if ticks.is_multiple_of(20) && tracing::enabled!(tracing::Level::TRACE) {
            for i in 0..core.engine.path_count() {
                let r = core.engine.path_report(PathId(i), now);
                tracing::trace!(
                    path = i + 1,
                    inflight_bytes = r.inflight_bytes,
                    inflight = r.inflight_requests,
                    mb_per_s = r.throughput / 1e6,
                    latency_us = r.base_latency.as_micros() as u64,
                    state = r.state.name(),
                    "figures"
                );
            }
        }
    }
}

/// Runs futures concurrently and collects their results in order.
async fn futures_join<F, T>(futs: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<JoinHandle<T>> = futs.map(|f| tokio::spawn(f.in_current_span())).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        match h.await {
            Ok(v) => out.push(v),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    out
}
