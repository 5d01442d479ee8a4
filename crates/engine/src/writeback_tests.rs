//! The engine's own FLUSHes, in the shapes clients that never flush send:
//! 1 MiB writes split over two paths, none of them followed by a FLUSH.

use std::time::Duration;

use braid_block::Flags;
use bytes::Bytes;

use super::restart_tests::up;
use super::tests::Harness;
use super::*;

const MIB: u64 = 1 << 20;

/// Two paths to instance 1, and a window of `entries` 1 MiB writes.
fn harness(entries: u64) -> Harness {
    let cfg = EngineConfig {
        replay_window: entries * (MIB + window::ENTRY_COST),
        ..EngineConfig::default()
    };
    let mut h = Harness::new("round-robin", 0, cfg);
    for i in 0..2 {
        let p = h.e.add_path(PathConfig::default(), Duration::ZERO);
        up(&mut h, p, 100 + i, Instance::Known(1));
    }
    h.log.clear();
    h
}

/// A 1 MiB write of `v` at MiB `at`.
fn write(h: &mut Harness, at: u64, v: u8) -> ReqId {
    let data = Bytes::from(vec![v; MIB as usize]);
    let id = h.e.submit(
        h.now,
        Submit::write(at * MIB, Flags::empty(), Payload::new(data)),
    );
    h.pump();
    id
}

/// Answers what was sent, and what that lets go, except FLUSHes when
/// `flushes` is false (those stay out, in `h.sent`).
fn answer(h: &mut Harness, flushes: bool) {
    for _ in 0..1000 {
        let sent = std::mem::take(&mut h.sent);
        let (now, kept): (Vec<_>, Vec<_>) =
            sent.into_iter().partition(|s| flushes || s.op != Op::Flush);
        h.sent = kept;
        if now.is_empty() {
            return;
        }
        for s in now {
            h.e.reply(h.now, s.cookie, Ok(()));
        }
        h.pump();
    }
    panic!("chunks kept coming");
}

/// Three 1 MiB writes into a window of four, acknowledged, and the
/// engine's FLUSH they brought still out.
fn three_written() -> Harness {
    let mut h = harness(4);
    for i in 0..3 {
        write(&mut h, i, 1);
    }
    answer(&mut h, false);
    h
}

/// Both paths reset, and path 0 back at a restarted target (instance 2),
/// nothing it was sent before the reset answered.
fn restart_on_path_0(h: &mut Harness) {
    for i in 0..2 {
        h.e.path_failed(h.now, PathId(i), "connection reset");
    }
    h.pump();
    h.sent.clear();
    up(h, PathId(0), 200, Instance::Known(2));
}

fn flushes_sent(h: &Harness) -> usize {
    h.log
        .iter()
        .filter(|a| matches!(a, Action::Send(s) if s.op == Op::Flush))
        .count()
}

/// VMware's shape: writes and never a FLUSH, many times the window. The
/// engine flushes on its own, so the window never lets a write go, and a
/// restart afterwards is replayed whole: nothing is lost.
#[test]
fn a_client_that_never_flushes_keeps_the_window_whole() {
    let mut h = harness(8);
    for i in 0..64 {
        write(&mut h, i % 48, i as u8);
        answer(&mut h, true);
        assert!(
            !h.e.replay_report().overflowed,
            "the window let writes go after {} MiB with no FLUSH",
            i + 1
        );
    }
    assert!(
        flushes_sent(&h) >= 8,
        "the engine flushed: {}",
        flushes_sent(&h)
    );
    assert!(h.done.values().all(Result::is_ok), "{:?}", h.done);
    let kept = h.e.replay_report().window_bytes;
    assert!(kept > 0 && kept <= 8 * MIB, "{kept}");
    // The target restarts: what the window held is written again, and
    // the caller's first FLUSH succeeds.
    restart_on_path_0(&mut h);
    answer(&mut h, true);
    assert_eq!(
        h.e.volume_counters().replay_bytes,
        kept,
        "the replay gives back the whole window"
    );
    let f = h.submit(Op::Flush, 0, 0);
    answer(&mut h, true);
    assert_eq!(h.done[&f], Ok(()));
    assert!(h.e.replay_report().lost.is_none());
    assert_eq!(h.e.volume_counters().writeback_failures, 0);
}

/// While the engine's FLUSH is out, writes that would take the window past
/// its limit wait for it, in order, rather than make it let older ones go;
/// once it is answered they go.
#[test]
fn writes_past_the_limit_wait_for_the_engines_flush() {
    let mut h = harness(4);
    let ids: Vec<ReqId> = (0..12).map(|i| write(&mut h, i, i as u8)).collect();
    answer(&mut h, false);
    assert_eq!(flushes_sent(&h), 1, "one FLUSH of the engine's is out");
    assert!(!h.e.replay_report().overflowed);
    let waiting: Vec<_> = ids.iter().filter(|id| !h.done.contains_key(id)).collect();
    assert!(!waiting.is_empty(), "writes past the limit wait");
    assert!(
        ids.iter()
            .take(ids.len() - waiting.len())
            .all(|id| h.done.contains_key(id)),
        "the ones that wait are the last ones"
    );
    answer(&mut h, true);
    assert!(ids.iter().all(|id| h.done[id].is_ok()), "{:?}", h.done);
    assert!(!h.e.replay_report().overflowed);
}

/// A restart seen while the engine's FLUSH is out (told late, on a path
/// already at the new target): that FLUSH's answer says nothing of what
/// the old target lost, so the window keeps it all for the replay, and
/// for a restart after that.
#[test]
fn an_engine_flush_out_across_a_restart_does_not_empty_the_window() {
    let mut h = harness(4);
    for i in 0..3 {
        write(&mut h, i, i as u8 + 1);
    }
    answer(&mut h, false);
    assert_eq!(flushes_sent(&h), 1);
    let before = h.e.replay_report().window_bytes;
    assert_eq!(before, 3 * MIB);
    h.e.restart_signalled(h.now, PathId(0), "a power on, told late");
    h.pump();
    answer(&mut h, true);
    assert_eq!(
        h.e.replay_report().window_bytes,
        before,
        "the window still holds what the old target acknowledged"
    );
}

/// A FLUSH of the engine's that fails loses nothing: the window keeps what
/// it covered, and another is tried after a while.
#[test]
fn a_failed_engine_flush_is_tried_again_later() {
    let mut h = three_written();
    let flush = h.sent.pop().expect("the engine's FLUSH");
    assert_eq!(flush.op, Op::Flush);
    h.e.reply(
        h.now,
        flush.cookie,
        Err(braid_block::Error::new(braid_block::ErrorKind::Io, "bad")),
    );
    h.pump();
    assert_eq!(h.e.volume_counters().writeback_failures, 1);
    assert!(
        h.log.iter().any(|a| matches!(a,
            Action::Event(Event::WritebackFailed { error, retry })
                if error.contains("bad") && *retry == writeback::RETRY)),
        "the failure is told, with the target's error: {:?}",
        h.log
    );
    assert_eq!(h.e.replay_report().window_bytes, 3 * MIB);
    write(&mut h, 3, 1);
    answer(&mut h, true);
    assert_eq!(flushes_sent(&h), 1, "not at once");
    h.advance(writeback::RETRY);
    write(&mut h, 0, 2);
    answer(&mut h, true);
    assert_eq!(flushes_sent(&h), 2, "again, a while later");
    assert!(h.e.replay_report().window_bytes < 3 * MIB);
    assert!(h.done.values().all(Result::is_ok), "no caller saw it");
}

/// Fails the engine's FLUSH out (the last one sent); the retry it told.
fn fail_flush(h: &mut Harness) -> Duration {
    let at = h.sent.iter().rposition(|s| s.op == Op::Flush);
    let flush = h.sent.remove(at.expect("the engine's FLUSH out"));
    h.log.clear();
    let error = braid_block::Error::new(braid_block::ErrorKind::Io, "bad");
    h.e.reply(h.now, flush.cookie, Err(error));
    h.pump();
    h.log
        .iter()
        .find_map(|a| match a {
            Action::Event(Event::WritebackFailed { retry, .. }) => Some(*retry),
            _ => None,
        })
        .expect("the failure is told")
}

/// A target whose every FLUSH fails is asked again ever more rarely (each
/// failure a WARN in the log), up to [`writeback::RETRY_MAX`]; one that
/// succeeds starts the count again.
#[test]
fn failed_engine_flushes_back_off_by_doubling_and_a_success_resets_it() {
    let mut h = three_written();
    let mut waits = Vec::new();
    for round in 0..8 {
        let wait = fail_flush(&mut h);
        waits.push(wait);
        h.advance(wait - Duration::from_millis(1));
        write(&mut h, 3, round);
        answer(&mut h, false);
        assert_eq!(
            h.sent.iter().filter(|s| s.op == Op::Flush).count(),
            0,
            "none before the wait told ({wait:?}) is over"
        );
        h.advance(Duration::from_millis(1));
        write(&mut h, 3, round);
        answer(&mut h, false);
    }
    let s = Duration::from_secs;
    assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30].map(s));
    assert_eq!(writeback::RETRY_MAX, s(30));
    // The FLUSH out now succeeds; the next failure waits the first wait.
    answer(&mut h, true);
    for i in 0..3 {
        write(&mut h, i, 9);
    }
    answer(&mut h, false);
    assert_eq!(fail_flush(&mut h), writeback::RETRY);
    assert!(
        h.done.values().all(Result::is_ok),
        "no caller saw any of it"
    );
}

/// A restart ends the wait that failed FLUSHes built up: the new target
/// is asked as soon as the window is full enough again.
#[test]
fn a_restart_ends_the_wait_after_failed_engine_flushes() {
    let mut h = three_written();
    for _ in 0..5 {
        let wait = fail_flush(&mut h);
        h.advance(wait);
        write(&mut h, 3, 1);
        answer(&mut h, false);
    }
    let wait = fail_flush(&mut h);
    assert_eq!(wait, Duration::from_secs(30));
    restart_on_path_0(&mut h);
    answer(&mut h, false);
    write(&mut h, 0, 2);
    answer(&mut h, false);
    assert!(
        h.sent.iter().any(|s| s.op == Op::Flush),
        "the new target is asked at once, not after {wait:?}"
    );
}
