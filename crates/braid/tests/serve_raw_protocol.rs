//! Valid protocol paths that the common clients rarely take, checked over
//! raw sockets: `NBD_OPT_EXPORT_NAME` with and without `NO_ZEROES` (and
//! the simple replies that follow), many requests in flight answered by
//! cookie, `NBD_CMD_DISC` completing every outstanding request, and
//! `base:allocation` on a fragmented sparse file.

mod common;

use std::io::Read;
use std::net::Shutdown;

use braid_proto::wire::{client_flags, OptCode, SIMPLE_REPLY_MAGIC};
use common::raw::{cmd, RawClient};
use common::{random_bytes, Serve};

const SIZE: u64 = 64 << 20;

fn export_name(c: &mut RawClient, name: &str) {
    let mut out = Vec::new();
    braid_proto::option::encode_option(&mut out, OptCode::ExportName, name.as_bytes());
    c.send(&out);
}

#[test]
fn export_name_without_no_zeroes_pads_124_zeroes_then_serves_simple_replies() {
    let mut serve = Serve::start(&["vol=mem:64MiB"]);
    let mut c = RawClient::connect(serve.addr());
    c.greeting();
    c.send(&client_flags::FIXED_NEWSTYLE.to_be_bytes());
    export_name(&mut c, "vol");
    let mut reply = [0u8; 8 + 2 + 124];
    c.stream.read_exact(&mut reply).unwrap();
    assert_eq!(u64::from_be_bytes(reply[..8].try_into().unwrap()), SIZE);
    let flags = u16::from_be_bytes([reply[8], reply[9]]);
    assert_ne!(flags & 1, 0, "HAS_FLAGS");
    assert!(reply[10..].iter().all(|&b| b == 0), "padding is zeroes");
    // No structured replies were negotiated: every reply is simple.
    let data = random_bytes(70_001, 1);
    c.write(65_535, &data).unwrap();
    assert_eq!(c.read(65_535, 70_001).unwrap(), data);
    assert_eq!(c.call(cmd::FLUSH, 0, 0, 0).error, None);
    serve.assert_healthy();
}

#[test]
fn export_name_with_no_zeroes_sends_no_padding() {
    let serve = Serve::start(&["vol=mem:64MiB"]);
    let mut c = RawClient::connect(serve.addr());
    c.greeting();
    c.send(&client_flags::KNOWN.to_be_bytes());
    export_name(&mut c, "vol");
    let mut reply = [0u8; 10];
    c.stream.read_exact(&mut reply).unwrap();
    assert_eq!(u64::from_be_bytes(reply[..8].try_into().unwrap()), SIZE);
    // Whatever comes next must be the reply to this request, not padding.
    c.request(cmd::READ, 0, 0, 16);
    let mut magic = [0u8; 4];
    c.stream.read_exact(&mut magic).unwrap();
    assert_eq!(u32::from_be_bytes(magic), SIMPLE_REPLY_MAGIC);
}

#[test]
fn export_name_for_a_missing_export_closes_the_connection() {
    let mut serve = Serve::start(&["vol=mem:64MiB"]);
    let mut c = RawClient::start(serve.addr());
    export_name(&mut c, "nope");
    // The spec gives EXPORT_NAME no way to say no but hanging up.
    assert!(c.closed_by_server());
    let mut good = RawClient::open(serve.addr(), "vol");
    assert_eq!(good.read(0, 512).unwrap(), vec![0; 512]);
    serve.assert_healthy();
}

#[test]
fn many_requests_in_flight_are_each_answered_by_cookie() {
    let mut serve = Serve::start(&["vol=mem:64MiB"]);
    let mut c = RawClient::open(serve.addr(), "vol");
    let pieces: Vec<(u64, Vec<u8>)> = (0..64)
        .map(|i| {
            (
                i * 1_000_003 % (SIZE - 70_000),
                random_bytes(1 + (i as usize * 997) % 65_536, i),
            )
        })
        .collect();
    let mut expect = std::collections::HashMap::new();
    for (off, data) in &pieces {
        let cookie = c.request(cmd::WRITE, 0, *off, data.len() as u32);
        c.send(data);
        expect.insert(cookie, None);
    }
    for _ in 0..pieces.len() {
        let r = c.reply().unwrap();
        assert_eq!(r.error, None);
        assert!(
            expect.remove(&r.cookie).is_some(),
            "unknown or repeated cookie {}",
            r.cookie
        );
    }
    for (off, data) in &pieces {
        let cookie = c.request(cmd::READ, 0, *off, data.len() as u32);
        expect.insert(cookie, Some(data.clone()));
    }
    for _ in 0..pieces.len() {
        let r = c.reply().unwrap();
        let want = expect
            .remove(&r.cookie)
            .flatten()
            .expect("a READ cookie, once");
        assert_eq!(r.data, want, "cookie {}", r.cookie);
    }
    serve.assert_healthy();
}

#[test]
fn disc_completes_every_outstanding_request_before_closing() {
    let mut serve = Serve::start(&["vol=mem:64MiB"]);
    let mut c = RawClient::open(serve.addr(), "vol");
    let data = random_bytes(16 << 16, 2);
    for (i, chunk) in data.chunks(1 << 16).enumerate() {
        c.request(cmd::WRITE, 0, (i as u64) << 16, chunk.len() as u32);
        c.send(chunk);
    }
    c.request(cmd::DISC, 0, 0, 0);
    c.stream.shutdown(Shutdown::Write).unwrap();
    // Spec, NBD_CMD_DISC: the server MUST handle all outstanding requests.
    for _ in 0..16 {
        let r = c.reply().expect("a reply for each write sent before DISC");
        assert_eq!(r.error, None);
    }
    assert!(c.closed_by_server(), "connection left open after DISC");
    let mut check = RawClient::open(serve.addr(), "vol");
    assert_eq!(check.read(0, data.len() as u32).unwrap(), data);
    serve.assert_healthy();
}

#[test]
fn block_status_never_claims_zero_over_data_in_a_fragmented_file() {
    use rand::{Rng, SeedableRng};
    use std::os::unix::fs::FileExt;
    // Data scattered in a sparse file, some of it not block aligned: a
    // ZERO extent over any of it would make sparse-aware copies (nbdcopy,
    // qemu-img) silently drop data.
    let dir = tempfile::tempdir().unwrap();
    let size = 8u64 << 20;
    let path = common::sparse_file(dir.path(), "frag.img", size);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for block in (0..size).step_by(4096) {
        if rng.gen_bool(0.4) {
            let len = [1usize, 100, 4096][rng.gen_range(0..3)];
            let at = block + [0, 17][rng.gen_range(0..2)];
            let len = len.min((size - at) as usize);
            file.write_all_at(&vec![1u8; len], at).unwrap();
        }
    }
    let data = std::fs::read(&path).unwrap();
    let mut serve = Serve::start(&[&format!("vol={}", path.display())]);
    let mut c = RawClient::open(serve.addr(), "vol");
    for _ in 0..300 {
        let offset = rng.gen_range(0..size);
        let length = rng.gen_range(1..=(size - offset).min(3 << 20)) as u32;
        let req_one = rng.gen_bool(0.5);
        let r = c.call(
            cmd::BLOCK_STATUS,
            if req_one { 1 << 3 } else { 0 },
            offset,
            length,
        );
        assert_eq!(r.error, None);
        let (_, extents) = &r.extents[0];
        if req_one {
            assert!(extents.len() == 1 && extents[0].0 <= length, "{extents:?}");
        }
        let mut pos = offset;
        for &(len, flags) in extents {
            let end = (pos + u64::from(len)).min(offset + u64::from(length));
            let zero_claimed = flags & 2 != 0;
            if zero_claimed {
                let span = &data[pos as usize..end as usize];
                assert!(
                    span.iter().all(|&b| b == 0),
                    "ZERO over data in [{pos}, {end})"
                );
            }
            pos = end;
            if pos == offset + u64::from(length) {
                break;
            }
        }
    }
    serve.assert_healthy();
}
