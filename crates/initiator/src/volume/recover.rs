//! Background recovery: reconnecting failed paths (with the identity
//! checked again and a probe before they rejoin) and fencing a failed
//! path's connections on the target before its writes are re-sent.

use std::sync::Arc;
use std::time::Duration;

use braid_proto::braid_ns::{self, BraidContext, ConnId};
use braid_proto::{ClientConfig, Finish};
use tracing::{debug, info, warn};

use crate::conn::{self, ConnectError};
use crate::discover;
use crate::engine::{FenceId, Instance, PathId};
use crate::iscsi::fence::{reinstate, AfterPreempt, Fence};

use super::core::{ConnSink, Shared};
use super::link::Link;
use super::{iscsi_path, Transport};

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
            return iscsi_path::dial(x, spec, timeout)
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
        Dialed::Iscsi(o) => return iscsi_path::adopt(shared, path, *o, opening),
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
/// failure of the same path neither ends nor completes this one. A unit
/// no fence is known for is never asked: its writes wait for the no-path
/// timeout.
pub(crate) async fn fence(shared: Arc<Shared>, path: PathId, fence: FenceId, conns: Vec<ConnId>) {
    if let Transport::Iscsi(x) = &shared.settings.transport {
        if let Fence::Held { unit } = &x.fence {
            warn!(
                fence = fence.0,
                unit,
                "no fence is known for this target: the failed path's writes are held, and \
                 fail with EIO at the no-path timeout unless the path's target restarts"
            );
            return;
        }
    }
    let named: Vec<String> = conns.iter().map(ToString::to_string).collect();
    let mut delay = Duration::from_millis(50);
    let mut told = false;
    loop {
        let candidates = {
            let core = shared.lock();
            if shared.closed() || !core.engine.fence_pending(fence) {
                return;
            }
            // Paths that work now first; the failed one last.
            let mut v: Vec<(bool, bool, discover::PathSpec)> = core
                .paths
                .iter()
                .enumerate()
                .filter_map(|(i, p)| {
                    let same = same_group_as(&shared.settings.transport, path, PathId(i));
                    let through = same || !reinstates(&shared.settings.transport);
                    let usable = core.engine.path_usable(PathId(i));
                    through.then(|| (usable, same, p.spec.clone()))
                })
                .collect();
            v.sort_by_key(|(usable, ..)| !usable);
            v
        };
        for (_, same, spec) in candidates {
            let Some(attempt) =
                until_closed(&shared, fence_via(&shared, &spec, &conns, same)).await
            else {
                return;
            };
            match attempt {
                Ok(()) => {
                    info!(fence = fence.0, conns = ?named, via = %spec, "target fenced the failed connections");
                    let mut core = shared.lock();
                    core.engine.fence_done(shared.now(), fence);
                    core.act(&shared);
                    return;
                }
                Err(Unproven::Held(why)) if !told => {
                    told = true;
                    warn!(fence = fence.0, via = %spec, "{why}");
                }
                Err(Unproven::Held(why)) => debug!(via = %spec, "{why}"),
                Err(Unproven::Failed(e)) => {
                    debug!(via = %spec, "fence attempt failed: {}", crate::conn::chain(&e));
                }
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}

/// `work`, or `None` once the volume is closed: a fence's barrier may be
/// awaited for several connect timeouts, and nothing of a closed volume
/// waits for it (its held writes ended with the volume).
async fn until_closed<T>(shared: &Shared, work: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::pin!(work);
    loop {
        tokio::select! {
            out = &mut work => return Some(out),
            () = tokio::time::sleep(Duration::from_millis(50)) => {
                if shared.closed() {
                    return None;
                }
            }
        }
    }
}

/// Why a fence attempt did not confirm the fence.
enum Unproven {
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

/// Whether the volume's fence logs in with the failed session's ISID,
/// which only a portal of that session's portal group takes.
fn reinstates(transport: &Transport) -> bool {
    matches!(transport, Transport::Iscsi(x) if x.fence.reinstates())
}

/// Whether `via`'s portal is in `failed`'s iSCSI portal group: a session
/// is reinstated only by a login to a portal of its own group (RFC 7143:
/// a session is its ISID and the group's tag; braid's target and LIO keep
/// sessions per group), so a fence by reinstatement goes through portals
/// with the failed path's tag, which may be its own portal alone: then
/// its writes wait until that portal answers again. A persistent
/// reservation fence, and NBD's, go through any path.
fn same_group_as(transport: &Transport, failed: PathId, via: PathId) -> bool {
    match transport {
        Transport::Iscsi(x) => {
            let tags = x.tags.lock().unwrap_or_else(|p| p.into_inner());
            same_group(&tags, failed.0, via.0)
        }
        Transport::Nbd(_) => true,
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
    same_group: bool,
) -> Result<(), Unproven> {
    let timeout = shared.settings.connect_timeout;
    let expect = match &shared.settings.transport {
        Transport::Nbd(expect) => expect,
        Transport::Iscsi(x) => {
            return fence_iscsi(shared, x, spec, conns, same_group, timeout).await;
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
        Err(Unproven::Failed(ConnectError::Other(format!(
            "{}: the target did not confirm the fence",
            spec.portal
        ))))
    }
}

/// One attempt at an iSCSI fence through `spec`, as the unit's
/// [`Fence`] says.
async fn fence_iscsi(
    shared: &Arc<Shared>,
    x: &iscsi_path::Expect,
    spec: &discover::PathSpec,
    conns: &[ConnId],
    same_group: bool,
    timeout: Duration,
) -> Result<(), Unproven> {
    let isids: Vec<_> = conns.iter().map(|c| iscsi_path::isid_of(*c)).collect();
    let cfg = &x.session;
    match &x.fence {
        Fence::Reinstatement => reinstate(spec, cfg, &isids, timeout, None).await?,
        Fence::ReinstatementThenReset => {
            let expect = || iscsi_path::expect_own_reset(shared);
            reinstate(spec, cfg, &isids, timeout, Some(&expect)).await?;
        }
        Fence::Reservation { reinstate_gone } => {
            let gone = crate::iscsi::reserve::fence(spec, cfg, &isids, timeout).await?;
            match x.fence.after_preempt(gone.len(), same_group) {
                AfterPreempt::Confirmed => {}
                AfterPreempt::Reinstate => reinstate(spec, cfg, &gone, timeout, None).await?,
                AfterPreempt::Held => {
                    return Err(Unproven::Held(format!(
                        "{}: fence: the reservation keys of {} failed session(s) were already \
                         gone (an earlier PREEMPT AND ABORT may have gone unanswered), which \
                         proves nothing about their writes: they stay held{}",
                        spec.portal,
                        gone.len(),
                        if *reinstate_gone {
                            " until a portal of the failed session's group answers (the \
                             target's session reinstatement is the barrier), or the no-path \
                             timeout"
                        } else {
                            ", and fail with EIO at the no-path timeout"
                        }
                    )));
                }
            }
            iscsi_path::fenced(x, conns);
        }
        Fence::Held { .. } | Fence::Off => {
            return Err(Unproven::Held("no fence is known for this target".into()))
        }
    }
    Ok(())
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
