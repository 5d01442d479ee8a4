//! libnbd's clients against a real `braid serve` on loopback: nbdinfo,
//! nbdcopy, nbdsh and nbdfuse. These are the clients users will point at
//! braid, so what they accept is what "speaks NBD" means here (DESIGN.md,
//! "Tests": interop).
//!
//! Elsewhere: qemu-img, qemu-io and fio in `serve_qemu_fio.rs`; read-only,
//! identity, SIGTERM and multi-conn in `serve_lifecycle.rs`; hostile raw
//! bytes in `serve_bad_input.rs` and `serve_bad_requests.rs`.

mod common;

use braid_test_needs::needs;

use std::path::Path;

use common::{cmd, nbdsh, random_bytes, random_file, run, sha256, sparse_file, Serve};
use serde_json::Value;

const MIB: usize = 1 << 20;

fn nbdinfo_json(args: &[&str]) -> Value {
    let out = run(cmd("nbdinfo").arg("--json").args(args));
    serde_json::from_slice(&out.stdout).expect("nbdinfo --json output is JSON")
}

/// The contexts nbdinfo saw, as strings.
fn contexts(export: &Value) -> Vec<String> {
    export["contexts"]
        .as_array()
        .expect("contexts array")
        .iter()
        .map(|c| c.as_str().expect("context name").to_owned())
        .collect()
}

#[needs("nbdinfo")]
fn nbdinfo_json_reports_size_flags_block_sizes_and_braid_contexts() {
    let serve = Serve::start(&["vol=mem:64MiB"]);
    let j = nbdinfo_json(&[&serve.uri("vol")]);
    assert_eq!(j["protocol"], "newstyle-fixed");
    assert_eq!(j["structured"], true);
    let e = &j["exports"][0];
    assert_eq!(e["export-name"], "vol");
    assert_eq!(e["export-size"], 64 * MIB as u64);
    assert_eq!(e["is_read_only"], false);
    for flag in [
        "can_multi_conn",
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_fast_zero",
        "can_cache",
        "can_df",
    ] {
        assert_eq!(e[flag], true, "{flag} in {e:#}");
    }
    assert_eq!(e["block_size_minimum"], 1);
    assert_eq!(e["block_size_preferred"], 4096);
    assert_eq!(e["block_size_maximum"], 32 * MIB as u64);
    let ctx = contexts(e);
    assert!(ctx.contains(&"base:allocation".to_owned()), "{ctx:?}");
    // The identity clients see is the one braid logged at startup.
    let volume = format!("x-braid:volume={}", serve.logged_volume("vol"));
    assert!(ctx.contains(&volume), "{volume} not in {ctx:?}");
    let portal = format!("x-braid:portal={}", serve.addr());
    assert!(ctx.contains(&portal), "{portal} not in {ctx:?}");
}

#[needs("nbdinfo")]
fn nbdinfo_list_shows_every_export_with_size_flags_and_braid_contexts() {
    let dir = tempfile::tempdir().unwrap();
    let file = sparse_file(dir.path(), "disk.img", 16 * MIB as u64);
    let vol = format!("disk={}", file.display());
    let serve = Serve::start(&[&vol, "scratch=mem:32MiB"]);
    let base = format!("nbd://{}", serve.addr());
    let j = nbdinfo_json(&["--list", &base]);
    let exports = j["exports"].as_array().expect("exports");
    assert_eq!(exports.len(), 2, "{j:#}");
    for (name, size) in [("disk", 16 * MIB), ("scratch", 32 * MIB)] {
        let e = exports
            .iter()
            .find(|e| e["export-name"] == name)
            .unwrap_or_else(|| panic!("{name} missing from {j:#}"));
        assert_eq!(e["export-size"], size as u64);
        assert_eq!(e["can_multi_conn"], true);
        assert_eq!(e["can_trim"], true);
        let ctx = contexts(e);
        let volume = format!("x-braid:volume={}", serve.logged_volume(name));
        assert!(ctx.contains(&volume), "{name}: {ctx:?}");
        assert!(ctx.iter().any(|c| c.starts_with("x-braid:portal=")));
    }
    // The human-readable listing says the same.
    let text = run(cmd("nbdinfo").args(["--list", &base])).stdout;
    let text = String::from_utf8(text).unwrap();
    for needle in [
        "export=\"disk\"",
        "export=\"scratch\"",
        "export-size: 16777216",
        "export-size: 33554432",
        "can_multi_conn: true",
        "x-braid:volume=",
        "x-braid:portal=",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
}

#[needs("nbdinfo")]
fn nbdinfo_map_shows_data_between_holes_of_a_sparse_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = sparse_file(dir.path(), "sparse.img", 16 * MIB as u64);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.write_all_at(&random_bytes(MIB, 1), 8 * MIB as u64)
            .unwrap();
    }
    let serve = Serve::start(&[&format!("vol={}", file.display())]);
    let map = nbdinfo_json(&["--map", &serve.uri("vol")]);
    let extents: Vec<(u64, u64, u64)> = map
        .as_array()
        .expect("map is an array")
        .iter()
        .map(|e| {
            let n = |k: &str| e[k].as_u64().unwrap_or_else(|| panic!("{k} in {e}"));
            (n("offset"), n("length"), n("type"))
        })
        .collect();
    let m = MIB as u64;
    // type 3 = hole|zero, 0 = data (base:allocation).
    assert_eq!(
        extents,
        [(0, 8 * m, 3), (8 * m, m, 0), (9 * m, 7 * m, 3)],
        "{map:#}"
    );
}

#[needs("nbdcopy")]
fn nbdcopy_with_four_connections_round_trips_file_and_mem_exports() {
    let dir = tempfile::tempdir().unwrap();
    let src = random_file(dir.path(), 32 * MIB, 2);
    let disk = sparse_file(dir.path(), "disk.img", 32 * MIB as u64);
    let serve = Serve::start(&[&format!("disk={}", disk.display()), "mem=mem:32MiB"]);
    for export in ["disk", "mem"] {
        let uri = serve.uri(export);
        let back = dir.path().join(format!("{export}.out"));
        run(cmd("nbdcopy")
            .args(["--connections=4", "--flush"])
            .arg(&src)
            .arg(&uri));
        run(cmd("nbdcopy").arg("--connections=4").arg(&uri).arg(&back));
        assert_eq!(sha256(&back), sha256(&src), "{export}");
    }
    // What went in over NBD is what the file now holds.
    assert_eq!(sha256(&disk), sha256(&src));
}

/// One step of the unaligned workload: write `len` bytes of the data
/// file from `src` at `off`, or read `len` bytes at `off`.
enum Op {
    Write { off: usize, len: usize, src: usize },
    Read { off: usize, len: usize },
}

fn unaligned_ops(size: usize, data_len: usize) -> Vec<Op> {
    use rand::{Rng, SeedableRng};
    let mut ops = Vec::new();
    // Hand-picked edges: single bytes, odd spans, 64 KiB (memory page) and
    // 4 KiB boundaries, the last byte of the export.
    for (off, len) in [
        (1, 1),
        (511, 4097),
        (65535, 2),
        (3 * 65536 - 7, 65536 + 14),
        (4095, 3),
        (size - 1, 1),
        (size - 4097, 4097),
    ] {
        ops.push(Op::Write {
            off,
            len,
            src: off % 1000,
        });
        ops.push(Op::Read {
            off: off.saturating_sub(3),
            len: len + 3,
        });
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for _ in 0..300 {
        let len = rng.gen_range(1..=100_000);
        let off = rng.gen_range(0..=size - len);
        if rng.gen_bool(0.5) {
            ops.push(Op::Write {
                off,
                len,
                src: rng.gen_range(0..data_len - len),
            });
        } else {
            ops.push(Op::Read { off, len });
        }
    }
    ops
}

#[needs("nbdsh")]
fn nbdsh_unaligned_reads_and_writes_match_a_local_model() {
    let size = 8 * MIB;
    let dir = tempfile::tempdir().unwrap();
    let data_path = random_file(dir.path(), 2 * MIB, 4);
    let data = std::fs::read(&data_path).unwrap();
    let disk = sparse_file(dir.path(), "disk.img", size as u64);
    let serve = Serve::start(&[
        &format!("disk={}", disk.display()),
        "mem=mem:8MiB",
        "plain=mem:8MiB",
    ]);
    let ops = unaligned_ops(size, data.len());
    let mut py_ops = String::new();
    let mut model = vec![0u8; size];
    let mut expected = Vec::new();
    for op in &ops {
        match *op {
            Op::Write { off, len, src } => {
                model[off..off + len].copy_from_slice(&data[src..src + len]);
                py_ops.push_str(&format!("('w', {off}, {len}, {src}),\n"));
            }
            Op::Read { off, len } => {
                expected.extend_from_slice(&model[off..off + len]);
                py_ops.push_str(&format!("('r', {off}, {len}, 0),\n"));
            }
        }
    }
    expected.extend_from_slice(&model);
    // "plain" runs without structured replies: READ data then comes in
    // simple replies, a different path through braid's reply encoder.
    for (export, structured) in [("disk", "True"), ("mem", "True"), ("plain", "False")] {
        let out = dir.path().join(format!("{export}.reads"));
        nbdsh(&format!(
            r#"
data = open({data:?}, 'rb').read()
out = open({out:?}, 'wb')
h.set_request_structured_replies({structured})
h.connect_uri({uri:?})
assert h.get_structured_replies_negotiated() == {structured}
for (op, off, n, src) in [{py_ops}]:
    if op == 'w':
        h.pwrite(data[src:src + n], off)
    else:
        out.write(h.pread(n, off))
out.write(h.pread({size}, 0))
out.close()
h.shutdown()
"#,
            data = data_path.display().to_string(),
            out = out.display().to_string(),
            uri = serve.uri(export),
        ));
        let got = std::fs::read(&out).unwrap();
        assert_eq!(got.len(), expected.len(), "{export}");
        if let Some(i) = got.iter().zip(&expected).position(|(a, b)| a != b) {
            panic!("{export}: first difference at byte {i} of the read stream");
        }
    }
    assert_eq!(
        std::fs::read(&disk).unwrap(),
        model,
        "file behind the export"
    );
}

#[needs("nbdsh")]
fn nbdsh_trim_zero_flush_fua_cache_and_block_status_behave() {
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "disk.img", 4 * MIB as u64);
    let serve = Serve::start(&[&format!("disk={}", disk.display()), "mem=mem:4MiB"]);
    for export in ["disk", "mem"] {
        let out = nbdsh(&format!(
            r#"
h.add_meta_context('base:allocation')
h.connect_uri({uri:?})
assert h.can_trim() and h.can_zero() and h.can_flush() and h.can_fua() and h.can_cache()
assert h.can_meta_context('base:allocation')
M = 1 << 20
# libnbd's argument order is (count, offset).
h.pwrite(b'\xaa' * M, 0, nbd.CMD_FLAG_FUA)
h.flush()
h.cache(M, 0)
assert h.pread(M, 0) == b'\xaa' * M
# braid punches holes on TRIM, so trimmed bytes read back as zero.
h.trim(128 * 1024, 128 * 1024)
assert h.pread(128 * 1024, 128 * 1024) == bytes(128 * 1024)
# Unaligned zeroing touches exactly its range.
h.zero(1001, 300001, nbd.CMD_FLAG_FUA)
got = h.pread(1003, 300000)
assert got == b'\xaa' + bytes(1001) + b'\xaa', got
h.zero(700000, 4096, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(700000, 4096) == bytes(700000)
assert h.pread(4096, 0) == b'\xaa' * 4096
try:
    h.zero(2 * M, M, nbd.CMD_FLAG_FAST_ZERO)
    assert h.pread(2 * M, M) == bytes(2 * M)
except nbd.Error as e:
    # FAST_ZERO may be refused when zeroing would be slow; never wrong.
    assert e.errno == 'ENOTSUP', e
h.flush()
def extents(off, n):
    out = []
    while n > 0:
        got = {{}}
        def cb(meta, o, entries, err):
            got[meta] = entries
            return 0
        h.block_status(n, off, cb)
        e = got['base:allocation']
        for i in range(0, len(e), 2):
            ln = min(e[i], n)
            out.append((off, ln, e[i + 1]))
            off += ln
            n -= ln
            if n == 0:
                break
    return out
ext = extents(0, 4 * M)
# A ZERO extent that is not all zeroes would corrupt a sparse copy.
for (o, n, f) in ext:
    if f & 2:
        assert h.pread(n, o) == bytes(n), ('claimed zero', o, n, f)
assert ext[0][0] == 0 and ext[0][2] & 2 == 0, ext
# The never-written tail is reported as a hole.
assert all(f == 3 for (o, n, f) in ext if o + n > 3 * M), ext
print('ok')
h.shutdown()
"#,
            uri = serve.uri(export)
        ));
        assert_eq!(out.trim(), "ok", "{export}");
    }
}

/// Unmounts a FUSE mount when dropped, even when the test panicked.
struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        let _ = common::output(
            cmd("fusermount3").arg("-u").arg(self.0),
            common::TOOL_TIMEOUT,
        );
    }
}

#[needs("nbdsh")]
fn nbdsh_zero_length_requests_leave_the_connection_usable() {
    let serve = Serve::start(&["vol=mem:1MiB"]);
    let out = nbdsh(&format!(
        r#"
# Strict mode off so libnbd sends what a careless client would; libnbd
# then checks the server's reply and kills the handle if it is malformed.
h.set_strict_mode(0)
h.connect_uri({uri:?})
for name, op in [('read', lambda: h.pread(0, 4096)),
                 ('write', lambda: h.pwrite(b'', 4096)),
                 ('trim', lambda: h.trim(0, 4096)),
                 ('zero', lambda: h.zero(0, 4096))]:
    try:
        op()
    except nbd.Error as e:
        assert not h.aio_is_dead(), (name, 'killed the connection', e.string)
h.pwrite(b'still here', 100)
assert h.pread(10, 100) == b'still here'
print('ok')
"#,
        uri = serve.uri("vol")
    ));
    assert_eq!(out.trim(), "ok");
}

#[needs("root", "nbdfuse", "fusermount3")]
fn nbdfuse_mount_reads_the_same_bytes_as_the_source_file() {
    let dir = tempfile::tempdir().unwrap();
    let src = random_file(dir.path(), 16 * MIB, 6);
    let serve = Serve::start(&[&format!("vol={}", src.display())]);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let pidfile = dir.path().join("nbdfuse.pid");
    let mut fuse = common::ChildGuard::spawn(
        cmd("nbdfuse")
            .arg("-P")
            .arg(&pidfile)
            .arg(mnt.join("disk"))
            .arg(serve.uri("vol"))
            .stdin(std::process::Stdio::null()),
    );
    let _unmount = Unmount(&mnt);
    // nbdfuse writes its pid file once the mount is ready.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !pidfile.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "nbdfuse did not mount"
        );
        assert!(fuse.0.try_wait().unwrap().is_none(), "nbdfuse exited");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    run(cmd("cmp").arg(mnt.join("disk")).arg(&src));
    assert_eq!(sha256(&mnt.join("disk")), sha256(&src));
}

#[needs("nbdsh")]
fn list_meta_context_for_the_braid_namespace_names_the_volume_and_every_portal() {
    let serve = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.2:0",
        "vol=mem:1MiB",
    ]);
    let out = nbdsh(&format!(
        r#"
h.set_opt_mode(True)
h.connect_uri({uri:?})
h.add_meta_context('x-braid:')
seen = []
h.opt_list_meta_context(lambda name: seen.append(name))
print('\n'.join(seen))
h.opt_abort()
"#,
        uri = serve.uri("vol")
    ));
    let seen: Vec<&str> = out.lines().collect();
    let mut want = vec![format!("x-braid:volume={}", serve.logged_volume("vol"))];
    want.extend(
        serve
            .portals()
            .iter()
            .map(|p| format!("x-braid:portal={p}")),
    );
    assert_eq!(serve.portals().len(), 2);
    for w in &want {
        assert!(seen.contains(&w.as_str()), "{w} not in {seen:?}");
    }
    assert!(seen.iter().all(|c| c.starts_with("x-braid:")), "{seen:?}");
}
