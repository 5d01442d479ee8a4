//! Scenario tests of fencing: a failed path's writes wait for its fence,
//! each failure has its own, and nothing is resent before the target
//! confirms it (unless fencing is turned off).

use std::time::Duration;

use braid_policy::{by_name, PolicyOptions};
use braid_proto::braid_ns::ConnId;

use super::tests::Harness;
use super::*;

#[test]
fn writes_of_a_failed_path_wait_for_its_fence() {
    let mut h = Harness::new("round-robin", 2, EngineConfig::default());
    let r = h.submit(Op::Write, 0, 1 << 20);
    let before = h.sent.len();
    h.e.path_failed(h.now, PathId(0), "reset");
    h.pump();
    assert!(h.log.contains(&Action::Fence {
        path: PathId(0),
        fence: FenceId(1),
        conns: vec![ConnId(100)]
    }));
    assert_eq!(h.sent.len(), before, "a write was re-sent before the fence");
    assert_eq!(h.e.volume_counters().fences, 0);
    h.e.fence_done(h.now, FenceId(1));
    h.pump();
    assert_eq!(h.e.volume_counters().fences, 1);
    assert!(h.sent.len() > before);
    assert!(h.sent[before..].iter().all(|s| s.path.0 == 1));
    // Old cookies on path 0 are stale; answer only the live ones.
    let live: Vec<Cookie> = h
        .sent
        .iter()
        .filter(|s| s.path.0 == 1)
        .map(|s| s.cookie)
        .collect();
    for c in live {
        h.e.reply(h.now, c, Ok(()));
    }
    h.pump();
    assert_eq!(h.done[&r], Ok(()));
}

#[test]
fn without_fencing_writes_are_resent_after_close() {
    let mut e = Engine::new(
        EngineConfig {
            size: 1 << 30,
            ..EngineConfig::default()
        },
        by_name("round-robin", &PolicyOptions::default()).unwrap(),
    );
    for _ in 0..2 {
        let p = e.add_path(PathConfig::default(), Duration::ZERO);
        e.path_up(Duration::ZERO, p, vec![None], false);
    }
    while e.poll_action().is_some() {}
    e.submit(Duration::ZERO, crate::tests::request(Op::Write, 0, 1 << 20));
    while e.poll_action().is_some() {}
    e.path_failed(Duration::ZERO, PathId(0), "reset");
    let actions: Vec<Action> = std::iter::from_fn(|| e.poll_action()).collect();
    let close = actions
        .iter()
        .position(|a| matches!(a, Action::Close { .. }))
        .unwrap();
    let first_send = actions
        .iter()
        .position(|a| matches!(a, Action::Send(_)))
        .unwrap();
    assert!(close < first_send);
    assert!(!actions.iter().any(|a| matches!(a, Action::Fence { .. })));
}

#[test]
fn each_failure_of_a_path_has_its_own_fence_and_releases_only_its_writes() {
    let mut h = Harness::new("round-robin", 2, EngineConfig::default());
    // First failure of path 0, with writes on its connection 100.
    h.submit(Op::Write, 0, 1 << 20);
    h.e.path_failed(h.now, PathId(0), "reset");
    h.pump();
    // Path 0 comes back as connection 200 and fails again, with writes,
    // while the first fence is still out.
    h.e.path_up(h.now, PathId(0), vec![Some(ConnId(200))], true);
    h.pump();
    h.e.set_enabled(h.now, PathId(1), false);
    h.sent.clear();
    h.submit(Op::Write, 8 << 20, 1 << 20);
    assert!(
        h.sent.iter().all(|s| s.path.0 == 0),
        "the second write goes on path 0"
    );
    h.e.path_failed(h.now, PathId(0), "reset again");
    h.pump();
    let fences: Vec<(FenceId, Vec<ConnId>)> = h
        .log
        .iter()
        .filter_map(|a| match a {
            Action::Fence { fence, conns, .. } => Some((*fence, conns.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        fences,
        vec![
            (FenceId(1), vec![ConnId(100)]),
            (FenceId(2), vec![ConnId(200)])
        ]
    );
    h.e.set_enabled(h.now, PathId(1), true);
    h.sent.clear();
    // The first fence's confirmation re-sends the first failure's writes
    // only: the second's stay held until connection 200 is fenced.
    h.e.fence_done(h.now, FenceId(1));
    h.pump();
    assert!(h.e.fence_pending(FenceId(2)) && !h.e.fence_pending(FenceId(1)));
    let first: Vec<u64> = h.sent.iter().map(|s| s.offset).collect();
    assert!(
        !first.is_empty() && first.iter().all(|o| *o < 1 << 20),
        "{first:?}"
    );
    h.sent.clear();
    h.e.fence_done(h.now, FenceId(2));
    h.pump();
    let second: Vec<u64> = h.sent.iter().map(|s| s.offset).collect();
    assert!(
        !second.is_empty() && second.iter().all(|o| *o >= 8 << 20),
        "{second:?}"
    );
    // A fence confirmed twice changes nothing.
    h.sent.clear();
    h.e.fence_done(h.now, FenceId(2));
    h.pump();
    assert!(h.sent.is_empty());
    assert_eq!(h.e.volume_counters().fences, 2);
}

#[test]
fn a_newer_write_waits_for_the_fence_of_an_older_write_that_timed_out() {
    let cfg = EngineConfig {
        no_path_timeout: Some(Duration::from_secs(5)),
        ..EngineConfig::default()
    };
    let mut h = Harness::new("round-robin", 2, cfg);
    h.e.set_enabled(h.now, PathId(1), false);
    let old = h.submit(Op::Write, 0, 4096);
    h.e.path_failed(h.now, PathId(0), "reset");
    h.pump();
    h.e.set_enabled(h.now, PathId(1), true);
    // The fence never answers: the held write fails after the no-path
    // timeout, but a stale copy of it may still land on the target.
    h.advance(Duration::from_secs(6));
    assert!(matches!(h.done[&old], Err(IoError::NoPath(_))));
    assert!(h.e.fence_pending(FenceId(1)), "the fence is still wanted");
    h.sent.clear();
    let newer = h.submit(Op::Write, 0, 4096);
    assert!(
        h.sent.is_empty(),
        "a write over the unsettled range went out before the fence"
    );
    let elsewhere = h.submit(Op::Write, 1 << 20, 4096);
    assert_eq!(h.sent.len(), 1, "a write elsewhere goes at once");
    h.e.fence_done(h.now, FenceId(1));
    h.pump();
    assert_eq!(h.sent.len(), 2, "the fence lets the newer write go");
    h.reply_all(true);
    assert_eq!(h.done[&newer], Ok(()));
    assert_eq!(h.done[&elsewhere], Ok(()));
}
