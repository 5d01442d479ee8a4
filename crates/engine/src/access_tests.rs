//! ALUA as every policy sees it: optimized paths first, non-optimized
//! only without them, never standby, unavailable or transitioning ones;
//! refused chunks placed again without a fence; a transition waited out.

use std::time::Duration;

use braid_policy::{by_name, PolicyOptions, NAMES};
use braid_proto::braid_ns::ConnId;

use super::*;

fn engine(policy: &str, paths: usize) -> Engine {
    let mut e = Engine::new(
        EngineConfig {
            size: 1 << 30,
            no_path_timeout: Some(Duration::from_secs(10)),
            ..EngineConfig::default()
        },
        by_name(policy, &PolicyOptions::default()).unwrap(),
    );
    for i in 0..paths {
        let p = e.add_path(PathConfig::default(), Duration::ZERO);
        e.path_up(Duration::ZERO, p, vec![Some(ConnId(i as u128 + 1))], true);
    }
    while e.poll_action().is_some() {}
    e
}

fn submit(e: &mut Engine, now: Duration, op: Op, len: u64) -> ReqId {
    e.submit(now, crate::tests::request(op, 0, len))
}

/// Requests completed, with their results.
type Completed = Vec<(ReqId, Result<(), IoError>)>;

/// Drains the actions: the chunks sent, whether any fence was asked, and
/// what completed.
fn drain(e: &mut Engine) -> (Vec<SendChunk>, bool, Completed) {
    let (mut sent, mut fenced, mut done) = (Vec::new(), false, Vec::new());
    while let Some(a) = e.poll_action() {
        match a {
            Action::Send(s) => sent.push(s),
            Action::Fence { .. } => fenced = true,
            Action::Complete { req, result } => done.push((req, result)),
            _ => {}
        }
    }
    (sent, fenced, done)
}

/// Paths that received chunks for `n` reads, each answered at once.
fn used(e: &mut Engine, now: Duration, n: usize) -> Vec<usize> {
    let mut paths = Vec::new();
    for _ in 0..n {
        submit(e, now, Op::Read, 1 << 20);
        let (sent, _, _) = drain(e);
        for s in sent {
            paths.push(s.path.0);
            e.reply(now, s.cookie, Ok(()));
        }
        drain(e);
    }
    paths.sort_unstable();
    paths.dedup();
    paths
}

#[test]
fn every_policy_uses_optimized_paths_then_non_optimized_never_the_rest() {
    for name in NAMES {
        let mut e = engine(name, 4);
        let t = Duration::from_millis(1);
        e.set_access(t, PathId(0), Access::NonOptimized);
        e.set_access(t, PathId(2), Access::Standby);
        e.set_access(t, PathId(3), Access::Unavailable);
        assert_eq!(used(&mut e, t, 20), [1], "{name}: only the optimized path");
        e.set_access(t, PathId(1), Access::Transitioning);
        assert_eq!(
            used(&mut e, t, 20),
            [0],
            "{name}: non-optimized without optimized"
        );
        e.set_access(t, PathId(1), Access::Optimized);
        e.set_access(t, PathId(2), Access::Optimized);
        let both = used(&mut e, t, 40);
        assert!(both.iter().all(|p| [1, 2].contains(p)), "{name}: {both:?}");
        assert_eq!(e.path_report(PathId(3), t).access, Access::Unavailable);
    }
}

#[test]
fn a_chunk_the_port_refused_goes_elsewhere_without_a_fence() {
    let mut e = engine("round-robin", 2);
    let t = Duration::from_millis(1);
    let req = submit(&mut e, t, Op::Write, 4096);
    let (sent, _, _) = drain(&mut e);
    let first = sent[0].clone();
    // The port turned standby: the target answered NOT READY, unexecuted.
    e.set_access(t, first.path, Access::Standby);
    e.retry_elsewhere(t, first.cookie);
    let (again, fenced, _) = drain(&mut e);
    assert!(!fenced, "an unexecuted write needs no fence");
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].path, first.path);
    // A late answer for the first copy counts for nothing.
    e.reply(t, first.cookie, Ok(()));
    assert!(drain(&mut e).2.is_empty());
    e.reply(t, again[0].cookie, Ok(()));
    assert_eq!(drain(&mut e).2, [(req, Ok(()))]);
    assert_eq!(e.path_report(first.path, t).counters.resent, 1);
    assert_eq!(e.path_report(first.path, t).inflight_requests, 0);
}

#[test]
fn a_transition_is_waited_out_not_failed() {
    let mut e = engine("adaptive", 1);
    let t = Duration::from_millis(1);
    e.set_access(t, PathId(0), Access::Transitioning);
    let req = submit(&mut e, t, Op::Read, 4096);
    e.tick(Duration::from_secs(5));
    let (sent, _, done) = drain(&mut e);
    assert!(
        sent.iter().all(|s| s.req.is_none()),
        "only probes while transitioning"
    );
    assert!(done.is_empty(), "not failed within the no-path timeout");
    e.set_access(Duration::from_secs(5), PathId(0), Access::Optimized);
    let (sent, _, _) = drain(&mut e);
    let chunk = sent
        .iter()
        .find(|s| s.req.is_some())
        .expect("sent once active");
    e.reply(Duration::from_secs(5), chunk.cookie, Ok(()));
    assert_eq!(drain(&mut e).2, [(req, Ok(()))]);
}
