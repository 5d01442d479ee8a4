//! Reservations and REPORT SUPPORTED OPERATION CODES, byte by byte.

use super::opcodes;
use super::reserve::*;
use super::{Command, Key, Sense};

fn nexus(isid: u8, port: u16) -> NexusName {
    NexusName::new(
        "iqn.2026-11.org.example:Node",
        [0x80, 0, 0, 0, 0, isid],
        port,
    )
}

/// A PERSISTENT RESERVE OUT parameter list.
fn params(key: u64, sa_key: u64, aptpl: bool) -> Vec<u8> {
    let mut p = key.to_be_bytes().to_vec();
    p.extend_from_slice(&sa_key.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, u8::from(aptpl), 0, 0, 0]);
    p
}

const REGISTER: u8 = 0;
const RESERVE: u8 = 1;
const RELEASE: u8 = 2;
const CLEAR: u8 = 3;
const PREEMPT: u8 = 4;
const PREEMPT_AND_ABORT: u8 = 5;
const REGISTER_AND_IGNORE: u8 = 6;
const WE: u8 = 1;
const EA: u8 = 3;
const WE_RO: u8 = 5;
const EA_AR: u8 = 8;

fn read() -> Command {
    Command::Read {
        lba: 0,
        blocks: 1,
        fua: false,
    }
}

fn write() -> Command {
    Command::Write {
        lba: 0,
        blocks: 1,
        fua: false,
    }
}

fn register(r: &mut Reservations, n: &NexusName, key: u64) {
    r.out(n, REGISTER, 0, 0, &params(0, key, false)).unwrap();
}

#[test]
fn the_nexus_name_carries_the_isid_and_the_port() {
    let n = nexus(0x2a, 3);
    assert_eq!(
        n.initiator_port,
        "iqn.2026-11.org.example:node,i,0x80000000002a"
    );
    assert_eq!(n.target_port, 3);
}

#[test]
fn write_exclusive_lets_others_read_and_exclusive_access_does_not() {
    let (a, b) = (nexus(1, 1), nexus(2, 2));
    let mut r = Reservations::default();
    register(&mut r, &a, 0xa);
    assert!(!r.conflicts(&b, &write()), "registered but not reserved");
    let fx = r.out(&a, RESERVE, 0, WE, &params(0xa, 0, false)).unwrap();
    assert!(fx.changed, "a reservation taken is saved too");
    assert!(!r.conflicts(&a, &write()), "the holder writes");
    assert!(r.conflicts(&b, &write()));
    assert!(!r.conflicts(&b, &read()));
    assert!(!r.conflicts(&b, &Command::ReadCapacity10));
    r.out(&a, RELEASE, 0, WE, &params(0xa, 0, false)).unwrap();
    r.out(&a, RESERVE, 0, EA, &params(0xa, 0, false)).unwrap();
    assert!(r.conflicts(&b, &read()));
    assert!(!r.conflicts(
        &b,
        &Command::Inquiry {
            vpd: None,
            alloc: 96
        }
    ));
    assert!(!r.conflicts(
        &b,
        &Command::PersistentReserveIn {
            action: 0,
            alloc: 8
        }
    ));
}

#[test]
fn registrants_only_lets_every_registrant_write() {
    let (a, b, c) = (nexus(1, 1), nexus(2, 2), nexus(3, 1));
    let mut r = Reservations::default();
    register(&mut r, &a, 0xa);
    register(&mut r, &b, 0xb);
    r.out(&a, RESERVE, 0, WE_RO, &params(0xa, 0, false))
        .unwrap();
    assert!(!r.conflicts(&b, &write()));
    assert!(r.conflicts(&c, &write()), "not registered");
    // Another registrant cannot take it, nor release it.
    assert_eq!(
        r.out(&b, RESERVE, 0, WE_RO, &params(0xb, 0, false)),
        Err(Refusal::Conflict)
    );
    // The holder leaving releases it, and the others hear of it.
    let fx = r.out(&a, REGISTER, 0, 0, &params(0xa, 0, false)).unwrap();
    assert_eq!(fx.tell, vec![(b.clone(), RESERVATIONS_RELEASED)]);
    assert!(!r.conflicts(&c, &write()));
}

#[test]
fn register_checks_the_old_key_unless_told_to_ignore_it() {
    let a = nexus(1, 1);
    let mut r = Reservations::default();
    assert_eq!(
        r.out(&a, REGISTER, 0, 0, &params(7, 9, false)),
        Err(Refusal::Conflict),
        "an unregistered nexus names no key"
    );
    register(&mut r, &a, 9);
    assert_eq!(
        r.out(&a, REGISTER, 0, 0, &params(8, 10, false)),
        Err(Refusal::Conflict)
    );
    r.out(&a, REGISTER_AND_IGNORE, 0, 0, &params(0, 10, false))
        .unwrap();
    assert_eq!(
        r.read(0, 64).unwrap(),
        [0, 0, 0, 2, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 10]
    );
    // Only a registered nexus with its own key may reserve.
    assert_eq!(
        r.out(&nexus(2, 1), RESERVE, 0, WE, &params(10, 0, false)),
        Err(Refusal::Conflict)
    );
    assert_eq!(
        r.out(&a, RESERVE, 1, WE, &params(10, 0, false)),
        Err(Refusal::Check(Sense::INVALID_FIELD_IN_CDB)),
        "only the whole unit can be reserved"
    );
    assert_eq!(
        r.out(&a, REGISTER, 0, 0, &params(10, 0, false)[..20]),
        Err(Refusal::Check(Sense::PARAMETER_LIST_LENGTH))
    );
    let mut spec_i_pt = params(10, 11, false);
    spec_i_pt[20] = 0x08;
    assert_eq!(
        r.out(&a, REGISTER, 0, 0, &spec_i_pt),
        Err(Refusal::Check(Sense::new(Key::IllegalRequest, 0x26, 0)))
    );
}

#[test]
fn preempt_and_abort_removes_the_holder_and_names_whose_tasks_end() {
    let (a, b, c) = (nexus(1, 1), nexus(2, 2), nexus(3, 2));
    let mut r = Reservations::default();
    register(&mut r, &a, 0xa);
    register(&mut r, &b, 0xb);
    register(&mut r, &c, 0xc);
    r.out(&a, RESERVE, 0, WE, &params(0xa, 0, false)).unwrap();
    let before = r.read(0, 8).unwrap();
    let fx = r
        .out(&b, PREEMPT_AND_ABORT, 0, WE, &params(0xb, 0xa, false))
        .unwrap();
    assert_eq!(fx.abort, vec![a.clone()]);
    assert_eq!(fx.tell, vec![(a.clone(), REGISTRATIONS_PREEMPTED)]);
    assert!(fx.changed);
    assert!(
        r.conflicts(&a, &write()),
        "the preempted nexus may not write"
    );
    assert!(!r.conflicts(&b, &write()), "the preempting one holds it");
    let after = r.read(0, 8).unwrap();
    assert_eq!(
        u32::from_be_bytes(after[..4].try_into().unwrap()),
        u32::from_be_bytes(before[..4].try_into().unwrap()) + 1
    );
    // READ RESERVATION: b's key, type WE.
    assert_eq!(
        r.read(1, 64).unwrap()[4..],
        [0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0xb, 0, 0, 0, 0, 0, WE, 0, 0]
    );
    // A plain PREEMPT of a key nobody has is a conflict; of key 0 outside
    // an all-registrants reservation, an error in the parameters.
    assert_eq!(
        r.out(&b, PREEMPT, 0, WE, &params(0xb, 0x77, false)),
        Err(Refusal::Conflict)
    );
    assert_eq!(
        r.out(&b, PREEMPT, 0, WE, &params(0xb, 0, false)),
        Err(Refusal::Check(Sense::new(Key::IllegalRequest, 0x26, 0)))
    );
    let fx = r.out(&b, PREEMPT, 0, WE, &params(0xb, 0xc, false)).unwrap();
    assert!(fx.abort.is_empty(), "PREEMPT alone aborts nothing");
    assert_eq!(r.read(0, 64).unwrap()[8..], 0xbu64.to_be_bytes());
}

#[test]
fn all_registrants_holders_and_preempting_key_zero() {
    let (a, b) = (nexus(1, 1), nexus(2, 2));
    let mut r = Reservations::default();
    register(&mut r, &a, 0xa);
    register(&mut r, &b, 0xb);
    r.out(&a, RESERVE, 0, EA_AR, &params(0xa, 0, false))
        .unwrap();
    assert!(!r.conflicts(&b, &read()), "every registrant holds it");
    assert_eq!(r.read(1, 64).unwrap()[8..16], [0; 8], "shown with key 0");
    let fx = r.out(&b, PREEMPT, 0, WE, &params(0xb, 0, false)).unwrap();
    assert_eq!(fx.tell, vec![(a.clone(), REGISTRATIONS_PREEMPTED)]);
    assert!(r.conflicts(&a, &write()));
    assert_eq!(r.read(1, 64).unwrap()[21], WE);
}

#[test]
fn clear_tells_every_other_registrant() {
    let (a, b) = (nexus(1, 1), nexus(2, 2));
    let mut r = Reservations::default();
    register(&mut r, &a, 0xa);
    register(&mut r, &b, 0xb);
    r.out(&a, RESERVE, 0, EA, &params(0xa, 0, false)).unwrap();
    let fx = r.out(&b, CLEAR, 0, 0, &params(0xb, 0, false)).unwrap();
    assert_eq!(fx.tell, vec![(a.clone(), RESERVATIONS_PREEMPTED)]);
    assert_eq!(r.read(0, 64).unwrap()[4..8], [0, 0, 0, 0]);
    assert!(!r.conflicts(&a, &write()));
}

#[test]
fn reserve_and_release_six_against_persistent_registrations() {
    let (a, b) = (nexus(1, 1), nexus(2, 2));
    let mut r = Reservations::default();
    r.reserve(&a).unwrap();
    r.reserve(&a).unwrap();
    assert_eq!(r.reserve(&b), Err(Refusal::Conflict));
    assert!(r.conflicts(&b, &read()));
    assert!(r.conflicts(&b, &Command::TestUnitReady));
    assert!(!r.conflicts(
        &b,
        &Command::Inquiry {
            vpd: None,
            alloc: 36
        }
    ));
    assert_eq!(
        r.out(&b, REGISTER, 0, 0, &params(0, 1, false)),
        Err(Refusal::Conflict)
    );
    r.release(&b).unwrap();
    assert!(
        r.conflicts(&b, &read()),
        "another nexus' RELEASE does nothing"
    );
    r.nexus_lost(Some(&a));
    assert!(!r.conflicts(&b, &read()), "gone with its nexus");
    register(&mut r, &b, 1);
    assert_eq!(r.reserve(&a), Err(Refusal::Conflict));
    assert_eq!(r.release(&a), Err(Refusal::Conflict));
}

#[test]
fn report_capabilities_and_full_status() {
    let a = nexus(0x3c, 2);
    let mut r = Reservations::default();
    assert_eq!(r.read(2, 8).unwrap(), [0, 8, 0x11, 0x80, 0xea, 0x01, 0, 0]);
    r.out(&a, REGISTER, 0, 0, &params(0, 0x55, true)).unwrap();
    assert_eq!(r.read(2, 8).unwrap()[3], 0x81, "PTPL_A once asked for");
    r.out(&a, RESERVE, 0, WE, &params(0x55, 0, false)).unwrap();
    let full = r.read(3, 512).unwrap();
    let len = u32::from_be_bytes(full[4..8].try_into().unwrap()) as usize;
    assert_eq!(full.len(), 8 + len);
    let d = &full[8..];
    assert_eq!(d[..8], 0x55u64.to_be_bytes());
    assert_eq!((d[12], d[13]), (1, WE), "the holder, and its type");
    assert_eq!(d[18..20], [0, 2], "the relative target port");
    let tid_len = u32::from_be_bytes(d[20..24].try_into().unwrap()) as usize;
    let tid = &d[24..24 + tid_len];
    assert_eq!(tid[0], 0x45, "iSCSI, name and ISID");
    assert_eq!(tid_len % 4, 0);
    assert!(tid[4..].starts_with(b"iqn.2026-11.org.example:node,i,0x80000000003c\0"));
    assert_eq!(r.read(9, 8), Err(Sense::INVALID_FIELD_IN_CDB));
}

#[test]
fn saved_state_reads_back_as_it_was() {
    let (a, b) = (nexus(1, 1), nexus(2, 2));
    let mut r = Reservations::default();
    r.out(&a, REGISTER, 0, 0, &params(0, 0xfeed, true)).unwrap();
    register(&mut r, &b, 0xbeef);
    r.out(&b, REGISTER, 0, 0, &params(0xbeef, 0xbeef, true))
        .unwrap();
    r.out(&a, RESERVE, 0, EA, &params(0xfeed, 0, false))
        .unwrap();
    let text = r.save();
    let back = Reservations::load(&text).unwrap();
    assert_eq!(back, r);
    assert!(back.conflicts(&b, &read()));
    assert!(Reservations::load("register zz 1 iqn.x,i,0x00")
        .unwrap_err()
        .contains("line 1"));
    assert!(
        Reservations::load("reserve 2 1 iqn.x,i,0x00").is_err(),
        "type 2 is obsolete"
    );
}

#[test]
fn initiator_names_with_any_byte_round_trip_through_the_file() {
    // A space split the old line into too many fields (the file no longer
    // loaded, so the server did not start); a newline wrote a line of the
    // initiator's choosing.
    let names = [
        "iqn.2026-11.org.example:with space",
        "iqn.2026-11.org.example:a\nregister 00000000000000ff 1 iqn.forged,i,0x01",
        "iqn.2026-11.org.example:a=b %41 %zz\r\t\\",
        "iqn.2026-11.org.example:\u{e9}t\u{e9}\u{0}\u{7f}",
    ];
    let nexuses: Vec<NexusName> = (0u8..)
        .zip(names)
        .map(|(i, n)| NexusName::new(n, [0x80, 0, 0, 0, 0, i], 1))
        .collect();
    let mut r = Reservations::default();
    for (key, n) in (0x100..).zip(&nexuses) {
        r.out(n, REGISTER, 0, 0, &params(0, key, true)).unwrap();
    }
    r.out(&nexuses[1], RESERVE, 0, EA, &params(0x101, 0, false))
        .unwrap();
    let text = r.save();
    assert_eq!(Reservations::load(&text), Ok(r), "saved as:\n{text}");
}

#[test]
fn a_file_written_before_names_were_escaped_still_loads() {
    let holder = NexusName::new("iqn.2026-11.org.example:n%41", [0x80, 0, 0, 0, 0, 1], 1);
    let old = "generation 3\n\
               register 000000000000feed 1 iqn.2026-11.org.example:n%41,i,0x800000000001\n\
               reserve 3 1 iqn.2026-11.org.example:n%41,i,0x800000000001\n";
    let r = Reservations::load(old).unwrap();
    assert!(
        !r.conflicts(&holder, &read()),
        "the holder's name is read as written"
    );
    assert!(r.conflicts(&nexus(9, 1), &read()));
}

fn everything(_: u8, _: Option<u16>) -> bool {
    true
}

#[test]
fn every_command_is_listed_with_its_cdb_length() {
    let d = opcodes::report(0, 0, 0, false, 4096, everything).unwrap();
    let len = u32::from_be_bytes(d[..4].try_into().unwrap()) as usize;
    assert_eq!(d.len(), 4 + len);
    let descs: Vec<&[u8]> = d[4..].chunks(8).collect();
    let read10 = descs.iter().find(|x| x[0] == 0x28).unwrap();
    assert_eq!(read10[..], [0x28, 0, 0, 0, 0, 0, 0, 10]);
    let rc16 = descs.iter().find(|x| x[0] == 0x9e && x[3] == 0x10).unwrap();
    assert_eq!(rc16[5], 0x01, "SERVACTV");
    let without_unmap = opcodes::report(0, 0, 0, false, 4096, |op, _| op != 0x42).unwrap();
    assert_eq!(without_unmap.len(), d.len() - 8);
    let timed = opcodes::report(0, 0, 0, true, 4096, everything).unwrap();
    assert_eq!(timed.len(), 4 + len / 8 * 20);
    assert_eq!(timed[4 + 5], 0x02, "CTDP");
}

#[test]
fn one_command_shows_which_cdb_bits_are_read() {
    let d = opcodes::report(1, 0x2a, 0, false, 64, everything).unwrap();
    assert_eq!(d[..4], [0, 0x03, 0, 10]);
    assert_eq!(
        d[4..],
        [0x2a, 0x18, 0xff, 0xff, 0xff, 0xff, 0, 0xff, 0xff, 0]
    );
    let d = opcodes::report(2, 0x9e, 0x12, true, 64, everything).unwrap();
    assert_eq!(d[..4], [0, 0x83, 0, 16]);
    assert_eq!(d.len(), 4 + 16 + 12);
    assert_eq!(
        opcodes::report(1, 0x9e, 0, false, 64, everything),
        Err(Sense::INVALID_FIELD_IN_CDB.in_cdb_field(2, 2)),
        "an opcode with service actions needs one"
    );
    assert_eq!(
        opcodes::report(2, 0x28, 1, false, 64, everything),
        Err(Sense::INVALID_FIELD_IN_CDB.in_cdb_field(2, 2))
    );
    assert_eq!(
        opcodes::report(1, 0xc0, 0, false, 64, everything).unwrap(),
        [0, 1, 0, 0]
    );
    assert_eq!(
        opcodes::report(3, 0x28, 7, false, 64, everything).unwrap()[1],
        0x03
    );
    assert_eq!(
        opcodes::report(1, 0x42, 0, false, 64, |op, _| op != 0x42).unwrap()[1],
        0x01,
        "a command this unit does not offer"
    );
}

#[test]
fn new_cdbs_parse() {
    let mut c = [0u8; 16];
    c[0] = 0x2f;
    c[1] = 0x02;
    c[5] = 9;
    c[8] = 2;
    let v = Command::parse(&c).unwrap();
    assert_eq!(
        v,
        Command::Verify {
            lba: 9,
            blocks: 2,
            bytchk: 1
        }
    );
    assert_eq!(v.data_out_len(512), Some(1024));
    c[1] = 0x04;
    assert_eq!(
        Command::parse(&c),
        Err(Sense::INVALID_FIELD_IN_CDB),
        "BYTCHK 2"
    );
    c[1] = 0x06;
    assert_eq!(Command::parse(&c).unwrap().data_out_len(512), Some(512));
    c[1] = 0;
    assert_eq!(Command::parse(&c).unwrap().data_out_len(512), None);
    let mut c = [0u8; 16];
    c[0] = 0x5f;
    c[1] = 0x05;
    c[2] = 0x01;
    c[8] = 24;
    let p = Command::parse(&c).unwrap();
    assert_eq!(
        p,
        Command::PersistentReserveOut {
            action: 5,
            scope: 0,
            kind: 1,
            param_len: 24
        }
    );
    assert_eq!(p.data_out_len(512), Some(24));
    let mut c = [0u8; 16];
    c[0] = 0x15;
    c[1] = 0x11;
    assert_eq!(Command::parse(&c), Err(Sense::INVALID_FIELD_IN_CDB), "SP");
    c[0] = 0x56;
    c[1] = 0x10;
    assert_eq!(
        Command::parse(&c),
        Err(Sense::INVALID_FIELD_IN_CDB),
        "third party"
    );
    c[1] = 0;
    assert_eq!(Command::parse(&c), Ok(Command::Reserve));
    c[0] = 0x17;
    assert_eq!(Command::parse(&c), Ok(Command::Release));
    let mut c = [0u8; 16];
    c[0] = 0x8b;
    c[1] = 0x08;
    c[9] = 4;
    c[13] = 2;
    let o = Command::parse(&c).unwrap();
    assert_eq!(
        o,
        Command::OrWrite {
            lba: 4,
            blocks: 2,
            fua: true
        }
    );
    assert_eq!(o.data_out_len(512), Some(1024), "ORWRITE takes its blocks");
    c[0] = 0x90;
    assert_eq!(
        Command::parse(&c),
        Ok(Command::Prefetch { lba: 4, blocks: 2 })
    );
}
