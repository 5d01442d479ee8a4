//! COMPARE AND WRITE (VMware's ATS) is atomic against every other writer
//! of the LUN, NBD's included: no write of either protocol lands between
//! its compare and its write. Shown once step by step (a COMPARE AND
//! WRITE stopped between the two, an NBD write of its block then waits
//! for it), and once under load (NBD writes and COMPARE AND WRITEs from
//! two portals on one block, every outcome checked against the history).

mod common;
mod iscsikit;

use braid_test_needs::needs;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{cmd, free_port, output, Serve};
use iscsikit::inproc::InProcess;
use iscsikit::{Initiator, CHECK_CONDITION};

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";

fn caw_cdb(lba: u64, blocks: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x89;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = blocks;
    c
}

fn nbd_write(addr: std::net::SocketAddr, fill: u8, offset: u64) -> std::process::Output {
    output(
        cmd("nbdsh").args([
            "-u",
            &format!("nbd://{addr}/vol"),
            "-c",
            &format!("h.pwrite(b'\\x{fill:02x}' * 512, {offset})"),
        ]),
        Duration::from_secs(60),
    )
}

#[needs("nbdsh")]
fn an_nbd_write_waits_while_a_compare_and_write_holds_its_block() {
    let srv = InProcess::start(&["127.0.0.1"]);
    let mut i = Initiator::login(srv.portals[0], TARGET);
    i.write10(0, &[b'A'; 512]);
    let locks = &srv.export.writes;
    locks.pause(true);
    let mut data = vec![b'A'; 512];
    data.extend([b'W'; 512]);
    let caw = i.send_command(&caw_cdb(0, 1), &data, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while locks.paused() == 0 {
        assert!(
            Instant::now() < deadline,
            "the COMPARE AND WRITE never compared"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Compared, not yet written: an NBD write of the block now.
    let nbd = srv.nbd;
    let writer = std::thread::spawn(move || nbd_write(nbd, b'X', 0));
    while locks.blocked() == 0 && !writer.is_finished() {
        assert!(
            Instant::now() < deadline,
            "the NBD write neither waited nor ended"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    locks.pause(false);
    let out = writer.join().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(i.wait(caw).good(), "the blocks matched when compared");
    assert_eq!(
        srv.read(0, 512),
        [b'X'; 512],
        "the NBD write landed after the COMPARE AND WRITE, not between its compare and its write"
    );
    // And a miscompare names the first byte that differed.
    let mut data = vec![b'X'; 512];
    data[37] = b'?';
    data.extend([b'Z'; 512]);
    let r = i.exec(&caw_cdb(0, 1), &data, 0);
    assert_eq!(
        (r.status, r.sense),
        (CHECK_CONDITION, Some((0xe, 0x1d, 0x00)))
    );
    assert_eq!(
        srv.read(0, 512),
        [b'X'; 512],
        "nothing written on a miscompare"
    );
}

/// A block that says who wrote it: its id, then the id's bytes repeated,
/// so that a block torn between two writers shows.
fn block(id: u64) -> Vec<u8> {
    id.to_be_bytes().repeat(64)
}

/// Its id, if the block is whole. A read that races a write may see
/// part of each (reads take no lock); read again and it is whole, unless
/// two writes really tore it.
fn id_of(b: &[u8]) -> Option<u64> {
    let id = u64::from_be_bytes(b[..8].try_into().unwrap());
    (b == block(id)).then_some(id)
}

/// Reads block 0 until it is whole (a block torn for 100 reads in a row
/// was torn by its writers).
fn read_whole(i: &mut Initiator) -> u64 {
    (0..100)
        .find_map(|_| id_of(&i.read10(0, 1)))
        .expect("block 0 stays torn: two writes landed over each other")
}

/// One session's COMPARE AND WRITE loop on block 0 until `stop`: read
/// it, and replace what was read with a new value. Returns the (compare,
/// write) ids of every one that succeeded.
fn caw_loop(addr: std::net::SocketAddr, session: u64, stop: &AtomicBool) -> Vec<(u64, u64)> {
    let mut who = iscsikit::DEFAULT_INITIATOR;
    who.isid[5] = session as u8;
    let mut i = Initiator::login_as(addr, TARGET, &who);
    let mut done = Vec::new();
    for n in 1..=20_000u64 {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let seen = read_whole(&mut i);
        let new = session << 32 | n;
        let mut data = block(seen);
        data.extend(block(new));
        let r = i.exec(&caw_cdb(0, 1), &data, 0);
        match (r.status, r.sense) {
            (0, _) => done.push((seen, new)),
            (CHECK_CONDITION, Some((0xe, 0x1d, 0))) => {}
            other => panic!("COMPARE AND WRITE: {other:?}"),
        }
    }
    done
}

#[needs("nbdsh")]
fn compare_and_writes_from_two_portals_and_nbd_writes_of_one_block_stay_atomic() {
    let dir = tempfile::tempdir().unwrap();
    let disk = common::sparse_file(dir.path(), "disk.img", 1 << 20);
    let port = free_port();
    let serve = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.2:0",
        "--iscsi",
        &port.to_string(),
        &format!("vol={}", disk.display()),
    ]);
    let mut first = Initiator::login(format!("127.0.0.1:{port}").parse().unwrap(), TARGET);
    first.write10(0, &block(1));
    // NBD writes a new value, then reads what the block holds.
    const NBD_WRITES: u64 = 400;
    // A read racing a write may see part of each (reads take no lock):
    // NBD reads again until the block is whole.
    let script = format!(
        "for k in range({NBD_WRITES}):\n\
         \x20   x = (1000000 + k).to_bytes(8, 'big') * 64\n\
         \x20   h.pwrite(x, 0)\n\
         \x20   for _ in range(100):\n\
         \x20       r = h.pread(512, 0)\n\
         \x20       if r == r[:8] * 64:\n\
         \x20           break\n\
         \x20   print(1000000 + k, int.from_bytes(r[:8], 'big'), r == r[:8] * 64)\n"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let loops: Vec<_> = [(1u64, "127.0.0.1"), (2, "127.0.0.2")]
        .into_iter()
        .map(|(s, host)| {
            let stop = stop.clone();
            let addr = format!("{host}:{port}").parse().unwrap();
            std::thread::spawn(move || caw_loop(addr, s, &stop))
        })
        .collect();
    let nbd = output(
        cmd("nbdsh").args(["-u", &serve.uri("vol"), "-c", &script]),
        Duration::from_secs(120),
    );
    stop.store(true, Ordering::Release);
    let mut edges: HashMap<u64, u64> = HashMap::new();
    let mut successes = 0;
    for l in loops {
        for (seen, new) in l.join().unwrap() {
            successes += 1;
            // Two successful compares against one version would mean one
            // of them compared something already overwritten.
            assert!(
                edges.insert(seen, new).is_none(),
                "two COMPARE AND WRITEs both replaced {seen:#x}"
            );
        }
    }
    let text = String::from_utf8_lossy(&nbd.stdout);
    assert!(
        nbd.status.success(),
        "{}",
        String::from_utf8_lossy(&nbd.stderr)
    );
    let mut checked = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (wrote, read): (u64, u64) = (f[0].parse().unwrap(), f[1].parse().unwrap());
        assert_eq!(
            f[2], "True",
            "block 0 stays torn: two writes landed over each other"
        );
        // Between NBD's write and its read only COMPARE AND WRITEs ran,
        // each replacing the version it compared: what NBD read must be
        // its own write or follow from it, one replacement at a time.
        let mut at = wrote;
        let mut steps = 0;
        while at != read {
            at = *edges.get(&at).unwrap_or_else(|| {
                panic!(
                    "NBD wrote {wrote:#x} and read {read:#x}, which no chain of \
                     COMPARE AND WRITEs from its write explains: one landed on a \
                     version it had not compared"
                )
            });
            steps += 1;
            assert!(steps <= edges.len(), "a cycle");
        }
        checked += 1;
    }
    assert_eq!(checked, NBD_WRITES);
    assert!(successes > 0, "no COMPARE AND WRITE ever succeeded");
    eprintln!("{successes} COMPARE AND WRITEs succeeded among {NBD_WRITES} NBD writes");
}
