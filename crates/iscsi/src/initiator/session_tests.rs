//! The full feature phase against PDUs written out by hand and against
//! braid's own target-side transfer code: commands and their data, the
//! window, pings, task management, text, logout, and PDUs a target must
//! not send.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use super::cdb;
use super::login::{Isid, LoggedIn};
use super::sense::SenseData;
use super::session::{AsyncEvent, Command, Event, Outcome, Session, TaskFunction, RESERVED_TAG};
use crate::negotiate::Params;
use crate::pdu::{Bhs, Framer, Opcode, Pdu};
use crate::scsi::Sense;
use crate::transfer::{self, Numbers, WriteTransfer};
use crate::Digests;

fn logged_in(params: Params, max_cmd_sn: u32) -> LoggedIn {
    LoggedIn {
        isid: Isid([0x80, 0, 0, 1, 0, 1]),
        tsih: 1,
        params,
        portal_group_tag: Some(1),
        target_alias: None,
        cmd_sn: 10,
        exp_stat_sn: 100,
        exp_cmd_sn: 10,
        max_cmd_sn,
    }
}

fn params() -> Params {
    Params {
        peer_max_recv_data: 8192,
        max_burst: 65536,
        first_burst: 16384,
        initial_r2t: false,
        immediate_data: true,
        ..Params::default()
    }
}

fn drain(s: &mut Session) -> Vec<Pdu> {
    std::iter::from_fn(|| s.poll_transmit()).collect()
}

fn events(s: &mut Session) -> Vec<Event> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

fn read(blocks: u32) -> Command {
    Command {
        lun: 0,
        cdb: cdb::read16(0, blocks),
        read: blocks * 512,
        write: None,
    }
}

fn write(data: Vec<u8>) -> Command {
    Command {
        lun: 0,
        cdb: cdb::write16(0, data.len() as u32 / 512, false),
        read: 0,
        write: Some(Bytes::from(data)),
    }
}

/// A target PDU with StatSN, ExpCmdSN and MaxCmdSN.
fn from_target(op: Opcode, itt: u32, stat_sn: u32, exp: u32, max: u32) -> Bhs {
    let mut b = Bhs::new(op);
    b.set_final(true);
    b.set_itt(itt);
    b.set_u32(24, stat_sn);
    b.set_u32(28, exp);
    b.set_u32(32, max);
    b
}

#[test]
fn a_read_by_the_byte_with_data_and_status_from_the_target_side() {
    let mut s = Session::new(&logged_in(params(), 40));
    let itt = s.submit(read(48));
    let out = drain(&mut s);
    assert_eq!(out.len(), 1);
    let b = out[0].bhs.0;
    assert_eq!(b[0], 0x01, "SCSI Command, not immediate");
    assert_eq!(b[1], 0x80 | 0x40 | 0x01, "F, R, simple");
    assert_eq!(out[0].bhs.u32_at(20), 48 * 512, "expected length");
    assert_eq!(out[0].bhs.u32_at(24), 10, "CmdSN");
    assert_eq!(out[0].bhs.u32_at(28), 100, "ExpStatSN");
    assert_eq!(b[32], 0x88);
    // The target's own cutting of 24 KiB into Data-In with status.
    let n = Numbers {
        stat_sn: 100,
        exp_cmd_sn: 11,
        max_cmd_sn: 41,
    };
    let want: Vec<u8> = (0..48 * 512).map(|i| (i % 251) as u8).collect();
    for d in transfer::data_in(itt, want.len() as u32, want.len() as u32, 8192, 16384, n) {
        let data = Bytes::copy_from_slice(&want[d.offset as usize..(d.offset + d.len) as usize]);
        s.receive(Pdu::new(d.bhs, data)).unwrap();
    }
    let ev = events(&mut s);
    let mut got = vec![0u8; want.len()];
    for e in &ev[..3] {
        let Event::Data { offset, data, .. } = e else {
            panic!("{e:?}")
        };
        got[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
    }
    assert_eq!(got, want);
    assert_eq!(
        ev[3],
        Event::Complete {
            itt,
            outcome: Outcome::Status {
                status: 0,
                sense: None,
                residual: 0,
                data_in: 24576
            }
        }
    );
    assert_eq!(s.in_flight(), 0);
    // The next command acknowledges StatSN 100.
    s.submit(read(1));
    assert_eq!(drain(&mut s)[0].bhs.u32_at(28), 101);
}

#[test]
fn a_write_sends_immediate_unsolicited_and_solicited_data_the_target_accepts() {
    let mut s = Session::new(&logged_in(params(), 40));
    let data: Vec<u8> = (0..40 * 1024).map(|i| (i * 7) as u8).collect();
    let itt = s.submit(write(data.clone()));
    let out = drain(&mut s);
    // Command with 8 KiB immediate, then 8 KiB unsolicited (FirstBurst 16 KiB).
    assert_eq!(out.len(), 2);
    assert_eq!(
        out[0].bhs.0[1],
        0x20 | 0x01,
        "W, simple, no F: Data-Out follows"
    );
    assert_eq!(out[0].data.len(), 8192);
    let p = params();
    let mut target = WriteTransfer::new(
        data.len() as u32,
        8192,
        p.initial_r2t,
        p.first_burst,
        p.max_burst,
        2,
    )
    .unwrap();
    let mut got = vec![0u8; data.len()];
    got[..8192].copy_from_slice(&out[0].data);
    let mut place = |pdus: &[Pdu], t: &mut WriteTransfer| {
        for d in pdus {
            assert_eq!(d.bhs.opcode(), Opcode::DataOut);
            let at = t.data_out(&d.bhs, d.data.len() as u32).unwrap() as usize;
            got[at..at + d.data.len()].copy_from_slice(&d.data);
        }
    };
    place(&out[1..], &mut target);
    assert_eq!(out[1].bhs.u32_at(20), RESERVED_TAG);
    assert!(out[1].bhs.final_bit());
    let n = Numbers {
        stat_sn: 100,
        exp_cmd_sn: 11,
        max_cmd_sn: 41,
    };
    for r in target.r2ts() {
        let mut b = r.bhs(itt, 0, n);
        b.set_u32(24, 100);
        s.receive(Pdu::new(b, Bytes::new())).unwrap();
    }
    let out = drain(&mut s);
    assert_eq!(out.len(), 3, "24 KiB in 8 KiB Data-Out");
    assert_eq!(out.iter().filter(|p| p.bhs.final_bit()).count(), 1);
    place(&out, &mut target);
    assert!(target.complete());
    assert_eq!(got, data);
    let mut resp = from_target(Opcode::ScsiResponse, itt, 100, 11, 41);
    resp.0[1] = 0x80;
    s.receive(Pdu::new(resp, Bytes::new())).unwrap();
    assert!(matches!(
        events(&mut s)[..],
        [Event::Complete {
            outcome: Outcome::Status { status: 0, .. },
            ..
        }]
    ));
}

#[test]
fn commands_beyond_max_cmd_sn_wait_until_the_window_opens() {
    // MaxCmdSN 11 with CmdSN 10: two commands may go.
    let mut s = Session::new(&logged_in(params(), 11));
    assert_eq!(s.window(), 2);
    let tags: Vec<u32> = (0..4).map(|_| s.submit(read(1))).collect();
    let out = drain(&mut s);
    assert_eq!(out.len(), 2);
    assert_eq!((s.in_flight(), s.queued(), s.window()), (2, 2, 0));
    // A ping is immediate: it goes out whatever the window, with CmdSN 12
    // not taken.
    s.ping();
    let ping = drain(&mut s);
    assert_eq!((ping[0].bhs.0[0], ping[0].bhs.u32_at(24)), (0x40, 12));
    // The first answer opens the window by one.
    let mut resp = from_target(Opcode::ScsiResponse, tags[0], 100, 11, 12);
    resp.0[1] = 0x80;
    s.receive(Pdu::new(resp, Bytes::new())).unwrap();
    let out = drain(&mut s);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].bhs.itt(), out[0].bhs.u32_at(24)), (tags[2], 12));
    // A MaxCmdSN that goes back, or one below ExpCmdSN - 1, changes nothing.
    let mut stale = from_target(Opcode::NopIn, RESERVED_TAG, 101, 11, 11);
    stale.set_u32(20, RESERVED_TAG);
    s.receive(Pdu::new(stale, Bytes::new())).unwrap();
    let mut bogus = from_target(Opcode::NopIn, RESERVED_TAG, 101, 20, 5);
    bogus.set_u32(20, RESERVED_TAG);
    s.receive(Pdu::new(bogus, Bytes::new())).unwrap();
    assert_eq!(s.window(), 0);
    assert!(drain(&mut s).is_empty());
}

#[test]
fn pings_both_ways() {
    let mut s = Session::new(&logged_in(params(), 40));
    let itt = s.ping();
    let out = drain(&mut s);
    assert_eq!(out[0].bhs.0[..2], [0x40, 0x80]);
    assert_eq!(
        (out[0].bhs.itt(), out[0].bhs.u32_at(20)),
        (itt, RESERVED_TAG)
    );
    let mut pong = from_target(Opcode::NopIn, itt, 100, 10, 40);
    pong.set_u32(20, RESERVED_TAG);
    s.receive(Pdu::new(pong, Bytes::new())).unwrap();
    assert_eq!(events(&mut s), [Event::Pong { itt }]);
    // The target pings: the answer echoes its tag and uses no task tag.
    let mut ping = from_target(Opcode::NopIn, RESERVED_TAG, 101, 10, 40);
    ping.set_u32(20, 0x77);
    s.receive(Pdu::new(ping, Bytes::new())).unwrap();
    let out = drain(&mut s);
    assert_eq!(
        (out[0].bhs.itt(), out[0].bhs.u32_at(20)),
        (RESERVED_TAG, 0x77)
    );
    assert_eq!(out[0].bhs.u32_at(28), 101, "its StatSN is not taken");
}

#[test]
fn abort_task_set_ends_the_commands_it_covers() {
    let mut s = Session::new(&logged_in(params(), 40));
    let a = s.submit(read(1));
    let b = s.submit(read(1));
    drain(&mut s);
    let tmf = s.task_management(TaskFunction::AbortTaskSet, 0, RESERVED_TAG);
    let out = drain(&mut s);
    assert_eq!(out[0].bhs.0[..2], [0x42, 0x82]);
    assert_eq!(
        out[0].bhs.u32_at(24),
        12,
        "immediate: the next CmdSN, not taken"
    );
    let mut r = from_target(Opcode::TaskMgmtResponse, tmf, 100, 12, 40);
    r.0[2] = 0;
    s.receive(Pdu::new(r, Bytes::new())).unwrap();
    let mut ev = events(&mut s);
    ev.sort_by_key(|e| format!("{e:?}"));
    assert_eq!(
        ev,
        [
            Event::Complete {
                itt: a,
                outcome: Outcome::Aborted
            },
            Event::Complete {
                itt: b,
                outcome: Outcome::Aborted
            },
            Event::TaskManagement {
                itt: tmf,
                response: 0
            },
        ]
    );
    assert_eq!(s.in_flight(), 0);
}

#[test]
fn check_condition_carries_its_sense_and_residuals_are_read() {
    let mut s = Session::new(&logged_in(params(), 40));
    let itt = s.submit(read(8));
    drain(&mut s);
    let mut r = from_target(Opcode::ScsiResponse, itt, 100, 11, 41);
    r.0[1] = 0x80 | 0x02;
    r.0[3] = 0x02;
    r.set_u32(44, 4096);
    let sense = Sense::POWER_ON_RESET.iscsi_segment();
    s.receive(Pdu::new(r, Bytes::from(sense))).unwrap();
    assert_eq!(
        events(&mut s),
        [Event::Complete {
            itt,
            outcome: Outcome::Status {
                status: 2,
                sense: Some(SenseData {
                    key: 6,
                    asc: 0x29,
                    ascq: 0
                }),
                residual: 4096,
                data_in: 0
            }
        }]
    );
}

#[test]
fn text_answers_are_gathered_across_continuations() {
    let mut s = Session::new(&logged_in(params(), 40));
    let itt = s.text(Bytes::from_static(super::sendtargets::SEND_TARGETS_ALL));
    let out = drain(&mut s);
    assert_eq!(out[0].bhs.0[..2], [0x44, 0x80]);
    assert_eq!(&out[0].data[..], b"SendTargets=All\0");
    let mut part = from_target(Opcode::TextResponse, itt, 100, 10, 40);
    part.0[1] = 0x40; // C: more follows
    part.set_u32(20, 0x1234);
    s.receive(Pdu::new(
        part,
        Bytes::from_static(b"TargetName=iqn.x\0TargetAdd"),
    ))
    .unwrap();
    let more = drain(&mut s);
    assert_eq!((more[0].bhs.u32_at(20), more[0].data.len()), (0x1234, 0));
    let last = from_target(Opcode::TextResponse, itt, 101, 10, 40);
    s.receive(Pdu::new(last, Bytes::from_static(b"ress=10.0.0.1\0")))
        .unwrap();
    let Event::Text { data, .. } = &events(&mut s)[0] else {
        panic!()
    };
    let t = super::sendtargets::parse(data).unwrap();
    assert_eq!(t[0].addresses[0].host, "10.0.0.1");
}

#[test]
fn logout_async_messages_and_rejects() {
    let mut s = Session::new(&logged_in(params(), 40));
    let mut a = from_target(Opcode::AsyncMessage, RESERVED_TAG, 100, 10, 40);
    a.0[36] = 0;
    s.receive(Pdu::new(
        a,
        Bytes::from(
            crate::scsi::Sense::new(crate::scsi::Key::UnitAttention, 0x2a, 6).iscsi_segment(),
        ),
    ))
    .unwrap();
    a.0[36] = 1;
    a.0[42..44].copy_from_slice(&5u16.to_be_bytes());
    s.receive(Pdu::new(a, Bytes::new())).unwrap();
    let ev = events(&mut s);
    assert!(
        matches!(&ev[0], Event::Async(AsyncEvent::Scsi { sense: Some(d), .. }) if d.asc == 0x2a)
    );
    assert_eq!(
        ev[1],
        Event::Async(AsyncEvent::LogoutRequested { seconds: 5 })
    );
    // A rejected command is over; a reject of anything else ends the connection.
    let itt = s.submit(read(1));
    let cmd = drain(&mut s).remove(0);
    let mut r = from_target(Opcode::Reject, RESERVED_TAG, 102, 11, 41);
    r.0[2] = 0x09;
    s.receive(Pdu::new(r, Bytes::copy_from_slice(&cmd.bhs.0)))
        .unwrap();
    assert_eq!(
        events(&mut s),
        [Event::Complete {
            itt,
            outcome: Outcome::Rejected { reason: 9 }
        }]
    );
    let ping = s.ping();
    let nop = drain(&mut s).remove(0);
    s.receive(Pdu::new(r, Bytes::copy_from_slice(&nop.bhs.0)))
        .unwrap_err();
    let _ = ping;
    let lo = s.logout();
    assert_eq!(drain(&mut s)[0].bhs.0[..2], [0x46, 0x80]);
    let resp = from_target(Opcode::LogoutResponse, lo, 103, 11, 41);
    s.receive(Pdu::new(resp, Bytes::new())).unwrap();
    assert_eq!(
        events(&mut s),
        [Event::Logout {
            itt: lo,
            response: 0
        }]
    );
}

#[test]
fn a_target_that_breaks_the_protocol_is_refused() {
    let bad = |f: &dyn Fn(&mut Session, u32) -> Pdu| {
        let mut s = Session::new(&logged_in(params(), 40));
        let itt = s.submit(read(4));
        drain(&mut s);
        let pdu = f(&mut s, itt);
        s.receive(pdu).unwrap_err()
    };
    let data_in = |itt, data_sn, offset, len: usize| {
        let mut b = from_target(Opcode::DataIn, itt, 0, 10, 40);
        b.0[1] = 0;
        b.set_u32(36, data_sn);
        b.set_u32(40, offset);
        Pdu::new(b, Bytes::from(vec![0u8; len]))
    };
    let e = bad(&|_, itt| data_in(itt, 1, 0, 512));
    assert!(e.to_string().contains("DataSN 1"), "{e}");
    bad(&|_, itt| data_in(itt, 0, 512, 512));
    bad(&|_, itt| data_in(itt, 0, 0, 4096));
    bad(&|_, itt| data_in(itt + 1, 0, 0, 512));
    bad(&|_, itt| {
        let mut b = from_target(Opcode::R2t, itt, 0, 10, 40);
        b.set_u32(20, 5);
        b.set_u32(44, 512);
        Pdu::new(b, Bytes::new())
    });
    bad(&|_, _| Pdu::new(Bhs::new(Opcode::ScsiCommand), Bytes::new()));
    bad(&|_, itt| {
        let mut b = from_target(Opcode::DataIn, itt, 0, 10, 40);
        b.0[1] = 0x01; // status without F
        Pdu::new(b, Bytes::new())
    });
}

#[test]
fn digests_and_framing_round_trip_a_session_pdu() {
    let mut s = Session::new(&logged_in(params(), 40));
    s.submit(write(vec![7u8; 4096]));
    let pdu = drain(&mut s).remove(0);
    let d = Digests {
        header: true,
        data: true,
    };
    let mut wire = Vec::new();
    pdu.encode(d, &mut wire);
    let mut f = Framer::new(8192);
    f.set(d, 8192);
    let mut buf = BytesMut::from(&wire[..]);
    let back = f.next(&mut buf).unwrap().unwrap();
    // The encoder fills in the data segment length.
    let mut want = pdu.bhs;
    want.set_data_len(4096);
    assert!(back.bhs == want && back.data == pdu.data && buf.is_empty());
}

proptest! {
    /// Whatever a target sends, the session answers with a PDU or an
    /// error, never a panic, and never reports more data than asked.
    #[test]
    fn arbitrary_target_pdus_never_panic(
        pdus in proptest::collection::vec((any::<[u8; 48]>(), proptest::collection::vec(any::<u8>(), 0..64)), 1..8),
    ) {
        let mut s = Session::new(&logged_in(params(), 40));
        s.submit(read(1));
        s.submit(write(vec![1; 512]));
        s.ping();
        drain(&mut s);
        for (h, data) in pdus {
            let mut b = Bhs(h);
            // Aim at the tasks that exist now and then.
            if h[47] & 1 == 0 {
                b.set_itt(1 + u32::from(h[46] % 3));
            }
            if s.receive(Pdu::new(b, Bytes::from(data))).is_err() {
                break;
            }
            for e in events(&mut s) {
                if let Event::Data { offset, data, .. } = e {
                    prop_assert!(offset as usize + data.len() <= 512);
                }
            }
            drain(&mut s);
        }
    }
}
