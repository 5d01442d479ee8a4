//! Scenario tests of the engine, driven by hand with a virtual clock.

use std::collections::HashMap;
use std::time::Duration;

use braid_block::{Error, ErrorKind, Flags};
use braid_policy::{by_name, PolicyOptions};
use braid_proto::braid_ns::ConnId;
use braid_proto::Cookie;

use super::*;

/// A request of `op` without flags; a WRITE carries zeroes.
pub(crate) fn request(op: Op, offset: u64, len: u64) -> Submit {
    match op {
        Op::Write => Submit::write(
            offset,
            Flags::empty(),
            Payload::new(bytes::Bytes::from(vec![0; len as usize])),
        ),
        _ => Submit::new(op, offset, len, Flags::empty()),
    }
}

pub(crate) struct Harness {
    pub(crate) e: Engine,
    pub(crate) now: Duration,
    pub(crate) sent: Vec<SendChunk>,
    pub(crate) done: HashMap<ReqId, Result<(), IoError>>,
    pub(crate) log: Vec<Action>,
}

impl Harness {
    pub(crate) fn new(policy: &str, paths: usize, cfg: EngineConfig) -> Self {
        let mut e = Engine::new(
            EngineConfig {
                size: 1 << 30,
                ..cfg
            },
            by_name(policy, &PolicyOptions::default()).unwrap(),
        );
        for _ in 0..paths {
            let p = e.add_path(PathConfig::default(), Duration::ZERO);
            e.path_up(
                Duration::ZERO,
                p,
                vec![Some(ConnId(p.0 as u128 + 100))],
                true,
            );
        }
        let mut h = Self {
            e,
            now: Duration::ZERO,
            sent: Vec::new(),
            done: HashMap::new(),
            log: Vec::new(),
        };
        h.pump();
        h.log.clear();
        h
    }

    pub(crate) fn pump(&mut self) {
        while let Some(a) = self.e.poll_action() {
            match &a {
                Action::Send(s) => self.sent.push(s.clone()),
                Action::Complete { req, result } => {
                    assert!(
                        self.done.insert(*req, result.clone()).is_none(),
                        "request {req:?} completed twice"
                    );
                }
                _ => {}
            }
            self.log.push(a);
        }
    }

    pub(crate) fn submit(&mut self, op: Op, offset: u64, len: u64) -> ReqId {
        let id = self.e.submit(self.now, request(op, offset, len));
        self.pump();
        id
    }

    pub(crate) fn reply_all(&mut self, ok: bool) {
        let sent = std::mem::take(&mut self.sent);
        for s in sent {
            let outcome = if ok {
                Ok(())
            } else {
                Err(Error::new(ErrorKind::Io, "bad"))
            };
            self.e.reply(self.now, s.cookie, outcome);
        }
        self.pump();
    }

    pub(crate) fn advance(&mut self, d: Duration) {
        self.now += d;
        self.e.tick(self.now);
        self.pump();
    }

    fn paths_used(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.sent.iter().map(|s| s.path.0).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

#[test]
fn one_path_read_completes_on_its_reply() {
    let mut h = Harness::new("adaptive", 1, EngineConfig::default());
    let r = h.submit(Op::Read, 0, 4096);
    assert_eq!(h.sent.len(), 1);
    assert!(h.done.is_empty());
    h.reply_all(true);
    assert_eq!(h.done[&r], Ok(()));
}

#[test]
fn large_request_at_depth_one_uses_every_path() {
    for policy in [
        "adaptive",
        "round-robin",
        "least-queue-depth",
        "service-time",
    ] {
        let mut h = Harness::new(policy, 2, EngineConfig::default());
        let r = h.submit(Op::Read, 0, 1 << 20);
        assert_eq!(h.paths_used(), vec![0, 1], "{policy}");
        let total: u64 = h.sent.iter().map(|s| u64::from(s.len)).sum();
        assert_eq!(total, 1 << 20);
        h.reply_all(true);
        assert_eq!(h.done[&r], Ok(()));
    }
}

#[test]
fn a_paths_share_of_a_write_goes_as_consecutive_pieces() {
    let mut h = Harness::new("adaptive", 2, EngineConfig::default());
    let w = h.submit(Op::Write, 1 << 20, 1 << 20);
    assert_eq!(h.paths_used(), vec![0, 1]);
    for path in [0, 1] {
        let mut mine: Vec<&SendChunk> = h.sent.iter().filter(|s| s.path.0 == path).collect();
        mine.sort_by_key(|s| s.offset);
        assert!(mine.len() > 1, "path {path} got its share in one request");
        for pair in mine.windows(2) {
            assert_eq!(pair[0].offset + u64::from(pair[0].len), pair[1].offset);
        }
        assert!(mine.iter().all(|s| u64::from(s.len) <= WRITE_PIECE));
    }
    let mut all: Vec<(u64, u64)> = h
        .sent
        .iter()
        .map(|s| (s.offset, u64::from(s.len)))
        .collect();
    all.sort_unstable();
    let mut at = 1 << 20;
    for (offset, len) in all {
        assert_eq!(offset, at, "pieces cover the request once, in order");
        at += len;
    }
    assert_eq!(at, 2 << 20);
    h.reply_all(true);
    assert_eq!(h.done[&w], Ok(()));
    // A read's share stays one request per path.
    let r = h.submit(Op::Read, 0, 1 << 20);
    assert_eq!(h.sent.len(), 2);
    h.reply_all(true);
    assert_eq!(h.done[&r], Ok(()));
}

#[test]
fn failover_policy_keeps_standby_idle() {
    let mut h = Harness::new("failover", 2, EngineConfig::default());
    h.submit(Op::Write, 0, 4 << 20);
    assert_eq!(h.paths_used(), vec![0]);
}

#[test]
fn request_completes_once_all_chunks_have_with_the_first_error() {
    let mut h = Harness::new("round-robin", 2, EngineConfig::default());
    let r = h.submit(Op::Write, 0, 1 << 20);
    let sent = std::mem::take(&mut h.sent);
    assert!(sent.len() > 1);
    h.e.reply(
        h.now,
        sent[0].cookie,
        Err(Error::new(ErrorKind::NoSpace, "full")),
    );
    h.pump();
    for s in &sent[1..sent.len() - 1] {
        h.e.reply(h.now, s.cookie, Ok(()));
    }
    h.pump();
    assert!(h.done.is_empty(), "completed before its last chunk");
    h.e.reply(h.now, sent.last().unwrap().cookie, Ok(()));
    h.pump();
    assert!(matches!(
        h.done[&r],
        Err(IoError::Target {
            kind: ErrorKind::NoSpace,
            ..
        })
    ));
}

#[test]
fn failover_resends_inflight_read_on_surviving_path() {
    let mut h = Harness::new("round-robin", 2, EngineConfig::default());
    let r = h.submit(Op::Read, 0, 1 << 20);
    let on_path0: Vec<Cookie> = h
        .sent
        .iter()
        .filter(|s| s.path.0 == 0)
        .map(|s| s.cookie)
        .collect();
    assert!(!on_path0.is_empty());
    h.e.path_failed(h.now, PathId(0), "socket closed");
    h.pump();
    assert!(h.log.contains(&Action::Close { path: PathId(0) }));
    // Replies from the dead path no longer count.
    for c in on_path0 {
        h.e.reply(h.now, c, Ok(()));
    }
    h.pump();
    assert!(h.done.is_empty());
    let resent: Vec<&SendChunk> = h.sent.iter().filter(|s| s.path.0 == 1).collect();
    assert!(!resent.is_empty());
    h.reply_all(true);
    assert_eq!(h.done[&r], Ok(()));
}

#[test]
fn silent_path_is_failed_after_its_timeout() {
    let cfg = EngineConfig {
        timeout_floor: Duration::from_millis(300),
        timeout_ceiling: Duration::from_secs(2),
        ..EngineConfig::default()
    };
    let mut h = Harness::new("round-robin", 2, cfg);
    h.submit(Op::Read, 0, 1 << 20);
    // Path 1 answers, path 0 stays silent.
    let sent = std::mem::take(&mut h.sent);
    for s in sent.iter().filter(|s| s.path.0 == 1) {
        h.e.reply(h.now, s.cookie, Ok(()));
    }
    h.pump();
    h.advance(Duration::from_millis(200));
    assert_eq!(h.e.path_state(PathId(0)), PathState::Active);
    h.advance(Duration::from_millis(200));
    assert_eq!(h.e.path_state(PathId(0)), PathState::Failed);
    assert!(h.log.iter().any(|a| matches!(
        a,
        Action::Event(Event::PathFailed { reason, .. }) if reason.starts_with("no reply in")
    )));
}

#[test]
fn volume_counters_count_each_failed_request_once_by_kind() {
    let mut h = Harness::new("round-robin", 2, EngineConfig::default());
    for kind in [ErrorKind::NoSpace, ErrorKind::Io] {
        h.submit(Op::Write, 0, 1 << 20);
        let sent = std::mem::take(&mut h.sent);
        assert!(sent.len() > 1, "the write is split over both paths");
        for s in &sent {
            // Every chunk fails: still one failed request.
            h.e.reply(h.now, s.cookie, Err(Error::new(kind, "no")));
        }
        h.pump();
    }
    h.submit(Op::Read, 0, 4096);
    h.reply_all(true);
    let c = h.e.volume_counters();
    assert_eq!(c.errors_returned, 2);
    assert_eq!(c.eio_returned, 1);
    assert_eq!(c.no_path_timeouts, 0);
}

#[test]
fn flush_waits_for_earlier_writes() {
    let mut h = Harness::new("round-robin", 2, EngineConfig::default());
    let w = h.submit(Op::Write, 0, 8192);
    let writes = std::mem::take(&mut h.sent);
    let f = h.submit(Op::Flush, 0, 0);
    assert!(
        h.sent.is_empty(),
        "flush sent with an earlier write unacknowledged"
    );
    for s in writes {
        h.e.reply(h.now, s.cookie, Ok(()));
    }
    h.pump();
    assert_eq!(h.done[&w], Ok(()));
    assert_eq!(h.sent.len(), 1);
    assert_eq!(h.sent[0].op, Op::Flush);
    // A write submitted after the flush does not hold it.
    let _later = h.submit(Op::Write, 0, 4096);
    let flush_cookie = h.sent[0].cookie;
    h.e.reply(h.now, flush_cookie, Ok(()));
    h.pump();
    assert_eq!(h.done[&f], Ok(()));
}

#[test]
fn idle_paths_are_probed() {
    let mut h = Harness::new("adaptive", 2, EngineConfig::default());
    h.advance(Duration::from_millis(1500));
    let probes: Vec<&SendChunk> = h.sent.iter().filter(|s| s.req.is_none()).collect();
    assert_eq!(probes.len(), 2);
    assert!(probes.iter().all(|p| p.op == Op::Read && p.len >= 1));
    h.reply_all(true);
    assert!(h.done.is_empty());
    let c = h.e.path_report(PathId(0), h.now).counters;
    assert_eq!(
        (c.reads, c.read_bytes, c.others),
        (0, 0, 1),
        "probes are not data"
    );
}

#[test]
fn reconnects_back_off_to_the_cap() {
    let cfg = EngineConfig {
        reconnect_min: Duration::from_millis(100),
        reconnect_max: Duration::from_millis(700),
        reconnect_fast_attempts: 6,
        reconnect_slow_max: Duration::from_secs(5),
        ..EngineConfig::default()
    };
    let mut h = Harness::new("adaptive", 1, cfg);
    h.e.path_failed(h.now, PathId(0), "down");
    for _ in 0..9 {
        h.e.reconnect_failed(PathId(0));
    }
    h.pump();
    let delays: Vec<u64> = h
        .log
        .iter()
        .filter_map(|a| match a {
            Action::Reconnect { after, .. } => Some(after.as_millis() as u64),
            _ => None,
        })
        .collect();
    // Fast while a pulled cable may come back, then slower and slower up
    // to the slow cap: an unreachable portal is not dialled twice a second
    // forever.
    assert_eq!(
        delays,
        vec![100, 200, 400, 700, 700, 700, 1400, 2800, 5000, 5000]
    );
}

#[test]
fn disabled_paths_get_nothing_new() {
    let mut h = Harness::new("round-robin", 2, EngineConfig::default());
    h.e.set_enabled(h.now, PathId(1), false);
    assert_eq!(h.e.path_state(PathId(1)), PathState::Disabled);
    h.submit(Op::Read, 0, 4 << 20);
    assert_eq!(h.paths_used(), vec![0]);
    h.e.set_enabled(h.now, PathId(1), true);
    h.sent.clear();
    h.submit(Op::Read, 0, 4 << 20);
    assert_eq!(h.paths_used(), vec![0, 1]);
}

#[test]
fn counters_follow_completed_chunks() {
    let mut h = Harness::new("round-robin", 2, EngineConfig::default());
    h.submit(Op::Write, 0, 1 << 20);
    h.submit(Op::Read, 0, 1 << 20);
    h.reply_all(true);
    let a = h.e.path_report(PathId(0), h.now).counters;
    let b = h.e.path_report(PathId(1), h.now).counters;
    assert_eq!(a.written_bytes + b.written_bytes, 1 << 20);
    assert_eq!(a.read_bytes + b.read_bytes, 1 << 20);
    assert!(a.writes > 0 && b.writes > 0);
}

#[test]
fn requests_wait_for_the_first_reply_while_no_path_is_measured() {
    let mut h = Harness::new("adaptive", 2, EngineConfig::default());
    let first = h.submit(Op::Read, 0, 1 << 20);
    assert_eq!(h.paths_used(), vec![0, 1], "the first request probes both");
    let held: Vec<ReqId> = (1..4)
        .map(|i| h.submit(Op::Read, i << 20, 1 << 20))
        .collect();
    assert_eq!(h.sent.len(), 2, "the rest wait: both paths' speeds unknown");
    // Path 1 answers after 5 ms and is measured; path 0 is still silent.
    h.now += Duration::from_millis(5);
    let (fast, slow): (Vec<SendChunk>, Vec<SendChunk>) = std::mem::take(&mut h.sent)
        .into_iter()
        .partition(|s| s.path.0 == 1);
    h.e.reply(h.now, fast[0].cookie, Ok(()));
    h.pump();
    let mut covered: Vec<(u64, u32)> = h.sent.iter().map(|s| (s.offset, s.len)).collect();
    covered.sort_unstable();
    assert!(
        h.sent.iter().all(|s| s.path.0 == 1),
        "nothing more for path 0 yet"
    );
    let mut at = 1 << 20;
    for (offset, len) in covered {
        assert_eq!(offset, at, "held requests go out whole, in order");
        at += u64::from(len);
    }
    assert_eq!(at, 4 << 20);
    h.sent.extend(slow);
    h.reply_all(true);
    for id in std::iter::once(first).chain(held) {
        assert_eq!(h.done[&id], Ok(()));
    }
}

/// A busy path with a late reply: the kernel says whether its peer still
/// answers, and that decides between waiting (a slow disk) and failing it
/// (a dead link), where the reply's lateness alone used to fail both.
fn late_reply_with_kernel(alive: bool) -> Harness {
    let cfg = EngineConfig {
        timeout_floor: Duration::from_millis(300),
        timeout_ceiling: Duration::from_secs(2),
        slow_reply_min: Duration::from_secs(10),
        slow_reply_max: Duration::from_secs(20),
        ..EngineConfig::default()
    };
    let mut h = Harness::new("round-robin", 1, cfg);
    h.submit(Op::Flush, 0, 0);
    for _ in 0..20 {
        // No byte moves (a full peer, or a dead one): the kernel decides.
        let health = KernelHealth {
            stalled: !alive,
            window_closed: true,
            last_ack: Duration::from_secs(5),
        };
        h.e.wire(h.now, PathId(0), 1000, None, health);
        h.advance(Duration::from_millis(100));
    }
    h
}

#[test]
fn a_slow_reply_on_a_live_connection_is_waited_for() {
    let mut h = late_reply_with_kernel(true);
    assert_eq!(
        h.e.path_state(PathId(0)),
        PathState::Active,
        "2 s is slow, not dead"
    );
    assert!(
        h.sent.iter().any(|s| s.req.is_none()),
        "a liveness probe went out"
    );
    // Past its patience (10 s here) even a live connection is given up.
    for _ in 0..100 {
        let health = KernelHealth {
            window_closed: true,
            ..KernelHealth::default()
        };
        h.e.wire(h.now, PathId(0), 2000, None, health);
        h.advance(Duration::from_millis(100));
    }
    assert_eq!(h.e.path_state(PathId(0)), PathState::Failed);
    assert!(h.log.iter().any(|a| matches!(
        a,
        Action::Event(Event::PathFailed { reason, .. }) if reason.contains("connection answers")
    )));
}

#[test]
fn a_late_reply_on_a_connection_the_peer_no_longer_answers_fails_the_path() {
    let h = late_reply_with_kernel(false);
    assert_eq!(h.e.path_state(PathId(0)), PathState::Failed);
    assert!(h.log.iter().any(|a| matches!(
        a,
        Action::Event(Event::PathFailed { reason, .. }) if reason.contains("does not answer")
    )));
}

/// A busy path's reply limit can shrink at once: writes re-sent from a
/// failed path land on it, the kernel measures its link fast, and the
/// limit falls below the silence already counted since its last reply (a
/// disk that takes 2 s a write). The probe that goes out then must be given
/// the time a probe is always given, not one tick: the peer's ACK of it
/// comes a round trip later, on a live path. Seen in the lab as a slow,
/// live path failed 37 ms after taking a blackholed path's writes, and the
/// copy's EIO.
#[test]
fn a_probe_sent_once_the_limit_shrank_is_given_its_time() {
    let mut h = Harness::new("round-robin", 1, EngineConfig::default());
    for i in 0..8 {
        h.submit(Op::Write, i << 20, 1 << 20);
    }
    let tick = Duration::from_millis(30);
    let health = |last_ack_ms: u64| KernelHealth {
        last_ack: Duration::from_millis(last_ack_ms),
        ..KernelHealth::default()
    };
    // 1.4 s with the path full and its peer taking a few bytes a tick.
    let mut bytes = 1u64 << 20;
    while h.now < Duration::from_millis(1400) {
        bytes += 300;
        h.e.wire(h.now, PathId(0), bytes, None, health(0));
        h.advance(tick);
    }
    assert!(
        !h.sent.iter().any(|s| s.req.is_none()),
        "no probe yet: the limit was long"
    );
    // The re-sent writes' 8 MiB go out in one tick; then, for a few ticks,
    // the kernel shows nothing newer until the probe's ACK comes.
    bytes += 8 << 20;
    h.e.wire(h.now, PathId(0), bytes, None, health(0));
    h.advance(tick);
    let probed = h.now;
    for _ in 0..3 {
        let since = (h.now - probed).as_millis() as u64;
        h.e.wire(h.now, PathId(0), bytes, None, health(since + 30));
        h.advance(tick);
    }
    h.e.wire(h.now, PathId(0), bytes + 100, None, health(5));
    h.advance(tick);
    assert!(
        h.sent.iter().any(|s| s.req.is_none()),
        "a liveness probe went out"
    );
    assert_eq!(
        h.e.path_state(PathId(0)),
        PathState::Active,
        "a live path failed before its probe could be answered: {:?}",
        h.log
            .iter()
            .filter(|a| matches!(a, Action::Event(Event::PathFailed { .. })))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_full_path_is_skipped_and_what_no_path_has_room_for_waits_in_order() {
    for policy in braid_policy::NAMES {
        let mut h = Harness::new(policy, 0, EngineConfig::default());
        for (i, depth) in [1u32, 3].into_iter().enumerate() {
            let p = h.e.add_path(
                PathConfig {
                    queue_depth: depth,
                    ..PathConfig::default()
                },
                Duration::ZERO,
            );
            h.e.path_up(Duration::ZERO, p, vec![Some(ConnId(i as u128))], true);
        }
        h.pump();
        h.sent.clear();
        let reqs: Vec<ReqId> = (0..10)
            .map(|i| h.submit(Op::Read, i * 4096, 4096))
            .collect();
        let on = |h: &Harness, p: usize| h.sent.iter().filter(|s| s.path.0 == p).count();
        assert!(on(&h, 0) <= 1 && on(&h, 1) <= 3, "{policy}: {:?}", h.sent);
        assert_eq!(h.sent.len(), 4, "{policy}: every slot used, the rest wait");
        // Replies free slots; the backlog goes in order, never past a depth.
        let mut answered = 0;
        while answered < 10 {
            let s = h.sent.remove(0);
            h.e.reply(h.now, s.cookie, Ok(()));
            h.pump();
            answered += 1;
            assert!(on(&h, 0) <= 1 && on(&h, 1) <= 3, "{policy}: {:?}", h.sent);
        }
        for r in reqs {
            assert_eq!(h.done[&r], Ok(()), "{policy}");
        }
        for p in 0..2 {
            let max = h.e.path_report(PathId(p), h.now).counters.max_inflight;
            assert!(max <= [1, 3][p], "{policy}: path {p} held {max}");
        }
    }
}
