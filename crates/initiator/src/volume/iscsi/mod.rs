//! iSCSI paths: every path is an iSCSI session checked to lead to the
//! same unit (VPD 0x83 identity, and size as NBD's paths check it). How a
//! failed path is fenced depends on the unit (see `crate::iscsi::fence`):
//! by logging in with its
//! session's ISID (with tgt, then LOGICAL UNIT RESET, whose unit attention
//! the volume's own sessions take as the fence's), or
//! (`--persistent-reservations`) by preempting its key, or not at all (its
//! writes are held). A unit attention for a reset stands in for NBD's
//! instance and triggers the replay; ALUA states (`alua.rs`) feed the
//! engine.
//!
//! The modules: `keys` and `alua` (leaves); `path` (one session: dial,
//! adopt, its ISID as a connection id); `fence` (one fence attempt);
//! `open` (opening the volume). This one is the [`Transport`] they make.

mod alua;
mod fence;
mod keys;
mod open;
mod path;

use std::any::Any;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use braid_iscsi::initiator::unit::Identity;
use braid_proto::braid_ns::ConnId;
use bytes::Bytes;

use self::keys::Keys;
use super::core::Shared;
use super::link::{BoxFuture, Link};
use super::transport::{Dialed, Transport, Unproven};
use crate::conn::{ConnectError, Wire};
use crate::discover::PathSpec;
use crate::engine::{PathId, SendChunk};
use crate::iscsi::fence::Fence;
use crate::iscsi::{Conn, SessionConfig};

pub(super) use open::open;

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
    /// The keys this volume's sessions registered and have not withdrawn
    /// or preempted: a path that failed without writes to fence leaves
    /// its key behind, and closing the volume preempts those.
    pub keys: Keys,
}

/// An iSCSI volume's transport.
struct Iscsi(Arc<Expect>);

impl Transport for Iscsi {
    fn dial<'a>(
        &'a self,
        spec: &'a PathSpec,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Box<dyn Dialed>, ConnectError>> {
        Box::pin(async move {
            let opened = path::dial(&self.0, spec, timeout).await?;
            let x = self.0.clone();
            Ok(Box::new(path::Session { x, opened }) as Box<dyn Dialed>)
        })
    }

    fn fence<'a>(
        &'a self,
        shared: &'a Arc<Shared>,
        via: &'a PathSpec,
        conns: &'a [ConnId],
        same_group: bool,
    ) -> BoxFuture<'a, Result<(), Unproven>> {
        Box::pin(fence::attempt(shared, &self.0, via, conns, same_group))
    }

    fn fence_held(&self) -> Option<&str> {
        match &self.0.fence {
            Fence::Held { unit } => Some(unit),
            _ => None,
        }
    }

    fn same_group(&self, failed: PathId, via: PathId) -> bool {
        fence::same_group(&lock(&self.0.tags), failed.0, via.0)
    }

    fn reinstates(&self) -> bool {
        self.0.fence.reinstates()
    }

    fn leave<'a>(&'a self, links: &'a [Box<dyn Link>]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if self.0.reservations {
                // Registrations outlive sessions.
                let conns = links
                    .iter()
                    .filter_map(|l| session(l.as_ref()).cloned())
                    .collect();
                path::leave_all(&self.0, conns).await;
            }
        })
    }

    fn watch_access(&self, shared: &Arc<Shared>, path: PathId) {
        alua::watch(shared, &self.0, path);
    }

    fn refresh_access(&self, shared: &Arc<Shared>) {
        alua::refresh_all(shared, &self.0);
    }
}

impl Link for Arc<Conn> {
    fn send(&self, s: &SendChunk, payload: Option<Bytes>) -> bool {
        Conn::send(self, s, payload)
    }

    fn wire(&self) -> Option<Wire> {
        Conn::wire(self)
    }

    fn abort(&self) {
        Conn::abort(self);
    }

    fn close(self: Box<Self>, timeout: Duration) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            self.logout(timeout).await;
            self.abort();
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The iSCSI session behind a path's link.
fn session(link: &dyn Link) -> Option<&Arc<Conn>> {
    link.as_any().downcast_ref::<Arc<Conn>>()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
