//! One path of an iSCSI volume: dialing a session and checking it leads
//! to the volume's unit, adopting it into the volume, and the session's
//! ISID as the connection id a fence names, with its reservation key.
//! Opening the volume is `open.rs`; this module knows nothing of it, so
//! that the tasks that bring a path back use it without reaching into
//! the open.

use std::sync::Arc;
use std::time::Duration;

use braid_iscsi::initiator::login::Isid;
use braid_iscsi::initiator::unit::Identity;
use braid_proto::braid_ns::ConnId;
use tracing::warn;

use super::alua::watch;
use super::{lock, Expect};
use crate::conn::ConnectError;
use crate::discover::{self, PathSpec};
use crate::engine::{Access, Instance, PathId};
use crate::iscsi::{self, access, Opened};
use crate::volume::core::Shared;
use crate::volume::transport::{bring_up, Dialed, Up};

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
    // As NBD's paths: with the unit's identity matched, a grown unit
    // serves the volume at the size it was opened at; a shrunk one never.
    let identified = x.identity.as_ref().map(|i| format!("LUN {i}"));
    let size_fits = match size {
        Some(s) if !other_unit => discover::size_fits(&spec.portal, x.size, s, identified),
        _ => Ok(()),
    };
    let other_block = o.capacity.is_some_and(|c| c.block_size != x.block_size);
    if other_unit || other_block || size_fits.is_err() {
        o.conn.logout(Duration::from_secs(1)).await;
        return Err(match size_fits {
            Err(Some(shrank)) if !other_block => shrank,
            _ => ConnectError::NotSameVolume {
                portal: spec.portal.to_string(),
                found: describe(&o.identity, size),
                first: x.source.clone(),
                expected: describe(&x.identity, Some(x.size)),
            },
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

/// A path's session, logged in and checked.
pub(super) struct Session {
    pub x: Arc<Expect>,
    pub opened: Opened,
}

impl Dialed for Session {
    /// Hands the session to the engine. A reset the session saw (after
    /// the volume opened) means the target may have lost unflushed
    /// writes: they are written again first.
    fn adopt(self: Box<Self>, shared: &Arc<Shared>, path: PathId, opening: bool) {
        let Session { x, opened: o } = *self;
        // A session's first command is told of a power on the first time
        // its initiator port meets the target after a start: at open that
        // says only that the target tells of restarts; later, that it may
        // have restarted (the engine decides whether this is a restart it
        // knows).
        let instance = match o.instance {
            // braid's target names its process: the engine compares names.
            Some(id) => Instance::Known(id),
            None if !o.reset_seen => Instance::Unknown,
            None => Instance::ResetSeen,
        };
        let state = access(o.access);
        let conn = Arc::new(o.conn);
        let up = bring_up(shared, path, opening, |sink| {
            conn.attach(sink());
            if let Some(slot) = lock(&x.ports).get_mut(path.0) {
                *slot = (o.relative_port, o.port_group);
            }
            if let Some(slot) = lock(&x.tags).get_mut(path.0) {
                *slot = conn.logged_in.portal_group_tag;
            }
            Up {
                ids: vec![Some(conn_id(conn.logged_in.isid))],
                links: vec![Box::new(conn.clone())],
                allocation: vec![None],
                instance,
                access: Some(state),
            }
        });
        if up && state != Access::Optimized && state != Access::NonOptimized {
            watch(shared, &x, path);
        }
    }
}
