//! NBD paths: a path is a set of NBD connections to one portal, each
//! checked to lead to the volume (its identity, and its size as
//! `discover::size_fits` says: an image may grow under it) and one probed
//! with a read before the path carries I/O; a failed path is fenced by a
//! fresh connection to any portal that asks braid's target for
//! `x-braid:fence` of the failed connections. Opening an NBD volume asks
//! the first portal what the volume is and where else it is served.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use braid_proto::braid_ns::{self, BraidContext, ConnId};
use braid_proto::{ClientConfig, CmdFlags, Command, Finish, Request};
use bytes::Bytes;
use tracing::info;

use super::admin::path_configs;
use super::core::Shared;
use super::link::{BoxFuture, Link};
use super::open::{engine_config, policy, split_rules, start, Plan};
use super::transport::{bring_up, Dialed, Transport, Unproven, Up};
use super::{OpenError, Settings, Volume, VolumeConfig, VolumeInfo};
use crate::conn::{self, ConnHandle, ConnectError, Wire};
use crate::discover::{self, Expect, PathConn, PathSpec};
use crate::engine::{Instance, PathId, SendChunk};
use crate::uri::NbdUri;

/// An NBD volume's transport.
struct Nbd {
    /// What every connection must agree on.
    expect: Expect,
    /// Connections per path.
    connections: usize,
    /// Bytes the probe of a new path reads.
    probe_len: u32,
    /// The largest reply payload the target may send.
    max_payload: u32,
}

impl Transport for Nbd {
    fn dial<'a>(
        &'a self,
        spec: &'a PathSpec,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Box<dyn Dialed>, ConnectError>> {
        Box::pin(async move {
            let mut conns = Vec::new();
            for _ in 0..self.connections {
                conns.push(discover::connect_path(spec, &self.expect, timeout).await?);
            }
            if let Some(first) = conns.first_mut() {
                conn::probe(&mut first.negotiated, self.probe_len, timeout).await?;
            }
            let max_payload = self.max_payload;
            Ok(Box::new(Conns { conns, max_payload }) as Box<dyn Dialed>)
        })
    }

    fn fence<'a>(
        &'a self,
        shared: &'a Arc<Shared>,
        via: &'a PathSpec,
        conns: &'a [ConnId],
        _same_group: bool,
    ) -> BoxFuture<'a, Result<(), Unproven>> {
        Box::pin(fence_via(shared, &self.expect, via, conns))
    }
}

/// A path's NBD connections, negotiated and probed.
struct Conns {
    conns: Vec<PathConn>,
    max_payload: u32,
}

impl Dialed for Conns {
    fn adopt(self: Box<Self>, shared: &Arc<Shared>, path: PathId, opening: bool) {
        let Conns { conns, max_payload } = *self;
        bring_up(shared, path, opening, |sink| {
            // Before the path carries anything: a restarted target gets
            // the writes it may have lost first (the engine compares
            // instances).
            let instance = conns
                .iter()
                .find_map(|c| c.instance)
                .map_or(Instance::Unknown, |i| Instance::Known(i.0));
            let mut up = Up {
                links: Vec::new(),
                allocation: Vec::new(),
                ids: Vec::new(),
                instance,
                access: None,
            };
            for c in conns {
                up.ids.push(c.server_id);
                up.allocation.push(c.allocation);
                let handle = conn::start(c.negotiated, max_payload, sink());
                up.links.push(Box::new(handle));
            }
            up
        });
    }
}

impl Link for ConnHandle {
    fn send(&self, s: &SendChunk, payload: Option<Bytes>) -> bool {
        ConnHandle::send(
            self,
            &Request {
                flags: CmdFlags::from_flags(s.flags),
                command: Command::from_op(s.op),
                cookie: s.cookie,
                offset: s.offset,
                length: s.len,
            },
            payload,
        )
    }

    fn wire(&self) -> Option<Wire> {
        ConnHandle::wire(self)
    }

    fn abort(&self) {
        ConnHandle::abort(self);
    }

    fn close(self: Box<Self>, timeout: Duration) -> BoxFuture<'static, ()> {
        let handle = *self;
        Box::pin(async move {
            handle.disconnect();
            handle.finish(timeout).await;
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One fence attempt through `spec`: a connection that asks the target
/// for `x-braid:fence` of `conns`, which it answers once they are closed
/// and their requests ended.
async fn fence_via(
    shared: &Arc<Shared>,
    expect: &Expect,
    spec: &PathSpec,
    conns: &[ConnId],
) -> Result<(), Unproven> {
    let timeout = shared.settings.connect_timeout;
    let stream = conn::dial(&spec.portal, &spec.local, timeout).await?;
    let cfg = ClientConfig {
        // The fence names this session's own connections, and the target
        // checks it by the token.
        list_queries: vec![
            BraidContext::Session(expect.session).name(),
            "x-braid:instance".into(),
            BraidContext::Fence(conns.to_vec()).name(),
        ],
        finish: Finish::Abort,
        ..ClientConfig::go(expect.export.clone())
    };
    // The target answers only once the fence is complete: allow it time.
    let tls = expect.tls.as_ref();
    let n = conn::negotiate(stream, cfg, &spec.portal.to_string(), timeout * 6, tls).await?;
    let instance = n
        .outcome
        .listed
        .iter()
        .find_map(|name| match BraidContext::parse(name) {
            Some(BraidContext::Instance(Some(i))) => Some(i),
            _ => None,
        });
    if let Some(i) = instance {
        // Another process than the one that made the failed connections
        // (a restart): it cannot fence them, and need not, as they went
        // with the old one. The engine decides.
        let mut core = shared.lock();
        core.engine.instance_seen(shared.now(), i.0);
        core.act(shared);
    }
    if braid_ns::confirms_fence(&n.outcome.listed, conns) {
        Ok(())
    } else {
        Err(Unproven::Failed(ConnectError::Other(format!(
            "{}: the target did not confirm the fence",
            spec.portal
        ))))
    }
}

/// An NBD volume: the first portal says what the volume is and where else
/// it is served; every path is an NBD connection set.
pub(super) async fn open(
    cfg: VolumeConfig,
    uri: NbdUri,
    span: tracing::Span,
) -> Result<Volume, OpenError> {
    if cfg.persistent_reservations {
        return Err(OpenError::Usage(
            "persistent reservations fence iSCSI paths; NBD paths are fenced by the target \
             (drop --persistent-reservations)"
                .into(),
        ));
    }
    let super::Plan {
        discovery: d,
        paths: specs,
        tls,
    } = super::plan::plan_nbd(&cfg, &uri).await?;
    let configs = path_configs(&cfg.paths, &specs).map_err(OpenError::Usage)?;
    let multi = d.export.flags.can_multi_conn();
    let spreading = specs.len() > 1 || cfg.connections_per_path.unwrap_or(1) > 1;
    let policy = policy(&cfg, multi, spreading)?;
    let connections_per_path = if multi {
        cfg.connections_per_path.unwrap_or(1).max(1)
    } else {
        1
    };
    let export = d.export.clone();
    let split = split_rules(
        &cfg,
        export.min_block,
        export.preferred_block,
        export.max_payload,
    );
    let settings = Settings {
        connect_timeout: cfg.connect_timeout,
        fencing: d.braid && !cfg.danger_no_fence,
        transport: Box::new(Nbd {
            connections: connections_per_path,
            probe_len: export.min_block.max(1).min(export.size.min(4096) as u32),
            max_payload: export.max_payload,
            expect: Expect {
                export: uri.export.clone(),
                tls,
                size: export.size,
                identity: d.identity.clone(),
                source: uri.endpoint.to_string(),
                // Fresh for each open: a fence by this volume can name
                // only connections this volume opened.
                session: braid_proto::braid_ns::SessionToken(uuid::Uuid::new_v4().as_u128()),
            },
        }),
    };
    let plan = Plan {
        engine: engine_config(&cfg, split, export.size, export.min_block),
        specs,
        configs,
        policy,
        settings,
        instance: d.instance.map(|i| i.0),
        info: VolumeInfo {
            export: uri.export.clone(),
            size: export.size,
            flags: export.flags,
            min_block: export.min_block,
            preferred_block: export.preferred_block,
            max_payload: export.max_payload,
            identity: d.identity,
            paths: Vec::new(),
            connections_per_path,
            fencing: d.braid,
            fence: if d.braid && !cfg.danger_no_fence {
                "x-braid:fence"
            } else {
                "none"
            },
            block_status: false,
            transport: "nbd",
        },
    };
    let many = plan.specs.len() > 1;
    let vol = start(plan, span).await?;
    if !d.braid && many {
        info!("the server is not braid: no fencing, and identity is checked by size only");
    }
    Ok(vol)
}
