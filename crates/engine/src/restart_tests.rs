//! Scenario tests of a target restart, driven by hand: what a restart
//! sends again, what it holds back, and when a loss is reported.

use std::time::Duration;

use braid_block::{Error, ErrorKind, Flags};
use braid_proto::braid_ns::ConnId;
use bytes::Bytes;

use super::tests::{request, Harness};
use super::*;

/// A harness whose paths named instance 1 when they came up.
fn harness(paths: usize) -> Harness {
    let mut h = Harness::new("round-robin", 0, EngineConfig::default());
    for i in 0..paths {
        let p = h.e.add_path(PathConfig::default(), Duration::ZERO);
        up(&mut h, p, i as u128 + 100, Instance::Known(1));
    }
    h.pump();
    h.log.clear();
    h
}

pub(crate) fn up(h: &mut Harness, p: PathId, conn: u128, instance: Instance) {
    h.e.path_up_with(h.now, p, vec![Some(ConnId(conn))], true, instance);
    h.pump();
}

fn write(h: &mut Harness, offset: u64, len: u64, v: u8, flags: Flags) -> ReqId {
    let s = Submit::write(
        offset,
        flags,
        Payload::new(Bytes::from(vec![v; len as usize])),
    );
    let id = h.e.submit(h.now, s);
    h.pump();
    id
}

/// Answers the chunks sent so far, oldest first.
fn answer_round(h: &mut Harness) {
    let sent = std::mem::take(&mut h.sent);
    for s in sent {
        h.e.reply(h.now, s.cookie, Ok(()));
    }
    h.pump();
}

/// Answers every chunk sent, oldest first, and what those let go.
fn answer_all(h: &mut Harness) {
    for _ in 0..100 {
        let sent = std::mem::take(&mut h.sent);
        if sent.is_empty() {
            return;
        }
        for s in sent {
            h.e.reply(h.now, s.cookie, Ok(()));
        }
        h.pump();
    }
    panic!("chunks kept coming");
}

/// The target restarts: both paths fail, then path 0 comes back to
/// instance 2.
fn restart(h: &mut Harness, paths: usize) {
    for i in 0..paths {
        h.e.path_failed(h.now, PathId(i), "connection reset");
    }
    h.pump();
    h.sent.clear();
    up(h, PathId(0), 200, Instance::Known(2));
}

fn restarts(h: &Harness) -> u64 {
    h.e.volume_counters().restarts
}

/// The bytes of every WRITE sent since `from`, as (offset, first byte).
fn writes_sent(h: &Harness) -> Vec<(u64, u32, u8)> {
    h.sent
        .iter()
        .filter(|s| s.op == Op::Write)
        .map(|s| (s.offset, s.len, s.payload.as_ref().map_or(0, |p| p[0])))
        .collect()
}

#[test]
fn a_split_write_answered_in_part_by_the_old_target_goes_again_whole() {
    let mut h = harness(2);
    let w = write(&mut h, 0, 1 << 20, 7, Flags::empty());
    let pieces = h.sent.len();
    assert!(pieces > 2, "a MiB goes in pieces");
    // The old target answers half of the pieces, then dies.
    let sent = std::mem::take(&mut h.sent);
    for s in &sent[..pieces / 2] {
        h.e.reply(h.now, s.cookie, Ok(()));
    }
    h.pump();
    assert!(!h.done.contains_key(&w));
    restart(&mut h, 2);
    answer_all(&mut h);
    let mut covered: Vec<(u64, u32, u8)> = h
        .log
        .iter()
        .filter_map(|a| match a {
            Action::Send(s) if s.op == Op::Write && s.path == PathId(0) => {
                Some((s.offset, s.len, s.payload.as_ref().map_or(0, |p| p[0])))
            }
            _ => None,
        })
        .collect();
    covered.sort_unstable();
    covered.dedup();
    let total: u64 = covered.iter().map(|(_, l, _)| u64::from(*l)).sum();
    assert_eq!(
        total,
        1 << 20,
        "every piece went to the new target: {covered:?}"
    );
    assert!(covered.iter().all(|(_, _, v)| *v == 7));
    assert_eq!(h.done[&w], Ok(()));
}

#[test]
fn the_window_is_written_again_before_anything_new_and_reads_wait_for_it() {
    let mut h = harness(1);
    write(&mut h, 0, 8192, 1, Flags::empty());
    answer_all(&mut h);
    let r = h.submit(Op::Read, 0, 4096);
    // The read is out when the target restarts; another comes after.
    h.e.path_failed(h.now, PathId(0), "reset");
    h.pump();
    h.sent.clear();
    up(&mut h, PathId(0), 200, Instance::Known(2));
    let r2 = h.submit(Op::Read, 4096, 4096);
    assert_eq!(
        writes_sent(&h),
        vec![(0, 8192, 1)],
        "only the replay goes first"
    );
    assert!(h.sent.iter().all(|s| s.op == Op::Write), "{:?}", h.sent);
    answer_round(&mut h);
    // Now the reads.
    let reads: Vec<u64> = h
        .sent
        .iter()
        .filter(|s| s.op == Op::Read)
        .map(|s| s.offset)
        .collect();
    assert_eq!(reads, vec![0, 4096]);
    answer_all(&mut h);
    assert_eq!(h.done[&r], Ok(()));
    assert_eq!(h.done[&r2], Ok(()));
    assert!(h.log.iter().any(|a| matches!(
        a,
        Action::Event(Event::Replayed {
            bytes: 8192,
            failed: None,
            ..
        })
    )));
}

#[test]
fn zeroing_and_trims_are_replayed_as_such() {
    let mut h = harness(1);
    let z = h.e.submit(h.now, request(Op::WriteZeroes, 0, 65536));
    let t = h.e.submit(h.now, request(Op::Trim, 65536, 65536));
    h.pump();
    answer_all(&mut h);
    assert_eq!((h.done[&z].clone(), h.done[&t].clone()), (Ok(()), Ok(())));
    restart(&mut h, 1);
    let mut again: Vec<(Op, u64, u32)> = h.sent.iter().map(|s| (s.op, s.offset, s.len)).collect();
    again.sort_by_key(|a| a.1);
    assert_eq!(
        again,
        vec![(Op::WriteZeroes, 0, 65536), (Op::Trim, 65536, 65536)]
    );
}

#[test]
fn a_flush_out_at_a_restart_is_asked_again_after_the_replay() {
    let mut h = harness(1);
    write(&mut h, 0, 4096, 1, Flags::empty());
    answer_all(&mut h);
    let f = h.submit(Op::Flush, 0, 0);
    restart(&mut h, 1);
    assert!(h.sent.iter().all(|s| s.op == Op::Write), "the FLUSH waits");
    answer_round(&mut h);
    assert!(h.sent.iter().any(|s| s.op == Op::Flush), "asked again");
    answer_all(&mut h);
    assert_eq!(h.done[&f], Ok(()));
    assert_eq!(
        h.e.replay_report().window_bytes,
        0,
        "the FLUSH covered the replay"
    );
}

#[test]
fn a_restart_during_a_replay_starts_it_again_and_waits_for_its_writes() {
    let mut h = harness(1);
    write(&mut h, 0, 4096, 1, Flags::empty());
    write(&mut h, 8192, 4096, 2, Flags::empty());
    answer_all(&mut h);
    restart(&mut h, 1);
    let first = std::mem::take(&mut h.sent);
    assert_eq!(first.len(), 2);
    // One replay write answered by instance 2, which then dies too; the
    // other is out on the path that stays (a reset told late).
    h.e.reply(h.now, first[0].cookie, Ok(()));
    h.pump();
    h.e.restart_signalled(h.now, PathId(0), "reset");
    h.pump();
    assert_eq!(restarts(&h), 2);
    // The whole window goes again, and the old replay's last write is
    // waited for before anything new.
    let w = write(&mut h, 16384, 4096, 3, Flags::empty());
    assert_eq!(writes_sent(&h).len(), 2, "{:?}", h.sent);
    answer_all(&mut h);
    assert!(!h.done.contains_key(&w), "waits for the old replay's write");
    h.e.reply(h.now, first[1].cookie, Ok(()));
    h.pump();
    answer_all(&mut h);
    assert_eq!(h.done[&w], Ok(()));
    assert_eq!(
        h.e.replay_report().window_bytes,
        12288,
        "nothing punched out"
    );
}

#[test]
fn a_reset_a_second_path_is_told_of_is_the_restart_already_handled() {
    let mut h = harness(0);
    for i in 0..2 {
        let p = h.e.add_path(PathConfig::default(), Duration::ZERO);
        up(&mut h, p, 100 + i, Instance::Unknown);
    }
    write(&mut h, 0, 4096, 1, Flags::empty());
    answer_all(&mut h);
    restart_by_reset(&mut h);
    assert_eq!(restarts(&h), 1);
    // Path 1's new session is told of the same power on: it waits for
    // path 0 (up since the restart) to answer, and comes up.
    up(&mut h, PathId(1), 201, Instance::ResetSeen);
    assert_eq!(h.e.path_state(PathId(1)), PathState::Connecting);
    answer_all(&mut h);
    assert_eq!(h.e.path_state(PathId(1)), PathState::Active);
    assert_eq!(
        restarts(&h),
        1,
        "one restart, whatever the number of paths told"
    );
    assert!(h
        .log
        .iter()
        .any(|a| matches!(a, Action::Event(Event::RestartAlreadyHandled { .. }))));
}

#[test]
fn a_reset_no_witness_answers_is_a_new_restart() {
    let mut h = harness(0);
    for i in 0..2 {
        let p = h.e.add_path(PathConfig::default(), Duration::ZERO);
        up(&mut h, p, 100 + i, Instance::Unknown);
    }
    write(&mut h, 0, 4096, 1, Flags::empty());
    answer_all(&mut h);
    restart_by_reset(&mut h);
    answer_all(&mut h);
    up(&mut h, PathId(1), 201, Instance::ResetSeen);
    // Path 0 dies before it answers: the target restarted again.
    h.e.path_failed(h.now, PathId(0), "reset");
    h.pump();
    assert_eq!(restarts(&h), 2);
    assert_eq!(h.e.path_state(PathId(1)), PathState::Active);
    let replays = h
        .log
        .iter()
        .filter(|a| {
            matches!(
                a,
                Action::Event(Event::TargetRestarted {
                    replay_bytes: 4096,
                    ..
                })
            )
        })
        .count();
    assert_eq!(replays, 2, "replayed twice");
}

/// Both paths fail; path 0's new session is told of a power on.
fn restart_by_reset(h: &mut Harness) {
    for i in 0..2 {
        h.e.path_failed(h.now, PathId(i), "connection reset");
    }
    h.pump();
    h.sent.clear();
    up(h, PathId(0), 200, Instance::ResetSeen);
}

#[test]
fn a_loss_fails_every_flush_and_fua_write_until_cleared() {
    let cfg = EngineConfig {
        replay_window: 2 * (4096 + window::ENTRY_COST),
        ..EngineConfig::default()
    };
    let mut h = Harness::new("round-robin", 0, cfg);
    let p = h.e.add_path(PathConfig::default(), Duration::ZERO);
    up(&mut h, p, 100, Instance::Known(1));
    // One write larger than the window: the engine's own FLUSH (which
    // keeps smaller ones whole) cannot help it.
    write(&mut h, 0, 3 * 4096, 1, Flags::empty());
    answer_all(&mut h);
    assert!(h.e.replay_report().overflowed);
    restart(&mut h, 1);
    answer_all(&mut h);
    let lost = h.e.replay_report().lost.expect("lost");
    assert!(lost.1.contains("--replay-window"), "{}", lost.1);
    // Every FLUSH and FUA write fails, from any caller, however many.
    let mut failed = Vec::new();
    for _ in 0..3 {
        failed.push(h.submit(Op::Flush, 0, 0));
        failed.push(write(&mut h, 0, 4096, 2, Flags::FUA));
    }
    let plain = write(&mut h, 4096, 4096, 3, Flags::empty());
    answer_all(&mut h);
    for r in &failed {
        assert!(
            matches!(h.done[r], Err(IoError::Lost(_))),
            "{r:?}: {:?}",
            h.done[r]
        );
    }
    assert_eq!(h.done[&plain], Ok(()), "plain writes go on");
    assert_eq!(h.e.volume_counters().lost_flushes, 6);
    assert!(h.e.clear_loss().is_some());
    let f = h.submit(Op::Flush, 0, 0);
    answer_all(&mut h);
    assert_eq!(h.done[&f], Ok(()));
}

#[test]
fn a_fence_of_a_target_that_restarted_is_not_waited_for() {
    let mut h = harness(2);
    let w = write(&mut h, 0, 4096, 1, Flags::empty());
    let on = h.sent[0].path;
    h.sent.clear();
    h.e.path_failed(h.now, on, "reset");
    h.pump();
    assert!(h.e.fence_pending(FenceId(1)));
    // The other path's new connection names another instance: the
    // process that held the failed connections is gone.
    let other = PathId(1 - on.0);
    h.e.path_failed(h.now, other, "reset");
    h.pump();
    up(&mut h, other, 300, Instance::Known(2));
    assert!(!h.e.fence_pending(FenceId(1)));
    answer_all(&mut h);
    assert_eq!(h.done[&w], Ok(()));
}

/// What a front end that is stopping asks before its last FLUSH (`braid
/// attach` on SIGTERM, perhaps with no path left to carry one): whether a
/// FLUSH would make anything durable that is not already, or has a loss to
/// report.
#[test]
fn unflushed_is_what_a_flush_would_make_durable_or_report() {
    let mut h = harness(2);
    assert!(!h.e.unflushed(), "nothing written yet");
    write(&mut h, 0, 4096, 1, Flags::empty());
    assert!(h.e.unflushed(), "a write not yet answered");
    answer_all(&mut h);
    assert!(h.e.unflushed(), "a write answered and not flushed");
    let f = h.submit(Op::Flush, 0, 0);
    answer_all(&mut h);
    assert_eq!(h.done[&f], Ok(()));
    assert!(!h.e.unflushed(), "the FLUSH covered it");
    write(&mut h, 8192, 4096, 2, Flags::FUA);
    answer_all(&mut h);
    assert!(!h.e.unflushed(), "a FUA write is durable when answered");
    let z = h.submit(Op::WriteZeroes, 0, 65536);
    answer_all(&mut h);
    assert_eq!(h.done[&z], Ok(()));
    assert!(h.e.unflushed(), "zeroing answered and not flushed");
    let f = h.submit(Op::Flush, 0, 0);
    answer_all(&mut h);
    assert_eq!(h.done[&f], Ok(()));
    assert!(!h.e.unflushed());
    // A FLUSH that failed leaves what it was to cover.
    write(&mut h, 0, 4096, 3, Flags::empty());
    answer_all(&mut h);
    let f = h.submit(Op::Flush, 0, 0);
    let sent = std::mem::take(&mut h.sent);
    for s in sent {
        h.e.reply(h.now, s.cookie, Err(Error::new(ErrorKind::Io, "EIO")));
    }
    h.pump();
    assert!(h.done[&f].is_err());
    assert!(h.e.unflushed(), "the failed FLUSH made nothing durable");
}

/// A window too small for what was written has let go of writes it can no
/// longer give back: they are unflushed all the same, and once a restart
/// lost them, only a FLUSH can tell the caller so.
#[test]
fn writes_the_window_let_go_and_a_loss_are_unflushed() {
    let cfg = EngineConfig {
        replay_window: 0,
        ..EngineConfig::default()
    };
    let mut h = Harness::new("round-robin", 0, cfg);
    let p = h.e.add_path(PathConfig::default(), Duration::ZERO);
    up(&mut h, p, 100, Instance::Known(1));
    write(&mut h, 0, 4096, 1, Flags::empty());
    answer_all(&mut h);
    assert_eq!(h.e.replay_report().window_bytes, 0, "the window kept it");
    assert!(h.e.unflushed(), "a write the window let go");
    restart(&mut h, 1);
    answer_all(&mut h);
    assert!(h.e.replay_report().lost.is_some());
    let f = h.submit(Op::Flush, 0, 0);
    answer_all(&mut h);
    assert!(matches!(h.done[&f], Err(IoError::Lost(_))));
    assert!(h.e.unflushed(), "a loss still to be reported");
    assert!(h.e.clear_loss().is_some());
    let f = h.submit(Op::Flush, 0, 0);
    answer_all(&mut h);
    assert_eq!(h.done[&f], Ok(()));
    assert!(!h.e.unflushed());
}

/// A 1 MiB write cut over two paths is unflushed from its first piece
/// out until a FLUSH covers all of it: a piece answered on one path while
/// the other's are out is not the write done.
#[test]
fn a_write_split_over_paths_is_unflushed_until_a_flush_covers_every_piece() {
    let mut h = harness(2);
    write(&mut h, 0, 1 << 20, 7, Flags::empty());
    let paths: std::collections::BTreeSet<_> = h.sent.iter().map(|s| s.path).collect();
    assert_eq!(paths.len(), 2, "the write went over both paths");
    assert!(h.sent.len() > 2, "cut into pieces");
    // One path answers its pieces; the other's stay out.
    let first = h.sent[0].path;
    let (answer, out): (Vec<_>, Vec<_>) = std::mem::take(&mut h.sent)
        .into_iter()
        .partition(|s| s.path == first);
    for s in answer {
        h.e.reply(h.now, s.cookie, Ok(()));
    }
    h.pump();
    assert!(h.e.unflushed(), "pieces still out on the other path");
    for s in out {
        h.e.reply(h.now, s.cookie, Ok(()));
    }
    h.pump();
    answer_all(&mut h);
    assert!(h.e.unflushed(), "answered, not flushed");
    let f = h.submit(Op::Flush, 0, 0);
    answer_all(&mut h);
    assert_eq!(h.done[&f], Ok(()));
    assert!(!h.e.unflushed());
}
