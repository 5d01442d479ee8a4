//! The no-path timeout: how long I/O waits with no path to take it,
//! counted from when it began to need one (at submission, or when the
//! path it was on failed), then EIO.

use std::time::Duration;

use braid_block::ErrorKind;
use braid_proto::braid_ns::ConnId;

use super::tests::Harness;
use super::*;

#[test]
fn no_path_waits_then_fails_with_eio() {
    let cfg = EngineConfig {
        no_path_timeout: Some(Duration::from_secs(5)),
        ..EngineConfig::default()
    };
    let mut h = Harness::new("adaptive", 1, cfg);
    h.e.path_failed(h.now, PathId(0), "down");
    h.pump();
    let r = h.submit(Op::Write, 0, 4096);
    assert!(h.sent.is_empty());
    h.advance(Duration::from_secs(4));
    assert!(h.done.is_empty(), "failed before the no-path timeout");
    h.advance(Duration::from_secs(2));
    assert!(matches!(h.done[&r], Err(IoError::NoPath(_))));
    assert_eq!(h.done[&r].as_ref().unwrap_err().kind(), ErrorKind::Io);
    let c = h.e.volume_counters();
    assert_eq!(
        (c.errors_returned, c.eio_returned, c.no_path_timeouts),
        (1, 1, 1),
        "a no-path timeout is an error, an EIO and a no-path timeout"
    );
}

#[test]
fn no_path_resumes_when_a_path_returns() {
    let mut h = Harness::new("adaptive", 1, EngineConfig::default());
    h.e.path_failed(h.now, PathId(0), "down");
    h.pump();
    let r = h.submit(Op::Read, 0, 4096);
    h.advance(Duration::from_secs(3));
    h.e.path_up(h.now, PathId(0), vec![Some(ConnId(7))], true);
    h.pump();
    assert!(h
        .log
        .contains(&Action::Event(Event::PathRestored { path: PathId(0) })));
    assert_eq!(h.sent.len(), 1);
    h.reply_all(true);
    assert_eq!(h.done[&r], Ok(()));
}

#[test]
fn no_path_timeout_zero_fails_at_once() {
    let cfg = EngineConfig {
        no_path_timeout: Some(Duration::ZERO),
        ..EngineConfig::default()
    };
    let mut h = Harness::new("adaptive", 1, cfg);
    h.e.path_failed(h.now, PathId(0), "down");
    h.pump();
    let r = h.submit(Op::Read, 0, 4096);
    assert!(matches!(h.done[&r], Err(IoError::NoPath(_))));
}

/// A read and a write on the only path for 4 s (a slow disk: nothing
/// judges the path meanwhile), then the path fails: both wait the whole
/// timeout from the failure, not what is left of it from submission.
#[test]
fn the_no_path_clock_starts_when_the_last_path_fails() {
    let cfg = EngineConfig {
        no_path_timeout: Some(Duration::from_secs(5)),
        ..EngineConfig::default()
    };
    let mut h = Harness::new("adaptive", 1, cfg);
    let read = h.submit(Op::Read, 0, 4096);
    let write = h.submit(Op::Write, 1 << 20, 4096);
    assert_eq!(h.sent.len(), 2);
    h.now += Duration::from_secs(4);
    h.e.path_failed(h.now, PathId(0), "down");
    h.pump();
    h.advance(Duration::from_secs(2));
    assert!(
        h.done.is_empty(),
        "failed 2 s after the last path went, with a 5 s no-path timeout: {:?}",
        h.done
    );
    h.advance(Duration::from_secs(4));
    for r in [read, write] {
        match &h.done[&r] {
            Err(IoError::NoPath(waited)) => {
                assert_eq!(*waited, Duration::from_secs(6), "waited without a path")
            }
            other => panic!("want a no-path EIO, got {other:?}"),
        }
    }
}

/// A chunk a port refused (ALUA) starts its wait when it comes back.
#[test]
fn a_chunk_refused_by_its_port_waits_the_whole_timeout() {
    let cfg = EngineConfig {
        no_path_timeout: Some(Duration::from_secs(5)),
        ..EngineConfig::default()
    };
    let mut h = Harness::new("adaptive", 1, cfg);
    let r = h.submit(Op::Read, 0, 4096);
    let sent = std::mem::take(&mut h.sent);
    h.now += Duration::from_secs(4);
    h.e.set_access(h.now, PathId(0), Access::Standby);
    h.e.retry_elsewhere(h.now, sent[0].cookie);
    h.pump();
    h.advance(Duration::from_secs(2));
    assert!(h.done.is_empty(), "{:?}", h.done);
    h.advance(Duration::from_secs(4));
    assert!(matches!(h.done[&r], Err(IoError::NoPath(_))));
    assert_eq!(h.done[&r].as_ref().unwrap_err().kind(), ErrorKind::Io);
}
