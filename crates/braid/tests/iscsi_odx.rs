//! Windows' token copy (ODX: POPULATE TOKEN, RECEIVE ROD TOKEN
//! INFORMATION, WRITE USING TOKEN) against `braid serve` over TCP, the
//! commands spelled as Windows sends them: a token for ranges of one
//! export written onto another export, checked byte for byte in the
//! files behind; a token that is unknown, expired or for ranges past the
//! end refused before anything is written; a destination another host
//! reserved answered RESERVATION CONFLICT.

mod common;
mod iscsikit;

use std::time::Duration;

use common::{free_port, random_file, sparse_file, Serve};
use iscsikit::{Initiator, Reply};

const PREFIX: &str = "iqn.2026-11.org.braid-storage:";
const SIZE: usize = 64 << 20;
const AUR: u32 = 0x0080_0000;

fn serve_two(dir: &std::path::Path, port: u16) -> Serve {
    let src = random_file(dir, SIZE, 38);
    let dst = sparse_file(dir, "dst.img", SIZE as u64);
    Serve::start(&[
        &format!("--iscsi={port}"),
        &format!("src={}", src.display()),
        &format!("dst={}", dst.display()),
    ])
}

fn source(dir: &std::path::Path) -> Vec<u8> {
    std::fs::read(dir.join(format!("random-{SIZE}-38.bin"))).unwrap()
}

fn login(port: u16, name: &str) -> Initiator {
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut i = Initiator::login(addr, &format!("{PREFIX}{name}"));
    // The power-on unit attention, answered once per new initiator port.
    let _ = i.exec(&[0, 0, 0, 0, 0, 0], &[], 0);
    i
}

fn ranges(list: &[(u64, u32)]) -> Vec<u8> {
    let mut d = Vec::new();
    for (lba, blocks) in list {
        d.extend_from_slice(&lba.to_be_bytes());
        d.extend_from_slice(&blocks.to_be_bytes());
        d.extend_from_slice(&[0; 4]);
    }
    d
}

fn token_cdb(action: u8, list_id: u32, len: usize) -> [u8; 16] {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x83;
    cdb[1] = action;
    cdb[6..10].copy_from_slice(&list_id.to_be_bytes());
    cdb[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    cdb
}

/// POPULATE TOKEN of `list` with inactivity timeout `timeout` seconds.
fn populate(i: &mut Initiator, list_id: u32, timeout: u32, list: &[(u64, u32)]) -> Reply {
    let r = ranges(list);
    let mut p = vec![0u8; 16];
    p[0..2].copy_from_slice(&((14 + r.len()) as u16).to_be_bytes());
    p[4..8].copy_from_slice(&timeout.to_be_bytes());
    p[14..16].copy_from_slice(&(r.len() as u16).to_be_bytes());
    p.extend(r);
    i.exec(&token_cdb(0x10, list_id, p.len()), &p, 0)
}

/// WRITE USING TOKEN of `token` onto `list`, `offset` blocks into it.
fn write_using(
    i: &mut Initiator,
    list_id: u32,
    token: &[u8],
    offset: u64,
    list: &[(u64, u32)],
) -> Reply {
    write_using_flags(i, list_id, 0, token, offset, list)
}

/// The same with its flags byte (DEL_TKN is 0x02).
fn write_using_flags(
    i: &mut Initiator,
    list_id: u32,
    flags: u8,
    token: &[u8],
    offset: u64,
    list: &[(u64, u32)],
) -> Reply {
    let r = ranges(list);
    let mut p = vec![0u8; 536];
    p[0..2].copy_from_slice(&((534 + r.len()) as u16).to_be_bytes());
    p[2] = flags;
    p[8..16].copy_from_slice(&offset.to_be_bytes());
    p[16..528].copy_from_slice(token);
    p[534..536].copy_from_slice(&(r.len() as u16).to_be_bytes());
    p.extend(r);
    i.exec(&token_cdb(0x11, list_id, p.len()), &p, 0)
}

/// RECEIVE ROD TOKEN INFORMATION about `list_id`: (copy operation
/// status, transfer count in blocks, the token if one was made).
fn rrti(i: &mut Initiator, list_id: u32) -> (u8, u64, Option<Vec<u8>>) {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x84;
    cdb[1] = 0x07;
    cdb[2..6].copy_from_slice(&list_id.to_be_bytes());
    cdb[10..14].copy_from_slice(&1024u32.to_be_bytes());
    let r = i.exec(&cdb, &[], 1024);
    assert!(r.good(), "RECEIVE ROD TOKEN INFORMATION {list_id}: {r:?}");
    let d = &r.data;
    assert_eq!(d[15], 0xf1, "a transfer count in blocks");
    let count = u64::from_be_bytes(d[16..24].try_into().unwrap());
    let at = 32 + usize::from(d[13]);
    let descriptors = u32::from_be_bytes(d[at..at + 4].try_into().unwrap());
    let token = (descriptors > 0).then(|| d[at + 6..at + 6 + 512].to_vec());
    (d[5], count, token)
}

fn blocks(data: &[u8], lba: u64, n: u64) -> &[u8] {
    &data[(lba * 512) as usize..((lba + n) * 512) as usize]
}

#[test]
fn a_token_of_one_exports_ranges_written_onto_another_matches_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let serve = serve_two(dir.path(), port);
    let (mut src, mut dst) = (login(port, "src"), login(port, "dst"));
    // Two ranges, 32 MiB and 8 MiB, apart and out of order: the token's
    // data is the first then the second.
    let token_ranges = [(40_000, 65_536), (4_096, 16_384)];
    let r = populate(&mut src, 7, 0, &token_ranges);
    assert!(r.good(), "POPULATE TOKEN: {r:?}\n{}", serve.log());
    let (status, count, token) = rrti(&mut src, 7);
    assert_eq!((status, count), (0x01, 81_920));
    let token = token.expect("POPULATE TOKEN's token");
    assert_eq!(&token[0..4], &AUR.to_be_bytes());

    // The whole token onto dst at block 1000, then its last 4 MiB again
    // at block 120000, 73728 blocks (36 MiB) into the token.
    let r = write_using(&mut dst, 9, &token, 0, &[(1_000, 81_920)]);
    assert!(r.good(), "WRITE USING TOKEN: {r:?}\n{}", serve.log());
    assert_eq!(rrti(&mut dst, 9), (0x01, 81_920, None));
    let r = write_using(&mut dst, 10, &token, 73_728, &[(120_000, 8_192)]);
    assert!(r.good(), "WRITE USING TOKEN at an offset: {r:?}");
    assert_eq!(rrti(&mut dst, 10).1, 8_192);

    let (want, got) = (
        source(dir.path()),
        std::fs::read(dir.path().join("dst.img")).unwrap(),
    );
    assert!(blocks(&got, 1_000, 65_536) == blocks(&want, 40_000, 65_536));
    assert!(blocks(&got, 66_536, 16_384) == blocks(&want, 4_096, 16_384));
    assert!(blocks(&got, 120_000, 8_192) == blocks(&want, 12_288, 8_192));
    assert!(
        blocks(&got, 0, 1_000).iter().all(|&b| b == 0)
            && blocks(&got, 82_920, 120_000 - 82_920)
                .iter()
                .all(|&b| b == 0),
        "nothing written outside the destination ranges"
    );
    // What dst's own session reads is the copy too.
    assert_eq!(dst.read10(1_000, 8), blocks(&want, 40_000, 8));

    // Past what the token holds: what it holds is written, and the
    // transfer count says how much.
    let r = write_using(&mut dst, 11, &token, 81_900, &[(0, 100)]);
    assert!(r.good(), "{r:?}");
    assert_eq!(rrti(&mut dst, 11), (0x01, 20, None));
    let got = std::fs::read(dir.path().join("dst.img")).unwrap();
    assert!(blocks(&got, 0, 20) == blocks(&want, 4_096 + 16_364, 20));
    assert!(blocks(&got, 20, 80).iter().all(|&b| b == 0));
}

#[test]
fn a_token_unknown_expired_or_out_of_range_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let serve = serve_two(dir.path(), port);
    let (mut src, mut dst) = (login(port, "src"), login(port, "dst"));
    let last = (SIZE / 512) as u64;
    // Ranges past the end of the unit: LBA OUT OF RANGE, no token.
    let r = populate(&mut src, 1, 0, &[(last - 4, 8)]);
    assert_eq!(r.sense, Some((0x05, 0x21, 0x00)), "{r:?}");
    let (status, _, token) = rrti(&mut src, 1);
    assert_eq!((status, token), (0x02, None));

    // A forged token: INVALID TOKEN OPERATION, TOKEN UNKNOWN.
    let mut forged = vec![0u8; 512];
    forged[0..4].copy_from_slice(&AUR.to_be_bytes());
    forged[6..8].copy_from_slice(&0x01f8u16.to_be_bytes());
    forged[200] = 0x77;
    let r = write_using(&mut dst, 2, &forged, 0, &[(0, 8)]);
    assert_eq!(r.sense, Some((0x05, 0x23, 0x04)), "{r:?}");

    // A real token, its ranges past dst's end: refused before a copy.
    assert!(populate(&mut src, 3, 1, &[(0, 64)]).good());
    let token = rrti(&mut src, 3).2.unwrap();
    let r = write_using(&mut dst, 4, &token, 0, &[(last - 8, 64)]);
    assert_eq!(r.sense, Some((0x05, 0x21, 0x00)), "{r:?}");
    // A token whose writer asked it deleted (DEL_TKN) is gone after.
    assert!(populate(&mut src, 6, 0, &[(0, 8)]).good());
    let deleted = rrti(&mut src, 6).2.unwrap();
    let mut scratch = login(port, "src");
    let r = write_using_flags(&mut scratch, 7, 0x02, &deleted, 0, &[(1_000, 8)]);
    assert!(r.good(), "{r:?}");
    let r = write_using(&mut scratch, 8, &deleted, 0, &[(1_000, 8)]);
    assert_eq!(r.sense, Some((0x05, 0x23, 0x09)), "{r:?}");
    // And once its one second of inactivity has passed: TOKEN EXPIRED.
    std::thread::sleep(Duration::from_millis(2_500));
    let r = write_using(&mut dst, 5, &token, 0, &[(0, 64)]);
    assert_eq!(r.sense, Some((0x05, 0x23, 0x07)), "{r:?}\n{}", serve.log());
    let (status, count, _) = rrti(&mut dst, 5);
    assert_eq!((status, count), (0x02, 0));
    let got = std::fs::read(dir.path().join("dst.img")).unwrap();
    assert!(got.iter().all(|&b| b == 0), "a refused copy wrote nothing");
}

#[test]
fn a_token_written_onto_an_export_another_host_reserved_is_a_reservation_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let serve = serve_two(dir.path(), port);
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    // Host A holds WRITE EXCLUSIVE on dst.
    let host_a = iscsikit::who("iqn.2026-11.org.example:host-a", 1);
    let mut a = Initiator::login_as(addr, &format!("{PREFIX}dst"), &host_a);
    let _ = a.exec(&[0, 0, 0, 0, 0, 0], &[], 0);
    for (action, kind, key, sa_key) in [(0u8, 0u8, 0u64, 0xa_u64), (1, 1, 0xa, 0)] {
        let mut params = key.to_be_bytes().to_vec();
        params.extend_from_slice(&sa_key.to_be_bytes());
        params.extend_from_slice(&[0; 8]);
        let r = a.exec(&[0x5f, action, kind, 0, 0, 0, 0, 0, 24, 0], &params, 0);
        assert!(r.good(), "PERSISTENT RESERVE OUT {action}: {r:?}");
    }
    // Host B makes a token of src and writes it onto dst.
    let host_b = iscsikit::who("iqn.2026-11.org.example:host-b", 1);
    let mut b_src = Initiator::login_as(addr, &format!("{PREFIX}src"), &host_b);
    let mut b_dst = Initiator::login_as(addr, &format!("{PREFIX}dst"), &host_b);
    for i in [&mut b_src, &mut b_dst] {
        let _ = i.exec(&[0, 0, 0, 0, 0, 0], &[], 0);
    }
    assert!(populate(&mut b_src, 1, 0, &[(0, 2048)]).good());
    let token = rrti(&mut b_src, 1).2.unwrap();
    let r = write_using(&mut b_dst, 2, &token, 0, &[(0, 2048)]);
    assert_eq!(
        r.status,
        iscsikit::RESERVATION_CONFLICT,
        "{r:?}\n{}",
        serve.log()
    );
    let got = std::fs::read(dir.path().join("dst.img")).unwrap();
    assert!(
        got.iter().all(|&x| x == 0),
        "nothing reached the reserved export"
    );
    // The holder writes the same token through its reservation.
    let r = write_using(&mut a, 3, &token, 0, &[(0, 2048)]);
    assert!(r.good(), "the holder's write: {r:?}");
    let got = std::fs::read(dir.path().join("dst.img")).unwrap();
    assert!(blocks(&got, 0, 2048) == blocks(&source(dir.path()), 0, 2048));
}

#[test]
fn the_unit_says_it_offers_token_copy_where_windows_looks() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _serve = serve_two(dir.path(), port);
    let mut i = login(port, "src");
    let std = i.exec(&[0x12, 0, 0, 0, 96, 0], &[], 96);
    assert_eq!(std.data[5] & 0x08, 0x08, "3PC in the standard INQUIRY data");
    let r = i.exec(&iscsikit::vpd_cdb(0x8f), &[], 1024);
    assert!(r.good(), "VPD 0x8F: {r:?}");
    let page = &r.data;
    let mut at = 4;
    let mut kinds = Vec::new();
    while at + 4 <= page.len() {
        kinds.push(u16::from_be_bytes([page[at], page[at + 1]]));
        at += 4 + usize::from(u16::from_be_bytes([page[at + 2], page[at + 3]]));
    }
    assert_eq!(kinds, [0x0001, 0x0000, 0x0106, 0x0108]);
    // REPORT SUPPORTED OPERATION CODES, one command: POPULATE TOKEN.
    let r = i.exec(
        &[0xa3, 0x0c, 0x02, 0x83, 0, 0x10, 0, 0, 0, 64, 0, 0],
        &[],
        64,
    );
    assert!(r.good(), "{r:?}");
    assert_eq!(r.data[1] & 0x07, 0x03, "supported as the standard says");
}
