//! The store's limits over iSCSI, as over NBD: READ data held between the
//! storage and the sockets is bounded per connection (`max_bytes`) and
//! across the server (`max_total_bytes`), and so is WRITE data awaited,
//! so initiators that send READs and never read their sockets, or WRITEs
//! and never their data, cannot take the host's memory (measured by the
//! target's own figure of payload held, not by a time); the command
//! window is no wider than `max_requests`; a session that sends nothing
//! is closed at `idle_timeout`.

mod iscsikit;

use std::time::Duration;

use braid_iscsi_target::IscsiConfig;
use braid_store::Limits;
use iscsikit::inproc::IscsiOnly;
use iscsikit::{who, Initiator};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";
const MIB: usize = 1 << 20;

/// READ(16) of `blocks` 512-byte blocks at `lba`.
fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x88;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// An iSCSI target over 64 MiB of memory with `limits`, in this process.
fn start(limits: Limits) -> IscsiOnly {
    let cfg = IscsiConfig {
        limits,
        ..IscsiConfig::default()
    };
    IscsiOnly::over_memory(cfg, 64 << 20)
}

/// `n` sessions of initiators named after `role`.
fn logins(server: &IscsiOnly, role: &str, n: u8) -> Vec<Initiator> {
    let name = format!("iqn.2026-11.org.example:{role}");
    (1..=n)
        .map(|isid| Initiator::login_as(server.addr, TARGET, &who(&name, isid)))
        .collect()
}

#[test]
fn sessions_that_never_read_hold_no_more_than_the_servers_bound() {
    let server = start(Limits {
        max_bytes: 32 * MIB,
        max_total_bytes: 16 * MIB,
        ..Limits::default()
    });
    // Eight sessions, each asking for 48 MiB it never reads: 384 MiB in
    // all, each session's share alone (32 MiB) twice the server's bound.
    let mut sessions = logins(&server, "reader", 8);
    for s in &mut sessions {
        for k in 0..48u64 {
            s.send_command(&read16(k * 2048, 2048), &[], MIB as u32);
        }
    }
    // Until the figure stops moving (sockets full, commands waiting).
    let (mut most, mut still) = (0, 0);
    for _ in 0..400 {
        std::thread::sleep(Duration::from_millis(25));
        let now = server.handle.payload_in_flight();
        if now > most {
            (most, still) = (now, 0);
        } else {
            still += 1;
            if still >= 40 {
                break;
            }
        }
    }
    assert!(
        most <= 16 * MIB,
        "READ data held across sessions: {most} bytes, past max_total_bytes (16 MiB)"
    );
    assert!(
        most >= 8 * MIB,
        "the sessions held only {most} bytes: the load never reached the bound"
    );
}

#[test]
fn the_command_window_is_no_wider_than_max_requests() {
    let server = start(Limits {
        max_requests: 4,
        ..Limits::default()
    });
    let mut i = Initiator::login(server.addr, TARGET);
    i.send_command(&[0; 6], &[], 0);
    let r = i.next_pdu();
    let (exp, max) = (r.bhs.u32_at(28), r.bhs.u32_at(32));
    assert_eq!(
        max.wrapping_sub(exp).wrapping_add(1),
        4,
        "the command window (ExpCmdSN {exp}, MaxCmdSN {max}) with max_requests 4"
    );
}

#[test]
fn a_session_that_sends_nothing_is_closed_at_the_idle_timeout() {
    let server = start(Limits {
        idle_timeout: Some(Duration::from_millis(300)),
        ..Limits::default()
    });
    let mut i = Initiator::login(server.addr, TARGET);
    assert!(
        i.closed_within(Duration::from_secs(10)),
        "a session idle past --idle-timeout was kept open"
    );
}

#[test]
fn writes_whose_data_never_comes_hold_no_more_than_the_servers_bound() {
    let server = start(Limits {
        max_total_bytes: 16 * MIB,
        ..Limits::default()
    });
    // Four sessions announce eight 1 MiB WRITEs each and send no data:
    // 32 MiB in all, 8 MiB a session (within a connection's own bound).
    let mut sessions = logins(&server, "writer", 4);
    let mut taken = 0;
    for s in &mut sessions {
        for k in 0..8u32 {
            s.write10_without_data(k * 2048, 2048);
        }
        // One answer each: an R2T asking for the data (taken), or TASK
        // SET FULL.
        for _ in 0..8 {
            let p = s.next_pdu();
            match p.bhs.opcode() {
                braid_iscsi::Opcode::R2t => taken += 1,
                braid_iscsi::Opcode::ScsiResponse => {
                    assert_eq!(p.bhs.0[3], 0x28, "TASK SET FULL");
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!(
        taken * MIB,
        16 * MIB,
        "WRITE data awaited across sessions, with max_total_bytes 16 MiB"
    );
    assert_eq!(server.handle.payload_in_flight(), 16 * MIB);
}
