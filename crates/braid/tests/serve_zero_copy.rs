//! READ replies sent with `sendfile` from a file in memory (tmpfs): the
//! bytes must be exactly the file's, with structured and simple replies,
//! unaligned ranges, pipelined requests mixed with writes, and several
//! connections at once.

mod common;

use braid_test_needs::needs;

use std::path::Path;

use common::raw::RawClient;
use common::{cmd, nbdsh, random_bytes, run, sha256, tool, Serve};

/// A directory on tmpfs, where braid sends READ data with sendfile.
fn tmpfs_dir() -> Option<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        return tempfile::tempdir_in(shm).ok();
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI machines have /dev/shm"
    );
    eprintln!("SKIPPED: no /dev/shm");
    None
}

#[needs("nbdcopy")]
fn reads_from_a_memory_file_are_exact_with_every_client() {
    let Some(dir) = tmpfs_dir() else { return };
    let data = random_bytes(24 << 20, 11);
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, &data).unwrap();
    // Over loopback braid copies by default (cheaper there); this test is
    // of the sendfile path.
    let mut serve = Serve::start(&["--sendfile", "always", &format!("vol={}", disk.display())]);
    if tool("nbdcopy") {
        let back = dir.path().join("back.img");
        run(cmd("nbdcopy")
            .args(["--connections=4", &serve.uri("vol")])
            .arg(&back));
        assert_eq!(sha256(&back), sha256(&disk));
    }
    if tool("nbdsh") {
        // Unaligned reads, structured and simple replies, on both sides of
        // the size from which READ data is sent with sendfile.
        for structured in ["True", "False"] {
            let out = nbdsh(&format!(
                "h.set_request_structured_replies({structured})\n\
                 h.connect_uri('{}')\n\
                 import hashlib\n\
                 for off, n in [(1, 1), (511, 4097), (65535, 3), (12345, 100000), (1 << 20, 1 << 20), ((24 << 20) - 7, 7)]:\n\
                 \x20   print(off, hashlib.sha256(h.pread(n, off)).hexdigest())\n",
                serve.uri("vol")
            ));
            for line in out.lines() {
                let mut it = line.split_whitespace();
                let off: usize = it.next().unwrap().parse().unwrap();
                let digest = it.next().unwrap();
                let n = match off {
                    1 => 1,
                    511 => 4097,
                    65535 => 3,
                    12345 => 100000,
                    o if o == 1 << 20 => 1 << 20,
                    _ => 7,
                };
                assert_eq!(
                    digest,
                    common::sha256_bytes(&data[off..off + n]),
                    "structured={structured} off={off}"
                );
            }
        }
    }
    // Pipelined reads and writes on one connection: every reply matched to
    // its request, reads after acknowledged writes see them.
    let mut c = RawClient::open(serve.addr(), "vol");
    let mut model = data.clone();
    let patch = vec![0x5au8; 8192];
    c.write(4096, &patch).unwrap();
    model[4096..12288].copy_from_slice(&patch);
    for i in 0..32u64 {
        let off = (i * 100_003 % (20 << 20)) as usize;
        let back = c.read(off as u64, 65_537).unwrap();
        assert_eq!(&back[..], &model[off..off + 65_537], "read at {off}");
    }
    assert_eq!(&c.read(0, 16384).unwrap()[..], &model[..16384]);
    serve.assert_healthy();
}
