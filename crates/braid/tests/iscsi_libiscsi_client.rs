//! A client of braid's iSCSI target written against libiscsi's C API (the
//! library qemu and many tools use), built here from
//! `tests/libiscsi/qd_client.c`: 32 MiB written with WRITE(16) at queue
//! depth 32 and read back byte for byte, then read once more over NBD
//! from the same export and compared with the pattern it wrote.

mod common;

use braid_test_needs::needs;

use std::process::Command;
use std::time::Duration;

use common::{cmd, free_port, output, sparse_file, Serve};

const CHUNK: usize = 64 << 10;
const CHUNKS: usize = 512;

/// The byte the client writes at `at` of chunk `chunk` (qd_client.c's
/// pattern()).
fn pattern(seed: u32, chunk: u64, at: u32) -> u8 {
    let mut x = seed ^ (chunk as u32).wrapping_mul(0x9e37_79b9) ^ at;
    x ^= x >> 13;
    x = x.wrapping_mul(0x5bd1_e995);
    x ^= x >> 15;
    x as u8
}

#[needs("gcc", "libiscsi-dev", "nbdcopy")]
fn libiscsi_writes_at_queue_depth_and_reads_back_over_iscsi_and_nbd() {
    let dir = tempfile::tempdir().unwrap();
    let client = dir.path().join("qd_client");
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/libiscsi/qd_client.c");
    let built = output(
        Command::new("gcc")
            .args(["-O2", "-Wall", "-Werror", "-o"])
            .arg(&client)
            .arg(source)
            .arg("-liscsi"),
        Duration::from_secs(60),
    );
    assert!(
        built.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&built.stderr)
    );

    let disk = sparse_file(dir.path(), "disk.img", (CHUNK * CHUNKS) as u64);
    let port = free_port();
    let serve = Serve::start(&[
        "--iscsi",
        &port.to_string(),
        &format!("vol={}", disk.display()),
    ]);
    let seed = 20261126u32;
    let url = format!("iscsi://127.0.0.1:{port}/iqn.2026-11.org.braid-storage:vol/0");
    let out = output(
        Command::new(&client).args([&url, &CHUNKS.to_string(), "32", &seed.to_string()]),
        Duration::from_secs(120),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the libiscsi client failed:\n{text}\n{}",
        serve.log()
    );
    assert!(text.contains("every byte as written"), "{text}");

    let copy = dir.path().join("over-nbd.img");
    let nbd = output(
        cmd("nbdcopy").arg(serve.uri("vol")).arg(&copy),
        Duration::from_secs(120),
    );
    assert!(
        nbd.status.success(),
        "nbdcopy: {}",
        String::from_utf8_lossy(&nbd.stderr)
    );
    let data = std::fs::read(&copy).unwrap();
    assert_eq!(data.len(), CHUNK * CHUNKS);
    for (c, chunk) in data.chunks(CHUNK).enumerate() {
        if let Some(at) = (0..CHUNK).find(|&i| chunk[i] != pattern(seed, c as u64, i as u32)) {
            panic!("over NBD, chunk {c} differs from what libiscsi wrote at byte {at}");
        }
    }
}
