//! What a protocol must do for a volume's paths: the [`Transport`] trait,
//! which NBD (`nbd.rs`) and iSCSI (`iscsi/`) implement. The volume's core,
//! its recovery and its opening call only this; the protocol's own words
//! stay in its module. Dialing, fencing and closing happen once per path
//! or per failure, so their futures are boxed; requests go through each
//! connection's [`Link`] and come back through the one neutral
//! [`crate::sink::Sink`], neither boxed nor allocated per request.

use std::sync::Arc;
use std::time::Duration;

use braid_proto::braid_ns::ConnId;

use super::core::{ConnSink, Shared};
use super::link::{BoxFuture, Link};
use crate::conn::ConnectError;
use crate::discover::PathSpec;
use crate::engine::{Access, Instance, PathId};

/// A protocol's side of a volume: one per volume, holding what every
/// connection of it must agree on.
pub(crate) trait Transport: Send + Sync + 'static {
    /// Connects every connection of a path and checks it leads to the
    /// volume, ready to carry I/O (not carrying any yet).
    fn dial<'a>(
        &'a self,
        spec: &'a PathSpec,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Box<dyn Dialed>, ConnectError>>;

    /// One attempt at fencing `conns` (the connections of one failure of
    /// a path) through `via`; `same_group` when `via` is in the failed
    /// path's portal group.
    fn fence<'a>(
        &'a self,
        shared: &'a Arc<Shared>,
        via: &'a PathSpec,
        conns: &'a [ConnId],
        same_group: bool,
    ) -> BoxFuture<'a, Result<(), Unproven>>;

    /// The unit no fence is known for, whose failed paths' writes are
    /// held without asking the target: `None` where fences are tried.
    fn fence_held(&self) -> Option<&str> {
        None
    }

    /// Whether path `via` is in path `failed`'s portal group.
    fn same_group(&self, _failed: PathId, _via: PathId) -> bool {
        true
    }

    /// Whether a fence goes only through the failed path's portal group
    /// (it reinstates the failed session, which only that group takes).
    fn reinstates(&self) -> bool {
        false
    }

    /// What must be undone before the connections close, as they outlive
    /// them (reservation keys); bounded in time.
    fn leave<'a>(&'a self, _links: &'a [Box<dyn Link>]) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// `path`'s port cannot serve the unit now: watch it until it can.
    fn watch_access(&self, _shared: &Arc<Shared>, _path: PathId) {}

    /// The target says its ports' states changed: read every path's.
    fn refresh_access(&self, _shared: &Arc<Shared>) {}
}

/// A path's connections, made and checked, not yet carrying I/O.
pub(crate) trait Dialed: Send + 'static {
    /// Hands them to the engine; `opening` while the volume opens
    /// (nothing was acknowledged yet that a restart could lose).
    fn adopt(self: Box<Self>, shared: &Arc<Shared>, path: PathId, opening: bool);
}

/// Why a fence attempt did not confirm the fence.
pub(crate) enum Unproven {
    /// It failed (no answer, a refusal): another attempt may succeed.
    Failed(ConnectError),
    /// It found nothing that proves the fence, and says until when the
    /// writes stay held (the first such of a fence is a warning).
    Held(String),
}

impl From<ConnectError> for Unproven {
    fn from(e: ConnectError) -> Self {
        Unproven::Failed(e)
    }
}

/// A path's connections as its transport started them.
pub(crate) struct Up {
    pub links: Vec<Box<dyn Link>>,
    /// Context id of `base:allocation` on each connection.
    pub allocation: Vec<Option<u32>>,
    /// The target's id of each connection, which a fence names.
    pub ids: Vec<Option<ConnId>>,
    /// Which process of the target answered, as far as it says.
    pub instance: Instance,
    /// The port's access state, where the protocol has one.
    pub access: Option<Access>,
}

/// Hands a path's new connections to the engine: `start` starts them,
/// each with a sink [`sink`](ConnSink) makes for it. A reset seen while the volume opens says
/// only that the target tells of restarts. `false` if the volume closed
/// (the connections are then never started).
pub(crate) fn bring_up(
    shared: &Arc<Shared>,
    path: PathId,
    opening: bool,
    start: impl FnOnce(&dyn Fn() -> Arc<ConnSink>) -> Up,
) -> bool {
    let mut core = shared.lock();
    if shared.closed() {
        return false; // the connections just made are dropped
    }
    let generation = core.paths[path.0].generation + 1;
    let sink = || {
        Arc::new(ConnSink {
            shared: Arc::downgrade(shared),
            path,
            generation,
        })
    };
    let up = start(&sink);
    let instance = match up.instance {
        Instance::ResetSeen if opening => {
            core.engine.restarts_told();
            Instance::Unknown
        }
        i => i,
    };
    let p = &mut core.paths[path.0];
    p.generation = generation;
    p.conns = up.links.into_iter().map(Some).collect();
    p.allocation = up.allocation;
    let fencing = shared.settings.fencing && up.ids.iter().all(Option::is_some);
    let now = shared.now();
    core.engine
        .path_up_with(now, path, up.ids, fencing, instance);
    if let Some(access) = up.access {
        core.engine.set_access(now, path, access);
    }
    core.act(shared);
    true
}
