//! Background recovery: reconnecting failed paths (with the identity
//! checked again and a probe before they rejoin) and fencing a failed
//! path's connections on the target before its writes are re-sent.

use std::sync::Arc;
use std::time::Duration;

use braid_proto::braid_ns::ConnId;
use tracing::{debug, info, warn};

use crate::conn::ConnectError;
use crate::discover;
use crate::engine::{FenceId, PathId};

use super::core::Shared;
use super::transport::{Dialed, Unproven};

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
        .map(|dialed| dialed.adopt(&shared, path, false));
    let mut core = shared.lock();
    core.paths[path.0].reconnecting = false;
    if let Err(e) = result {
        if e.other_volume() {
            // Only an operator can mend this: say it each time.
            warn!("reconnect refused: {}", crate::conn::chain(&e));
        } else {
            debug!("reconnect failed: {}", crate::conn::chain(&e));
        }
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
) -> Result<Box<dyn Dialed>, ConnectError> {
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
    dial(shared, spec, timeout).await?.adopt(shared, path, true);
    Ok(())
}

/// Connects every connection of a path and checks it, as its transport
/// does.
async fn dial(
    shared: &Arc<Shared>,
    spec: &discover::PathSpec,
    timeout: Duration,
) -> Result<Box<dyn Dialed>, ConnectError> {
    shared.settings.transport.dial(spec, timeout).await
}

/// Asks the target to fence `conns` (the connections of one failure of a
/// path; the task runs in that path's span), over a fresh connection on
/// any path, until it succeeds or the
/// engine no longer wants `fence`. Each failure runs its own: a newer
/// failure of the same path neither ends nor completes this one. A unit
/// no fence is known for is never asked: its writes wait for the no-path
/// timeout.
pub(crate) async fn fence(shared: Arc<Shared>, path: PathId, fence: FenceId, conns: Vec<ConnId>) {
    let transport = &shared.settings.transport;
    if let Some(unit) = transport.fence_held() {
        warn!(
            fence = fence.0,
            unit,
            "no fence is known for this target: the failed path's writes are held, and \
             fail with EIO at the no-path timeout unless the path's target restarts"
        );
        return;
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
                    let same = transport.same_group(path, PathId(i));
                    let through = same || !transport.reinstates();
                    let usable = core.engine.path_usable(PathId(i));
                    through.then(|| (usable, same, p.spec.clone()))
                })
                .collect();
            v.sort_by_key(|(usable, ..)| !usable);
            v
        };
        for (_, same, spec) in candidates {
            let Some(attempt) =
                until_closed(&shared, transport.fence(&shared, &spec, &conns, same)).await
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
