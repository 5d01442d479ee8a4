//! EXTENDED COPY in braid's iSCSI target (VMware's full copy): libiscsi's
//! ExtendedCopy and ReceiveCopyResults suites run and pass; 64 MiB copied
//! by one command from one export of `braid serve` to another matches
//! the source byte for byte; and a copy within one export whose ranges
//! overlap ends as if every block had been read before any was written.

mod common;
mod iscsikit;

use braid_test_needs::needs;

use std::time::Duration;

use common::{cmd, free_port, output, random_file, sha256, sparse_file, Serve};
use iscsikit::{vpd, Initiator, Reply};

const PREFIX: &str = "iqn.2026-11.org.braid-storage:";

fn serve_two(dir: &std::path::Path, port: u16, size: usize) -> Serve {
    let src = random_file(dir, size, 34);
    let dst = sparse_file(dir, "dst.img", size as u64);
    Serve::start(&[
        "--iscsi",
        &port.to_string(),
        &format!("src={}", src.display()),
        &format!("dst={}", dst.display()),
    ])
}

fn login(port: u16, name: &str) -> Initiator {
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut i = Initiator::login(addr, &format!("{PREFIX}{name}"));
    // The power-on unit attention, answered once per new initiator port.
    let _ = i.exec(&[0, 0, 0, 0, 0, 0], &[], 0);
    i
}

/// The unit's NAA designator, from its VPD page 0x83.
fn naa(i: &mut Initiator) -> Vec<u8> {
    let r = i.exec(&iscsikit::vpd_cdb(0x83), &[], 256);
    assert!(r.good(), "VPD 0x83: {r:?}");
    vpd::designators(&r.data)
        .into_iter()
        .find(|d| d.association == 0 && d.kind == 3)
        .expect("an NAA designator")
        .value
}

/// An identification target descriptor (0xE4) naming `naa`, 512-byte
/// blocks.
fn target(naa: &[u8]) -> Vec<u8> {
    let mut d = vec![0u8; 32];
    d[0] = 0xe4;
    d[4] = 0x01;
    d[5] = 0x03;
    d[7] = naa.len() as u8;
    d[8..8 + naa.len()].copy_from_slice(naa);
    d[29..32].copy_from_slice(&[0, 2, 0]);
    d
}

/// A block-to-block segment descriptor (0x02).
fn segment(src: u16, dst: u16, blocks: u16, src_lba: u64, dst_lba: u64) -> Vec<u8> {
    let mut d = vec![0u8; 28];
    d[0] = 0x02;
    d[3] = 0x18;
    d[4..6].copy_from_slice(&src.to_be_bytes());
    d[6..8].copy_from_slice(&dst.to_be_bytes());
    d[10..12].copy_from_slice(&blocks.to_be_bytes());
    d[12..20].copy_from_slice(&src_lba.to_be_bytes());
    d[20..28].copy_from_slice(&dst_lba.to_be_bytes());
    d
}

/// EXTENDED COPY (LID1) of `targets` and `segments`, list identifier
/// `list_id` held for COPY STATUS.
fn extended_copy(
    i: &mut Initiator,
    list_id: u8,
    targets: &[Vec<u8>],
    segments: &[Vec<u8>],
) -> Reply {
    let (t, s) = (targets.concat(), segments.concat());
    let mut params = vec![0u8; 16];
    params[0] = list_id;
    params[2..4].copy_from_slice(&(t.len() as u16).to_be_bytes());
    params[8..12].copy_from_slice(&(s.len() as u32).to_be_bytes());
    params.extend(t);
    params.extend(s);
    let mut cdb = [0u8; 16];
    cdb[0] = 0x83;
    cdb[10..14].copy_from_slice(&(params.len() as u32).to_be_bytes());
    i.exec(&cdb, &params, 0)
}

/// RECEIVE COPY RESULTS, COPY STATUS of `list_id`.
fn copy_status(i: &mut Initiator, list_id: u8) -> Reply {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x84;
    cdb[2] = list_id;
    cdb[13] = 64;
    i.exec(&cdb, &[], 64)
}

#[needs("iscsi-test-cu")]
fn libiscsis_extended_copy_and_receive_copy_results_suites_run_and_pass() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let serve = serve_two(dir.path(), port, 16 << 20);
    let url = format!("iscsi://127.0.0.1:{port}/{PREFIX}dst/0");
    for suite in ["ALL.ExtendedCopy.*", "ALL.ReceiveCopyResults.*"] {
        let out = output(
            cmd("iscsi-test-cu").args(["--dataloss", "-t", suite, &url]),
            Duration::from_secs(120),
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let counts: Vec<u64> = text
            .lines()
            .find(|l| l.trim_start().starts_with("tests "))
            .unwrap_or_else(|| panic!("{suite}: no summary:\n{text}"))
            .split_whitespace()
            .skip(1)
            .filter_map(|n| n.parse().ok())
            .collect();
        assert!(
            !text.contains("not implemented"),
            "{suite} skipped tests:\n{text}"
        );
        let want = if suite.contains("Extended") { 6 } else { 2 };
        assert_eq!(
            counts[..4],
            [want, want, want, 0],
            "{suite}: total, ran, passed, failed\n{text}\n{}",
            serve.log()
        );
    }
}

#[test]
fn sixty_four_mib_copied_from_one_export_to_another_match_byte_for_byte() {
    const SIZE: usize = 64 << 20;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let serve = serve_two(dir.path(), port, SIZE);
    let mut dst = login(port, "dst");
    let mut src = login(port, "src");
    let targets = [target(&naa(&mut src)), target(&naa(&mut dst))];
    assert_ne!(targets[0], targets[1], "two units, two names");
    // Four segments of 16 MiB, in one command sent to the source's unit.
    const STEP: u16 = 32768;
    let segments: Vec<Vec<u8>> = (0..4u64)
        .map(|n| segment(0, 1, STEP, n * u64::from(STEP), n * u64::from(STEP)))
        .collect();
    let r = extended_copy(&mut src, 5, &targets, &segments);
    assert!(r.good(), "EXTENDED COPY: {r:?}\n{}", serve.log());
    assert_eq!(
        sha256(&dir.path().join("dst.img")),
        sha256(&dir.path().join(format!("random-{SIZE}-34.bin"))),
        "the destination file is the source, byte for byte"
    );
    // What the destination's own session reads is the copy too.
    let whole = std::fs::read(dir.path().join(format!("random-{SIZE}-34.bin"))).unwrap();
    let last = (SIZE / 512 - 2048) as u32;
    assert_eq!(dst.read10(last, 2048), whole[last as usize * 512..]);
    // COPY STATUS: completed, 4 segments, 64 MiB.
    let s = copy_status(&mut src, 5);
    assert!(s.good(), "COPY STATUS: {s:?}");
    assert_eq!(s.data, [0, 0, 0, 8, 0x01, 0, 4, 0, 0x04, 0, 0, 0]);
}

#[test]
fn a_copy_within_one_export_with_overlapping_ranges_reads_before_it_writes() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let serve = serve_two(dir.path(), port, 16 << 20);
    let mut i = login(port, "src");
    let me = [target(&naa(&mut i))];
    let before = std::fs::read(dir.path().join(format!("random-{}-34.bin", 16 << 20))).unwrap();
    // 12 MiB from block 0 to block 4096 (2 MiB on), then 10 MiB from
    // block 8192 back to block 0: one range after its source, one before,
    // each longer than what the target moves at a time.
    let r = extended_copy(
        &mut i,
        1,
        &me,
        &[segment(0, 0, 24576, 0, 4096), segment(0, 0, 20480, 8192, 0)],
    );
    assert!(r.good(), "EXTENDED COPY: {r:?}\n{}", serve.log());
    let mut want = before.clone();
    want.copy_within(0..24576 * 512, 4096 * 512);
    want.copy_within(8192 * 512..28672 * 512, 0);
    let after = std::fs::read(dir.path().join(format!("random-{}-34.bin", 16 << 20))).unwrap();
    if let Some(at) = (0..want.len()).find(|&b| after[b] != want[b]) {
        panic!(
            "the export differs from a copy read first at byte {at} (block {})",
            at / 512
        );
    }
    // Past the end: COPY ABORTED, and nothing written.
    let r = extended_copy(&mut i, 2, &me, &[segment(0, 0, 2, 0, (16 << 11) - 1)]);
    assert_eq!(r.sense, Some((0x0a, 0x00, 0x00)), "{r:?}");
    let again = std::fs::read(dir.path().join(format!("random-{}-34.bin", 16 << 20))).unwrap();
    assert!(again == after, "a refused copy wrote nothing");
}

#[test]
fn a_copy_into_an_export_another_host_reserved_is_a_reservation_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let serve = serve_two(dir.path(), port, 16 << 20);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    // Host A holds WRITE EXCLUSIVE on dst (register key 0xA, reserve).
    let host_a = iscsikit::who("iqn.2026-11.org.example:host-a", 1);
    let mut a = Initiator::login_as(addr, &format!("{PREFIX}dst"), &host_a);
    for (action, kind, key, sa_key) in [(0u8, 0u8, 0u64, 0xa_u64), (1, 1, 0xa, 0)] {
        let mut params = key.to_be_bytes().to_vec();
        params.extend_from_slice(&sa_key.to_be_bytes());
        params.extend_from_slice(&[0; 8]);
        let r = a.exec(&[0x5f, action, kind, 0, 0, 0, 0, 0, 24, 0], &params, 0);
        assert!(r.good(), "PERSISTENT RESERVE OUT {action}: {r:?}");
    }
    // Host B copies src onto dst through its session to src.
    let host_b = iscsikit::who("iqn.2026-11.org.example:host-b", 1);
    let mut b = Initiator::login_as(addr, &format!("{PREFIX}src"), &host_b);
    let mut dst_naa = login(port, "dst");
    let targets = [target(&naa(&mut b)), target(&naa(&mut dst_naa))];
    let r = extended_copy(&mut b, 3, &targets, &[segment(0, 1, 2048, 0, 0)]);
    assert_eq!(
        r.status,
        iscsikit::RESERVATION_CONFLICT,
        "{r:?}\n{}",
        serve.log()
    );
    let dst = std::fs::read(dir.path().join("dst.img")).unwrap();
    assert!(
        dst.iter().all(|&x| x == 0),
        "nothing reached the reserved export"
    );
    // Host A's own copy goes through its reservation.
    let mut a_src = Initiator::login_as(addr, &format!("{PREFIX}src"), &host_a);
    let r = extended_copy(&mut a_src, 3, &targets, &[segment(0, 1, 2048, 0, 0)]);
    assert!(r.good(), "the holder's copy: {r:?}");
}
