//! Background recovery: reconnecting failed paths (with the identity
//! checked again and a probe before they rejoin) and fencing a failed
//! path's connections on the target before its writes are re-sent.

use std::sync::Arc;
use std::time::Duration;

use braid_proto::braid_ns::{self, BraidContext, ConnId};
use braid_proto::{ClientConfig, Finish};
use tracing::{debug, info};

use crate::conn::{self, ConnectError};
use crate::discover;
use crate::engine::{FenceId, Instance, PathId};

use super::core::{ConnSink, Shared};
use super::link::Link;
use super::{open_iscsi, Transport};

/// A reconnect dial gives up on a silent portal after this long: past
/// TCP's first SYN retransmission at 1 s, so that a SYN lost just before a
/// link came back is sent again in time to be answered.
const RECONNECT_DIAL: Duration = Duration::from_millis(1500);

/// While dials wait, another starts this often, for this long: a silent
/// path gets a fresh SYN every quarter second rather than one per attempt.
const RECONNECT_STAGGER: Duration = Duration::from_millis(250);
const RECONNECT_SPAN: Duration = Duration::from_secs(2);

/// Waits `after`, then tries to bring `path` back.
pub(crate) async fn reconnect(shared: Arc<Shared>, path: PathId, after: Duration) {
    tokio::time::sleep(after).await;
    if shared.closed() {
        return;
    }
    let spec = {
        let core = shared.lock();
        core.paths[path.0].spec.clone()
    };
    let result = staggered_dial(&shared, &spec)
        .await
        .map(|dialed| adopt(&shared, path, dialed, false));
    let mut core = shared.lock();
    core.paths[path.0].reconnecting = false;
    if let Err(e) = result {
        debug!("reconnect failed: {}", crate::conn::chain(&e));
        core.engine.reconnect_failed(path);
    }
    core.act(&shared);
}

/// Dials a path, starting another dial every [`RECONNECT_STAGGER`] (for
/// [`RECONNECT_SPAN`]) while the earlier ones wait; the first to succeed
/// wins and the others are dropped. Fails once every dial has failed: at
/// once where the kernel refuses at once (a link that is down).
async fn staggered_dial(
    shared: &Arc<Shared>,
    spec: &discover::PathSpec,
) -> Result<Dialed, ConnectError> {
    let start = |dials: &mut tokio::task::JoinSet<_>| {
        let (shared, spec) = (shared.clone(), spec.clone());
        dials.spawn(async move { dial(&shared, &spec, RECONNECT_DIAL).await });
    };
    let mut dials = tokio::task::JoinSet::new();
    start(&mut dials);
    let span_end = tokio::time::Instant::now() + RECONNECT_SPAN;
    let mut next = tokio::time::Instant::now() + RECONNECT_STAGGER;
    loop {
        tokio::select! {
            done = dials.join_next() => match done {
                Some(Ok(Ok(conns))) => return Ok(conns),
                Some(Ok(Err(e))) if dials.is_empty() => return Err(e),
                Some(Ok(Err(_))) => {}
                Some(Err(e)) => return Err(ConnectError::Other(format!("dial task: {e}"))),
                None => unreachable!("a dial is always running here"),
            },
            () = tokio::time::sleep_until(next), if next < span_end => {
                start(&mut dials);
                next += RECONNECT_STAGGER;
            }
        }
    }
}

/// Connects every connection of a path, probes one, and hands them to the
/// engine. Used at open.
pub(crate) async fn open_conns(
    shared: &Arc<Shared>,
    path: PathId,
    spec: &discover::PathSpec,
    timeout: Duration,
) -> Result<(), ConnectError> {
    let dialed = dial(shared, spec, timeout).await?;
    adopt(shared, path, dialed, true);
    Ok(())
}

/// A path's connections, made and checked, not yet carrying I/O.
pub(crate) enum Dialed {
    Nbd(Vec<discover::PathConn>),
    Iscsi(Box<crate::iscsi::Opened>),
}

/// Connects every connection of a path and checks it: NBD connections
/// with one probed, or an iSCSI session with its unit identified.
async fn dial(
    shared: &Arc<Shared>,
    spec: &discover::PathSpec,
    timeout: Duration,
) -> Result<Dialed, ConnectError> {
    let settings = &shared.settings;
    let expect = match &settings.transport {
        Transport::Nbd(expect) => expect,
        Transport::Iscsi(x) => {
            return open_iscsi::dial(x, spec, timeout)
                .await
                .map(|o| Dialed::Iscsi(Box::new(o)))
        }
    };
    let mut conns = Vec::new();
    for _ in 0..settings.connections_per_path {
        let c = discover::connect_path(spec, expect, timeout).await?;
        conns.push(c);
    }
    if let Some(first) = conns.first_mut() {
        conn::probe(&mut first.negotiated, settings.probe_len, timeout).await?;
    }
    Ok(Dialed::Nbd(conns))
}

/// Hands a path's new connections to the engine; `opening` while the
/// volume opens (nothing was acknowledged yet that a restart could lose).
fn adopt(shared: &Arc<Shared>, path: PathId, dialed: Dialed, opening: bool) {
    let conns = match dialed {
        Dialed::Nbd(conns) => conns,
        Dialed::Iscsi(o) => return open_iscsi::adopt(shared, path, *o, opening),
    };
    let settings = &shared.settings;
    let mut core = shared.lock();
    if shared.closed() {
        return; // the connections just made are dropped
    }
    let generation = core.paths[path.0].generation + 1;
    let mut handles = Vec::new();
    let mut ids = Vec::new();
    let mut allocation = Vec::new();
    // Before the path carries anything: a restarted target gets the
    // writes it may have lost first (the engine compares instances).
    let instance = conns
        .iter()
        .find_map(|c| c.instance)
        .map_or(Instance::Unknown, |i| Instance::Known(i.0));
    for c in conns {
        let sink = Arc::new(ConnSink {
            shared: Arc::downgrade(shared),
            path,
            generation,
            allocation: c.allocation,
        });
        ids.push(c.server_id);
        allocation.push(c.allocation);
        handles.push(Some(Link::Nbd(conn::start(
            c.negotiated,
            settings.max_payload,
            sink,
        ))));
    }
    let p = &mut core.paths[path.0];
    p.generation = generation;
    p.conns = handles;
    p.allocation = allocation;
    let fencing = settings.fencing && ids.iter().all(Option::is_some);
    let now = shared.now();
    core.engine.path_up_with(now, path, ids, fencing, instance);
    core.act(shared);
}

/// Asks the target to fence `conns` (the connections of one failure of a
/// path; the task runs in that path's span), over a fresh connection on
/// any path, until it succeeds or the
/// engine no longer wants `fence`. Each failure runs its own: a newer
/// failure of the same path neither ends nor completes this one.
pub(crate) async fn fence(shared: Arc<Shared>, path: PathId, fence: FenceId, conns: Vec<ConnId>) {
    let named: Vec<String> = conns.iter().map(ToString::to_string).collect();
    let mut delay = Duration::from_millis(50);
    loop {
        let candidates = {
            let core = shared.lock();
            if shared.closed() || !core.engine.fence_pending(fence) {
                return;
            }
            // Paths that work now first; the failed one last.
            let mut v: Vec<(bool, discover::PathSpec)> = core
                .paths
                .iter()
                .enumerate()
                .filter(|(i, _)| fences_through(&shared.settings.transport, path, PathId(*i)))
                .map(|(i, p)| {
                    let usable = core.engine.path_usable(PathId(i));
                    (usable, p.spec.clone())
                })
                .collect();
            v.sort_by_key(|(usable, _)| !usable);
            v
        };
        for (_, spec) in candidates {
            match fence_via(&shared, &spec, &conns).await {
                Ok(()) => {
                    info!(fence = fence.0, conns = ?named, via = %spec, "target fenced the failed connections");
                    let mut core = shared.lock();
                    core.engine.fence_done(shared.now(), fence);
                    core.act(&shared);
                    return;
                }
                Err(e) => debug!(via = %spec, "fence attempt failed: {}", crate::conn::chain(&e)),
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}

/// Whether a fence of `failed`'s connections may go through `via`'s
/// portal. An iSCSI session is reinstated only by a login to a portal of
/// its own portal group (RFC 7143: a session is its ISID and the group's
/// tag; braid's target and LIO keep sessions per group), so a fence by
/// reinstatement goes through portals with the failed path's tag, which
/// may be its own portal alone: then its writes wait until that portal
/// answers again. A persistent reservation fence, and NBD's, go through
/// any path.
fn fences_through(transport: &Transport, failed: PathId, via: PathId) -> bool {
    match transport {
        Transport::Iscsi(x) if !x.reservations => {
            let tags = x.tags.lock().unwrap_or_else(|p| p.into_inner());
            same_group(&tags, failed.0, via.0)
        }
        _ => true,
    }
}

/// Whether path `via`'s portal is in path `failed`'s portal group (a
/// path whose tag is unknown is in no group but its own).
fn same_group(tags: &[Option<u16>], failed: usize, via: usize) -> bool {
    let tag = |i: usize| tags.get(i).copied().flatten();
    via == failed || tag(via).is_some_and(|t| Some(t) == tag(failed))
}

async fn fence_via(
    shared: &Arc<Shared>,
    spec: &discover::PathSpec,
    conns: &[ConnId],
) -> Result<(), ConnectError> {
    let timeout = shared.settings.connect_timeout;
    let expect = match &shared.settings.transport {
        Transport::Nbd(expect) => expect,
        Transport::Iscsi(x) => {
            let isids: Vec<_> = conns.iter().map(|c| open_iscsi::isid_of(*c)).collect();
            if x.reservations {
                crate::iscsi::reserve::fence(spec, &x.session, &isids, timeout).await?;
                open_iscsi::fenced(x, conns);
                return Ok(());
            }
            return crate::iscsi::discover::fence(spec, &x.session, &isids, timeout).await;
        }
    };
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
        Err(ConnectError::Other(format!(
            "{}: the target did not confirm the fence",
            spec.portal
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::same_group;

    #[test]
    fn a_session_is_fenced_only_through_its_own_portal_group() {
        // braid's target: a group per portal; only the failed portal.
        let per_portal = [Some(1), Some(2)];
        assert!(same_group(&per_portal, 0, 0));
        assert!(!same_group(&per_portal, 0, 1));
        // tgt, LIO's default: one group for every portal; any of them.
        let one_group = [Some(1), Some(1), Some(1)];
        assert!((0..3).all(|via| same_group(&one_group, 2, via)));
        // A tag never learnt: its own portal only.
        let unknown = [None, None];
        assert!(same_group(&unknown, 1, 1));
        assert!(!same_group(&unknown, 1, 0));
    }
}
