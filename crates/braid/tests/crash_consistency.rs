//! Crash consistency of `braid serve` on a file export: a write workload
//! with periodic FLUSH and some FUA writes runs through the multipath
//! initiator while the server is killed with SIGKILL at a random moment,
//! ten times; after every restart on the same file, everything the NBD
//! spec says must have survived reads back.
//!
//! # What must survive (spec: "NBD_CMD_FLUSH", "NBD_CMD_FLAG_FUA")
//!
//! - A write acknowledged with FUA is on stable storage.
//! - A FLUSH acknowledged makes stable every write that had been
//!   acknowledged before the FLUSH was sent. Writes still in flight when it
//!   was sent are not covered, nor are writes acknowledged by a server that
//!   has since died and was never flushed.
//! - Nothing else is promised: an acknowledged write that no FLUSH or FUA
//!   covered may be lost, and a write in flight at the kill may land or not.
//!
//! # How a block's content is judged
//!
//! The volume is cut into 4 KiB blocks and each block belongs to one worker,
//! which writes it only after its previous write of that block has ended. So
//! a block's writes form one sequence, and their versions (1, 2, 3, ...,
//! counted across server lifetimes; 0 is the zeroes of the fresh sparse
//! file) only grow in the order they were sent. For each block the test
//! keeps every version ever sent, and the newest *durable* one: the
//! highest version acknowledged with FUA, or acknowledged before a FLUSH
//! that was then acknowledged by the same server lifetime. After a crash,
//! the block may hold the durable version or any version sent after it
//! (each may have reached the file before the kill, even if later ones
//! did not), and nothing else: not an older version (a lost write), not a
//! version never sent, not garbage. Because the spec promises no atomicity
//! for a write cut short, every 512-byte sector is judged on its own: each
//! carries its block, version and sector number, and a block whose sectors
//! show different allowed versions is counted as torn but not a failure.
//!
//! "Acknowledged before the FLUSH was sent" is tracked with one counter
//! that every write bumps when its acknowledgement comes back; the flusher
//! reads it just before sending a FLUSH, so every write at or below that
//! number had completed before the FLUSH left. Reading it early only makes
//! the test claim less, never more.
//!
//! A SIGKILL drops only what the server process held; a file backend that
//! wrote with pwrite has handed the data to the kernel, so in practice far
//! more survives than the spec promises. The test checks the promise, not
//! the practice: it catches a server that acknowledges before writing (a
//! user-space write-back cache, a reply sent before the backend call), a
//! FLUSH or FUA answered before the data is down, or a stale write landing
//! after a newer one, without claiming anything about power loss.

mod common;
mod crashkit;

use std::time::Duration;

use common::{signal, sparse_file};
use crashkit::{decode_sector, sector_bytes, wait_dead, BLOCK, BLOCKS, SECTOR};

const KILLS: usize = 10;
/// Bound on the whole test.
const WHOLE_TEST: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_flushes_and_fua_writes_survive_sigkill() {
    let dir = tempfile::tempdir().expect("temporary dir");
    let file = sparse_file(dir.path(), "disk.img", BLOCKS * BLOCK as u64);
    let seed = crashkit::seed("crash consistency");
    let run = crashkit::cycles(&file, KILLS, seed, |serve, _| {
        signal(serve.pid(), libc::SIGKILL);
        wait_dead(serve);
        "SIGKILL".into()
    });
    tokio::time::timeout(WHOLE_TEST, run)
        .await
        .expect("crash-consistency test bounded in time");
}

#[test]
fn sectors_decode_to_their_version_and_nothing_else() {
    let mut s = [0u8; SECTOR];
    sector_bytes(5, 3, 42, &mut s);
    assert_eq!(decode_sector(5, 3, &s), Some(42));
    assert_eq!(decode_sector(5, 2, &s), None, "another sector's bytes");
    assert_eq!(decode_sector(6, 3, &s), None, "another block's bytes");
    assert_eq!(decode_sector(5, 3, &[0u8; SECTOR]), Some(0));
    s[300] ^= 1;
    assert_eq!(decode_sector(5, 3, &s), None, "one bit flipped");
}
