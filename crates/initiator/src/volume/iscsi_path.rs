//! One path of an iSCSI volume: dialing a session and checking it leads
//! to the volume's unit, adopting it into the volume, what its replies
//! and unit attentions do, and the iSCSI side of its fence (ISIDs as
//! connection ids, keys, the fence's own reset). Opening the volume is
//! `open_iscsi.rs`; this module knows nothing of it, so that the tasks
//! that bring a path back use it without reaching into the open.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use braid_block::Error;
use braid_iscsi::initiator::login::Isid;
use braid_iscsi::initiator::sense::Attention;
use braid_iscsi::initiator::unit::{AccessState, Identity};
use braid_proto::braid_ns::ConnId;
use braid_proto::Cookie;
use bytes::Bytes;
use tracing::{info, warn};

use super::alua::{access, heard, watch};
use super::core::{finish, place, ConnSink, Shared};
use super::keys::Keys;
use super::link::Link;
use super::Transport;
use crate::conn::ConnectError;
use crate::discover::PathSpec;
use crate::engine::{Access, Instance, PathId};
use crate::iscsi::fence::Fence;
use crate::iscsi::{self, Opened, SessionConfig};

/// What every session of an iSCSI volume must agree on.
pub(crate) struct Expect {
    pub session: SessionConfig,
    pub identity: Option<Identity>,
    pub size: u64,
    pub block_size: u32,
    /// The portal the expectation came from, for messages.
    pub source: String,
    /// Each path's relative port and port group, for ALUA.
    pub ports: Mutex<Vec<(Option<u16>, Option<u16>)>>,
    /// Paths whose ALUA state is being watched.
    pub watching: Mutex<HashSet<usize>>,
    /// Each path's iSCSI portal group tag, from its last login: a session
    /// is reinstated only through a portal of its own group.
    pub tags: Mutex<Vec<Option<u16>>>,
    /// Failed paths are fenced by persistent reservation.
    pub reservations: bool,
    /// How failed paths are fenced (the reservation fence iff
    /// `reservations`).
    pub fence: Fence,
    /// Sessions owed the unit attention of a LOGICAL UNIT RESET this
    /// volume's own fence sent (tgt): the first reset each hears is that
    /// one, which lost nothing, not a restart.
    pub own_resets: Mutex<HashSet<Isid>>,
    /// The keys this volume's sessions registered and have not withdrawn
    /// or preempted: a path that failed without writes to fence leaves
    /// its key behind, and closing the volume preempts those.
    pub keys: Keys,
}

/// Opens a session on `spec` and checks it leads to the volume's unit.
///
/// # Errors
///
/// As [`iscsi::open::open`], or [`ConnectError::NotSameVolume`] with both
/// identities.
pub(super) async fn dial(
    x: &Expect,
    spec: &PathSpec,
    timeout: Duration,
) -> Result<Opened, ConnectError> {
    let o = iscsi::open::open(spec, &x.session, x.session.next_isid(), timeout).await?;
    let describe = |id: &Option<Identity>, size: Option<u64>| {
        let id = id
            .as_ref()
            .map_or("a unit without identity".to_owned(), |i| format!("LUN {i}"));
        match size {
            Some(s) => format!("{id} of {s} bytes"),
            None => id,
        }
    };
    let size = o.capacity.map(|c| c.bytes());
    let other_unit = x.identity.is_some() && o.identity != x.identity;
    let other_size = size.is_some_and(|s| s != x.size)
        || o.capacity.is_some_and(|c| c.block_size != x.block_size);
    if other_unit || other_size {
        o.conn.logout(Duration::from_secs(1)).await;
        return Err(ConnectError::NotSameVolume {
            portal: spec.portal.to_string(),
            found: describe(&o.identity, size),
            first: x.source.clone(),
            expected: describe(&x.identity, Some(x.size)),
        });
    }
    if x.reservations {
        // Registered before it carries a write, so that a fence can
        // preempt it.
        let key = iscsi::reserve::key(o.conn.logged_in.isid);
        if !x.keys.admit(key) {
            o.conn.logout(Duration::from_secs(1)).await;
            return Err(closed_while_dialing(spec));
        }
        let joined = iscsi::reserve::join(&o.conn, timeout).await;
        if x.keys.closed() {
            // The volume withdrew its keys while this one was being
            // registered: it may have landed after the sweep.
            if iscsi::reserve::leave(&o.conn, timeout).await.is_ok() {
                x.keys.forget([key]);
            }
            o.conn.logout(Duration::from_secs(1)).await;
            return Err(closed_while_dialing(spec));
        }
        if let Err(e) = joined {
            // The key stays recorded: the target may have registered it.
            o.conn.logout(Duration::from_secs(1)).await;
            return Err(ConnectError::Other(format!("{}: {e}", spec.portal)));
        }
    }
    Ok(o)
}

fn closed_while_dialing(spec: &PathSpec) -> ConnectError {
    ConnectError::Other(format!(
        "{}: the volume closed while the path was connecting",
        spec.portal
    ))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Keys of sessions a fence preempted are no longer the volume's.
pub(super) fn fenced(x: &Expect, conns: &[ConnId]) {
    x.keys
        .forget(conns.iter().map(|c| iscsi::reserve::key(isid_of(*c))));
}

/// As the volume closes: the first live session preempts the keys left
/// by failed sessions, then every live session withdraws its own, so the
/// reservation ends (bounded; with no live session the keys stay until an
/// administrator clears them).
pub(super) async fn leave_all(x: &Expect, conns: Vec<Arc<iscsi::Conn>>) {
    let t = Duration::from_secs(2);
    let live: Vec<u64> = conns
        .iter()
        .map(|c| iscsi::reserve::key(c.logged_in.isid))
        .collect();
    let mut stale = x.keys.close();
    stale.retain(|k| !live.contains(k));
    if let Some(first) = conns.first() {
        if let Err(e) = iscsi::reserve::preempt(first, &stale, t, t).await {
            warn!("preempting the keys of failed sessions failed: {e}");
        }
    } else if !stale.is_empty() {
        warn!(
            keys = stale.len(),
            "no live path to withdraw the volume's reservation keys: the unit stays reserved"
        );
    }
    for c in &conns {
        match iscsi::reserve::leave(c, t).await {
            Ok(()) => {
                x.keys.forget([iscsi::reserve::key(c.logged_in.isid)]);
            }
            Err(e) => warn!("withdrawing a path's reservation key failed: {e}"),
        }
    }
}

/// The engine's id of a session: its ISID, which is what fences it.
pub(super) fn conn_id(isid: Isid) -> ConnId {
    let mut b = [0u8; 16];
    b[10..].copy_from_slice(&isid.0);
    ConnId(u128::from_be_bytes(b))
}

/// The ISID a session's id names.
pub(super) fn isid_of(id: ConnId) -> Isid {
    let b = id.0.to_be_bytes();
    let mut isid = [0u8; 6];
    isid.copy_from_slice(&b[10..]);
    Isid(isid)
}

/// Hands a path's new session to the engine. A reset the session saw
/// (after the volume opened) means the target may have lost unflushed
/// writes: they are written again first.
pub(super) fn adopt(shared: &Arc<Shared>, path: PathId, o: Opened, opening: bool) {
    let Transport::Iscsi(x) = &shared.settings.transport else {
        unreachable!("iSCSI sessions only on iSCSI volumes")
    };
    let mut core = shared.lock();
    if shared.closed() {
        return;
    }
    let now = shared.now();
    // A session's first command is told of a power on the first time its
    // initiator port meets the target after a start: at open that says
    // only that the target tells of restarts; later, that it may have
    // restarted (the engine decides whether this is a restart it knows).
    let instance = match o.instance {
        // braid's target names its process: the engine compares names.
        Some(id) => Instance::Known(id),
        None if !o.reset_seen => Instance::Unknown,
        None if opening => {
            core.engine.restarts_told();
            Instance::Unknown
        }
        None => Instance::ResetSeen,
    };
    let generation = core.paths[path.0].generation + 1;
    let id = conn_id(o.conn.logged_in.isid);
    let conn = Arc::new(o.conn);
    conn.attach(Arc::new(ConnSink {
        shared: Arc::downgrade(shared),
        path,
        generation,
        allocation: None,
    }));
    if let Some(slot) = x
        .ports
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_mut(path.0)
    {
        *slot = (o.relative_port, o.port_group);
    }
    if let Some(slot) = lock(&x.tags).get_mut(path.0) {
        *slot = conn.logged_in.portal_group_tag;
    }
    let p = &mut core.paths[path.0];
    p.generation = generation;
    p.conns = vec![Some(Link::Iscsi(conn))];
    p.allocation = vec![None];
    core.engine
        .path_up_with(now, path, vec![Some(id)], shared.settings.fencing, instance);
    let state = access(o.access);
    core.engine.set_access(now, path, state);
    core.act(shared);
    drop(core);
    if state != Access::Optimized && state != Access::NonOptimized {
        watch(shared, path);
    }
}

/// Notes that every live session of the volume is owed the unit
/// attention of the LOGICAL UNIT RESET its fence is about to send.
pub(super) fn expect_own_reset(shared: &Arc<Shared>) {
    let Transport::Iscsi(x) = &shared.settings.transport else {
        return;
    };
    let core = shared.lock();
    let live = core
        .paths
        .iter()
        .flat_map(|p| &p.conns)
        .filter_map(|c| match c {
            Some(Link::Iscsi(c)) => Some(c.logged_in.isid),
            _ => None,
        });
    lock(&x.own_resets).extend(live);
}

/// Whether the reset `path`'s session heard is the one this volume's
/// fence sent (each session is owed one).
fn own_reset(shared: &Shared, core: &super::core::Core, path: PathId) -> bool {
    let Transport::Iscsi(x) = &shared.settings.transport else {
        return false;
    };
    let Some(Some(Link::Iscsi(c))) = core.paths[path.0].conns.first() else {
        return false;
    };
    let own = lock(&x.own_resets).remove(&c.logged_in.isid);
    if own {
        info!("the unit was reset by this volume's own fence (29h): nothing to replay");
    }
    own
}

impl iscsi::Replies for ConnSink {
    fn data(&self, cookie: Cookie, offset: u64, data: Bytes) {
        self.with_core(|_, core| place(core, cookie, Some(offset), data));
    }

    fn done(&self, cookie: Cookie, error: Option<Error>) {
        self.with_core(|shared, core| finish(shared, core, cookie, error));
    }

    fn elsewhere(&self, cookie: Cookie, state: AccessState) {
        let shared = self.with_core(|shared, core| {
            let now = shared.now();
            core.engine.set_access(now, self.path, access(state));
            core.engine.retry_elsewhere(now, cookie);
            core.act(shared);
            shared.clone()
        });
        if let Some(shared) = shared {
            watch(&shared, self.path);
        }
    }

    fn attention(&self, attention: Attention) {
        // From the path's current session only.
        let shared = self.with_core(|shared, core| {
            let own = attention == Attention::Reset && own_reset(shared, core, self.path);
            (!own).then(|| shared.clone())
        });
        if let Some(shared) = shared.flatten() {
            heard(&shared, self.path, attention);
        }
    }

    fn lost(&self, reason: String) {
        crate::conn::Sink::lost(self, reason);
    }
}
