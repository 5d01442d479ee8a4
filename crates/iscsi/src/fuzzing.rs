//! Entry points for cargo-fuzz (`fuzz/fuzz_targets/iscsi_initiator.rs`)
//! and for the replay of every input it was seeded with or crashed on
//! (`crates/iscsi/tests/fuzz_regressions.rs`). Not part of the API.
//!
//! [`initiator`] runs everything an initiator reads from a target through
//! braid's initiator side: login responses (with mutual CHAP configured,
//! so every CHAP step is reachable), then full-feature PDUs for a read, a
//! write, a ping and a text request in flight, framed with the digests
//! the login settled. Beyond "never panics" it checks that no Data-In
//! is reported outside the command it answers, and runs every answer the
//! session hands out through the parsers of sense data, unit pages,
//! reservation answers and SendTargets answers.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};

use crate::chap::Credentials;
use crate::initiator::login::{InitiatorLogin, Isid, Kind, LoggedIn, LoginConfig, Step};
use crate::initiator::session::{Command, Event, Session};
use crate::initiator::{cdb, reservation, sendtargets, sense::SenseData, unit};
use crate::negotiate::Params;
use crate::pdu::Framer;
use crate::Digests;

/// Most PDUs one input may feed, so a run stays short.
const MAX_PDUS: usize = 256;

/// How far an input got, so that the replay can check the seeds still
/// reach past the login.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reached {
    pub logged_in: bool,
    /// Events the full feature phase reported.
    pub events: usize,
}

/// The fuzz target: see the module's documentation.
pub fn initiator(data: &[u8]) -> Reached {
    let Some((&mode, rest)) = data.split_first() else {
        return Reached::default();
    };
    let params = Params {
        header_digest: mode & 1 != 0,
        data_digest: mode & 2 != 0,
        max_recv_data: 8192,
        initial_r2t: mode & 4 != 0,
        immediate_data: mode & 8 != 0,
        first_burst: 16384,
        max_burst: 65536,
        ..Params::default()
    };
    let mut login = InitiatorLogin::new(LoginConfig {
        initiator: "iqn.2026-11.org.braid-storage:fuzz".into(),
        kind: Kind::Normal {
            target: "iqn.2026-11.org.braid-storage:vol".into(),
        },
        isid: Isid::random(mode.into(), 1),
        tsih: 0,
        cid: 0,
        cmd_sn: 1,
        chap: Some(Credentials {
            user: "u".into(),
            secret: b"s".to_vec(),
            mutual: (mode & 16 != 0).then(|| ("t".into(), b"ts".to_vec())),
        }),
        chap_id: 1,
        chap_challenge: [7; 16],
        params,
    });
    login.start();
    let mut framer = Framer::new(8192);
    let mut buf = BytesMut::from(rest);
    let mut logged_in = None;
    for _ in 0..MAX_PDUS {
        let Ok(Some(pdu)) = framer.next(&mut buf) else {
            break;
        };
        match login.handle(&pdu) {
            Ok(Step::Send(_)) => {}
            Ok(Step::Done(d)) => {
                logged_in = Some(*d);
                break;
            }
            Ok(Step::Redirect { address, .. }) => {
                let _ = sendtargets::address(&address);
                break;
            }
            Err(_) => break,
        }
    }
    // Without a completed login, the full feature phase runs anyway with
    // the defaults, so the rest of the input still reaches it.
    let reached_login = logged_in.is_some();
    let logged_in = logged_in.unwrap_or(LoggedIn {
        isid: Isid([0x80, 0, 0, 0, 0, 1]),
        tsih: 1,
        params: Params {
            peer_max_recv_data: 8192,
            ..params
        },
        portal_group_tag: None,
        target_alias: None,
        cmd_sn: 1,
        exp_stat_sn: 1,
        exp_cmd_sn: 1,
        max_cmd_sn: 64,
    });
    let p = logged_in.params;
    framer.set(
        Digests {
            header: p.header_digest,
            data: p.data_digest,
        },
        p.max_recv_data.max(512) as usize,
    );
    Reached {
        logged_in: reached_login,
        events: full_feature(Session::new(&logged_in), &framer, &mut buf),
    }
}

/// Returns how many events the session reported.
fn full_feature(mut s: Session, framer: &Framer, buf: &mut BytesMut) -> usize {
    let mut reads: HashMap<u32, u32> = HashMap::new();
    let r = s.submit(Command {
        lun: 0,
        cdb: cdb::inquiry(Some(0x83), 4096),
        read: 4096,
        write: None,
    });
    reads.insert(r, 4096);
    s.submit(Command {
        lun: 0,
        cdb: cdb::write16(0, 64, false),
        read: 0,
        write: Some(Bytes::from(vec![0x5a; 32768])),
    });
    s.ping();
    s.text(Bytes::from_static(sendtargets::SEND_TARGETS_ALL));
    while s.poll_transmit().is_some() {}
    let mut got: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut events = 0;
    for _ in 0..MAX_PDUS {
        let Ok(Some(pdu)) = framer.next(buf) else {
            break;
        };
        if s.receive(pdu).is_err() {
            break;
        }
        while s.poll_transmit().is_some() {}
        while let Some(e) = s.poll_event() {
            events += 1;
            match e {
                Event::Data { itt, offset, data } => {
                    let len = *reads.get(&itt).expect("data only for a read in flight");
                    let end = offset as usize + data.len();
                    assert!(end <= len as usize, "Data-In past the command's length");
                    let b = got.entry(itt).or_insert_with(|| vec![0; len as usize]);
                    b[offset as usize..end].copy_from_slice(&data);
                }
                Event::Complete { itt, .. } => {
                    if let Some(d) = got.remove(&itt) {
                        parse_all(&d);
                    }
                }
                Event::Text { data, .. } => {
                    let _ = sendtargets::parse(&data);
                }
                _ => {}
            }
        }
    }
    events
}

/// Every parser of a unit's answers, on the same bytes.
fn parse_all(d: &[u8]) {
    let _ = unit::Inquiry::parse(d);
    let _ = unit::supported_pages(d);
    let _ = unit::serial(d);
    let _ = unit::designators(d);
    let _ = unit::block_limits(d);
    let _ = unit::provisioning(d);
    let _ = unit::capacity16(d);
    let _ = unit::caching(d);
    let _ = unit::port_groups(d);
    let _ = reservation::needed(d);
    let _ = reservation::keys(d);
    let _ = reservation::full_status(d);
    if let Some(s) = SenseData::parse(d) {
        let _ = s.verdict();
    }
}

/// The unit both target-side fuzz targets serve: 512 MiB, thin.
fn fuzzed_unit() -> braid_scsi::respond::Unit {
    braid_scsi::respond::Unit {
        blocks: 1 << 20,
        block_size: 512,
        uuid: [7; 16],
        read_only: false,
        thin: true,
        zeroes_after_unmap: true,
        rotational: false,
        max_transfer_blocks: 16384,
        relative_port: 1,
        port_group: 1,
        target_port: "iqn.2026-11.org.braid-storage:vol,t,0x0001".into(),
        instance: None,
    }
}

/// The fuzz target `iscsi_unit`: what a target's logical unit reads from
/// an initiator beyond the PDU: the first 16 bytes are a CDB, the rest
/// its parameter list (and, split in two, what a second nexus sends with
/// the same CDB). The command goes the way the iSCSI target sends every
/// command, [`braid_scsi::dispatch`]: admitted (unit attentions, access
/// state), checked against the reservations, its data sized, decided;
/// what it hands back to be kept is decided as the target decides it
/// ([`braid_scsi::dispatch::reserve_out`], MODE SELECT's page parser).
/// What the medium does is the store's executor's; of it only UNMAP's
/// parameter list is read here. Beyond "never panics" it checks that the
/// reservations read back what they saved. Returns how many of the four
/// times the command was sent it was decided (got past the unit
/// attentions, the access state and the sizing of its data), so the
/// replay can check the seeds reach the decision.
pub fn unit(data: &[u8]) -> usize {
    use braid_scsi::cdb::unmap_ranges;
    use braid_scsi::dispatch::{self, Medium, Outcome, Step};
    use braid_scsi::lu::{LogicalUnit, Nexus};
    use braid_scsi::respond::mode_select;
    use braid_scsi::{rod, xcopy};
    use braid_scsi::{AccessState, Command, NexusName, PortGroup, Reservations};

    if data.len() < 16 {
        return 0;
    }
    let (cdb, params) = data.split_at(16);
    let Ok(cmd) = Command::parse(cdb) else {
        return 0;
    };
    let unit = fuzzed_unit();
    let lu = std::sync::Arc::new(LogicalUnit::new(Reservations::default()));
    let (a, b) = (
        lu.join(NexusName::new(
            "iqn.2026-11.org.example:a",
            [0x80, 0, 0, 0, 0, 1],
            1,
        )),
        lu.join(NexusName::new(
            "iqn.2026-11.org.example:b",
            [0x80, 0, 0, 0, 0, 2],
            2,
        )),
    );
    let medium = Medium {
        write_cache: true,
        atomic: true,
        compare_and_write: true,
    };
    let groups = || {
        vec![
            PortGroup {
                id: 1,
                state: AccessState::ActiveOptimized,
                ports: vec![1],
            },
            PortGroup {
                id: 2,
                state: AccessState::Standby,
                ports: vec![2],
            },
        ]
    };
    // Tokens made by a fuzzed POPULATE TOKEN, for the WRITE USING TOKEN
    // that may follow.
    let tokens: rod::Tokens<()> = rod::Tokens::default();
    let now = std::time::Duration::ZERO;
    let first = rod::Populate {
        timeout: std::time::Duration::from_secs(1),
        ranges: vec![rod::Range { lba: 8, blocks: 64 }],
    };
    let creator = rod::Creator {
        naa: unit.naa(),
        block_size: 512,
    };
    let made = tokens.create((), creator, first, now, &[1; rod::RANDOM_LEN]);
    let last_token = std::cell::RefCell::new(made.ok());
    // `cmd` from `n` with `params` as its data, as the target answers it
    // (an initiator sending the length its CDB names).
    let decided = std::cell::Cell::new(0);
    let send = |n: &Nexus, cmd: Command, params: &[u8]| -> Outcome {
        if let Some(o) = dispatch::admit(&unit, n, AccessState::ActiveOptimized, 0, &cmd) {
            return o;
        }
        if lu.conflicts(&n.name, &cmd) {
            return Outcome::Conflict;
        }
        let expected = cmd
            .data_out_len(512)
            .map_or(0, |l| l.min(u64::from(u32::MAX)) as u32);
        let (cmd, data) = match dispatch::data_out(&unit, cmd, expected) {
            None => (cmd, Vec::new()),
            Some(Err(sense)) => return Outcome::Check(sense),
            Some(Ok((cmd, _, total))) => {
                let mut d = params[..params.len().min(total as usize)].to_vec();
                d.resize(total as usize, 0);
                (cmd, d)
            }
        };
        decided.set(decided.get() + 1);
        match dispatch::decide(&lu, &n.name, &unit, medium, cmd, groups) {
            Step::Answer(o) => o,
            Step::UnitWide(Command::ModeSelect { ten, .. }) => mode_select(&unit, &data, ten, true)
                .map(|_| Vec::new())
                .into(),
            Step::UnitWide(cmd) => {
                let mut current = lu.reservations();
                match dispatch::reserve_out(&current, &n.name, cmd, &data) {
                    Ok((next, fx)) => {
                        let back =
                            Reservations::load(&next.save()).expect("braid reads what it saved");
                        assert_eq!(
                            back.save(),
                            next.save(),
                            "saved reservations read back the same"
                        );
                        *current = next;
                        drop(current);
                        lu.tell(fx.tell);
                        Outcome::Good(Vec::new())
                    }
                    Err(o) => o,
                }
            }
            Step::Medium(Command::Unmap { .. }) => {
                unmap_ranges(&data, 256).map(|_| Vec::new()).into()
            }
            Step::Medium(Command::ExtendedCopy { .. }) => {
                let found =
                    |naa: &[u8; 16]| (*naa == unit.naa()).then_some(((), unit.blocks, true));
                xcopy::parse(&data)
                    .and_then(|list| xcopy::resolve(&list, 512, found))
                    .map(|_| Vec::new())
                    .into()
            }
            Step::Medium(Command::PopulateToken { .. }) => rod::parse_populate(&data, unit.blocks)
                .and_then(|p| tokens.create((), creator, p, now, &[0; rod::RANDOM_LEN]))
                .map(|t| {
                    *last_token.borrow_mut() = Some(t);
                    Vec::new()
                })
                .into(),
            Step::Medium(Command::WriteUsingToken { .. }) => rod::parse_write(&data, unit.blocks)
                .and_then(|mut w| {
                    // The token made last (one is made before any input),
                    // where the input carries none of its own, so that the
                    // plan is reached.
                    if let Some(t) = *last_token.borrow() {
                        if w.token[0] == 0 {
                            w.token = t;
                        }
                    }
                    let taken = tokens.take(&w.token, now)?;
                    let pieces = rod::plan(&taken.ranges, w.offset, &w.ranges)?;
                    let written: u64 = pieces.iter().map(|p| p.blocks).sum();
                    let asked: u64 = w.ranges.iter().map(|r| u64::from(r.blocks)).sum();
                    assert!(written <= asked, "a token wrote past its ranges");
                    taken.put_back(w.delete, Some(now));
                    Ok(Vec::new())
                })
                .into(),
            Step::Medium(_) => Outcome::Good(Vec::new()),
        }
    };
    // Each nexus takes the power on condition first, as initiators do.
    for n in [&a, &b] {
        send(n, Command::TestUnitReady, &[]);
    }
    let (first, second) = params.split_at(params.len().min(24));
    let mut fuzzed = 0;
    for (n, p) in [(&a, first), (&b, second), (&a, second), (&b, first)] {
        let before = decided.get();
        send(n, cmd, p);
        fuzzed += decided.get() - before;
        send(n, Command::Reserve, &[]);
    }
    for action in 0..4 {
        send(
            &a,
            Command::PersistentReserveIn {
                action,
                alloc: u16::MAX,
            },
            &[],
        );
    }
    send(&b, Command::Release, &[]);
    let _ = Reservations::load(&String::from_utf8_lossy(params));
    fuzzed
}

/// What the `iscsi_target` fuzz target returns: how far an input got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TargetReached {
    pub logged_in: bool,
    /// Full-feature PDUs taken after the login.
    pub pdus: usize,
}

/// The fuzz target `iscsi_target`: everything a target reads from an
/// initiator, through braid's sans-IO target side. Login requests go to
/// the login state machine (with CHAP configured when the first byte says
/// so, so every CHAP step is reachable); once it completes, each PDU goes
/// where the target would send it: SCSI Commands to the command window
/// and the CDB parser, then their WRITE data through a write transfer
/// (R2Ts asked for, Data-Out checked against them), text requests to the
/// text parser. Beyond "never panics" it checks that a write transfer
/// never counts more bytes than the command has.
pub fn target(data: &[u8]) -> TargetReached {
    use crate::login::{Step, TargetConfig, TargetLogin};
    use crate::negotiate;
    use crate::pdu::Opcode;
    use crate::transfer::WriteTransfer;
    use crate::window::Window;
    use braid_scsi::dispatch::data_out;
    use braid_scsi::Command as Cdb;

    let Some((&mode, rest)) = data.split_first() else {
        return TargetReached::default();
    };
    let mut login = TargetLogin::new(TargetConfig {
        targets: vec!["iqn.2026-11.org.braid-storage:vol".into()],
        params: Params {
            max_recv_data: 8192,
            first_burst: 16384,
            max_burst: 65536,
            ..Params::default()
        },
        digests: negotiate::Digests {
            none: true,
            crc32c: true,
        },
        portal_group_tag: 1,
        access: std::sync::Arc::new(crate::access::Access::open((mode & 1 != 0).then(|| {
            Credentials {
                user: "u".into(),
                secret: b"twelve-bytes".to_vec(),
                mutual: (mode & 2 != 0).then(|| ("t".into(), b"target-secret".to_vec())),
            }
        }))),
        chap_id: 1,
        chap_challenge: [7; 16],
    });
    let mut framer = Framer::new(8192);
    let mut buf = BytesMut::from(rest);
    let mut session = None;
    let mut reached = TargetReached::default();
    let mut window = Window::new(0, 64);
    let mut writes: HashMap<u32, (WriteTransfer, u32)> = HashMap::new();
    let unit = fuzzed_unit();
    for _ in 0..MAX_PDUS {
        let Ok(Some(pdu)) = framer.next(&mut buf) else {
            break;
        };
        let Some(s) = &session else {
            match login.handle(&pdu) {
                Step::Continue(_) => continue,
                Step::Complete(_, s) => {
                    window = Window::new(s.exp_cmd_sn, 64);
                    framer.set(
                        Digests {
                            header: s.params.header_digest,
                            data: s.params.data_digest,
                        },
                        s.params.max_recv_data as usize,
                    );
                    session = Some(*s);
                    reached.logged_in = true;
                    continue;
                }
                Step::Fail(..) => break,
            }
        };
        reached.pdus += 1;
        let b = &pdu.bhs;
        match b.opcode() {
            Opcode::ScsiCommand => {
                let _ = window.place(b.u32_at(24));
                window.take();
                let Ok(cmd) = Cdb::parse(&b.0[32..48]) else {
                    continue;
                };
                // Sized as the target sizes it: what the CDB names, cut
                // to what the initiator said it would send.
                if let Some(Ok((_, _, total))) = data_out(&unit, cmd, b.u32_at(20)) {
                    let p = &s.params;
                    if let Ok(mut t) = WriteTransfer::new(
                        total,
                        (pdu.data.len() as u32).min(total),
                        p.initial_r2t,
                        p.first_burst,
                        p.max_burst,
                        p.max_outstanding_r2t,
                    ) {
                        let _ = t.r2ts();
                        writes.insert(b.itt(), (t, total));
                    }
                }
                window.finish();
            }
            Opcode::DataOut => {
                if let Some((t, total)) = writes.get_mut(&b.itt()) {
                    if let Ok(at) = t.data_out(b, pdu.data.len() as u32) {
                        assert!(
                            u64::from(at) + pdu.data.len() as u64 <= u64::from(*total),
                            "Data-Out accepted past the command's length"
                        );
                        let _ = t.r2ts();
                    }
                }
            }
            Opcode::TextRequest => {
                let _ = crate::text::parse(&pdu.data);
            }
            _ => {}
        }
    }
    reached
}
