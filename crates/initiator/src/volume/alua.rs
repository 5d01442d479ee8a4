//! ALUA on an iSCSI volume: each path's port state, read with REPORT
//! TARGET PORT GROUPS when a session opens, when a unit attention says a
//! state changed, and every half second while a port is not active (its
//! session carries no I/O, so it would hear of the change only through
//! another path), handed to the engine as a policy input.

use std::sync::{Arc, Weak};
use std::time::Duration;

use braid_iscsi::initiator::sense::Attention;
use braid_iscsi::initiator::unit::AccessState;
use tracing::{info, warn, Instrument};

use super::core::Shared;
use super::link::Link;
use super::{EventKind, Transport};
use crate::engine::{Access, PathId};
use crate::iscsi;

/// How often a path whose port is not active asks for its state again.
const ALUA_POLL: Duration = Duration::from_millis(500);

/// The engine's view of a port's ALUA state.
pub(super) fn access(state: AccessState) -> Access {
    match state {
        AccessState::ActiveOptimized => Access::Optimized,
        AccessState::ActiveNonOptimized => Access::NonOptimized,
        AccessState::Standby => Access::Standby,
        AccessState::Transitioning => Access::Transitioning,
        AccessState::Unavailable | AccessState::Other(_) => Access::Unavailable,
    }
}

/// Watches `path`'s port until it is active again, one watcher per path.
pub(super) fn watch(shared: &Arc<Shared>, path: PathId) {
    let Transport::Iscsi(x) = &shared.settings.transport else {
        return;
    };
    if !x
        .watching
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(path.0)
    {
        return;
    }
    let span = shared.lock().paths[path.0].span.clone();
    let weak = Arc::downgrade(shared);
    tokio::spawn(alua_poll(weak, path, false).instrument(span));
}

/// Asks every path's port for its state once (the target announced a
/// change).
fn refresh_all(shared: &Arc<Shared>) {
    let n = shared.lock().paths.len();
    for i in 0..n {
        let span = shared.lock().paths[i].span.clone();
        tokio::spawn(alua_poll(Arc::downgrade(shared), PathId(i), true).instrument(span));
    }
}

/// Asks `path`'s port for its state: once, or (a watcher) every
/// [`ALUA_POLL`] until the port is active again or the path's session
/// is gone.
async fn alua_poll(weak: Weak<Shared>, path: PathId, once: bool) {
    loop {
        if !once {
            tokio::time::sleep(ALUA_POLL).await;
        }
        let Some(shared) = weak.upgrade() else { return };
        let Transport::Iscsi(x) = &shared.settings.transport else {
            return;
        };
        let conn = match shared.lock().paths[path.0].conns.first() {
            Some(Some(Link::Iscsi(c))) => Some(c.clone()),
            _ => None,
        };
        let (port, group) = x.ports.lock().unwrap_or_else(|p| p.into_inner())[path.0];
        let state = match &conn {
            Some(c) if !shared.closed() => {
                let timeout = shared.settings.connect_timeout;
                match iscsi::open::port_state(c, c.lun(), port, group, timeout).await {
                    Ok(p) => {
                        for a in p.attentions {
                            // This poll reads the state itself.
                            if a != Attention::AccessChanged {
                                heard(&shared, path, a);
                            }
                        }
                        p.access
                    }
                    Err(_) => None,
                }
            }
            _ => None,
        };
        let a = state.map(access);
        if let (Some(s), Some(a)) = (state, a) {
            let mut core = shared.lock();
            let now = shared.now();
            if core.engine.path_report(path, now).access != a {
                info!(state = s.name(), "ALUA state of the path's port changed");
                let text = format!("ALUA state of the path's port: {}", s.name());
                core.timeline
                    .record(EventKind::AccessChanged, Some(path.0 + 1), text, None);
            }
            core.engine.set_access(now, path, a);
            core.act(&shared);
        }
        let active = matches!(a, Some(Access::Optimized | Access::NonOptimized));
        if once {
            // A port found inactive is watched until it is back: its
            // session carries no I/O, so it would hear of the change
            // only from another path's session.
            if a.is_some() && !active {
                watch(&shared, path);
            }
            return;
        }
        if active || conn.is_none() || shared.closed() {
            x.watching
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&path.0);
            return;
        }
    }
}

/// What a unit attention on any session of the volume means for it.
pub(super) fn heard(shared: &Arc<Shared>, path: PathId, attention: Attention) {
    match attention {
        Attention::Reset => {
            let mut core = shared.lock();
            if shared.closed() {
                return;
            }
            let how = "a live session was told of a power on or reset (29h)";
            core.engine.restart_signalled(shared.now(), path, how);
            core.act(shared);
        }
        Attention::LuReset => {
            // Another initiator's reset (29/03) aborts tasks but loses no
            // acknowledged write: nothing to replay.
        }
        Attention::AccessChanged => refresh_all(shared),
        Attention::NexusLoss => {}
        other => warn!(?other, "unit attention"),
    }
}
