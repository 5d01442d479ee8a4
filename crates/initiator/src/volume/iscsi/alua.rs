//! ALUA on an iSCSI volume: each path's port state, read with REPORT
//! TARGET PORT GROUPS when a session opens, when a unit attention says a
//! state changed, and every half second while a port is not active (its
//! session carries no I/O, so it would hear of the change only through
//! another path), handed to the engine as a policy input.

use std::sync::{Arc, Weak};
use std::time::Duration;

use braid_iscsi::initiator::sense::Attention;
use tracing::{info, Instrument};

use super::{lock, session, Expect};
use crate::engine::{Access, PathId};
use crate::iscsi::{self, access, signal_of};
use crate::volume::core::{self, Shared};
use crate::volume::EventKind;

/// How often a path whose port is not active asks for its state again.
const ALUA_POLL: Duration = Duration::from_millis(500);

/// Watches `path`'s port until it is active again, one watcher per path.
pub(super) fn watch(shared: &Arc<Shared>, x: &Arc<Expect>, path: PathId) {
    if !lock(&x.watching).insert(path.0) {
        return;
    }
    let span = shared.lock().paths[path.0].span.clone();
    let weak = Arc::downgrade(shared);
    tokio::spawn(alua_poll(weak, x.clone(), path, false).instrument(span));
}

/// Asks every path's port for its state once (the target announced a
/// change).
pub(super) fn refresh_all(shared: &Arc<Shared>, x: &Arc<Expect>) {
    let n = shared.lock().paths.len();
    for i in 0..n {
        let span = shared.lock().paths[i].span.clone();
        let poll = alua_poll(Arc::downgrade(shared), x.clone(), PathId(i), true);
        tokio::spawn(poll.instrument(span));
    }
}

/// Asks `path`'s port for its state: once, or (a watcher) every
/// [`ALUA_POLL`] until the port is active again or the path's session
/// is gone.
async fn alua_poll(weak: Weak<Shared>, x: Arc<Expect>, path: PathId, once: bool) {
    loop {
        if !once {
            tokio::time::sleep(ALUA_POLL).await;
        }
        let Some(shared) = weak.upgrade() else { return };
        let conn = match shared.lock().paths[path.0].conns.first() {
            Some(Some(l)) => session(l.as_ref()).cloned(),
            _ => None,
        };
        let (port, group) = lock(&x.ports)[path.0];
        let state = match &conn {
            Some(c) if !shared.closed() => {
                let timeout = shared.settings.connect_timeout;
                match iscsi::open::port_state(c, c.lun(), port, group, timeout).await {
                    Ok(p) => {
                        for a in p.attentions {
                            // This poll reads the state itself.
                            if let Some(s) = signal_of(a).filter(|_| a != Attention::AccessChanged)
                            {
                                core::signal(&shared, path, s);
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
                watch(&shared, &x, path);
            }
            return;
        }
        if active || conn.is_none() || shared.closed() {
            lock(&x.watching).remove(&path.0);
            return;
        }
    }
}
