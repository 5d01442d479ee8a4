//! qemu-img, qemu-io and fio's nbd engine against a real `braid serve`:
//! the hypervisor-side and benchmark clients people will point at braid
//! (DESIGN.md, "Tests": interop). libnbd's tools are in `serve_clients.rs`.

mod common;

use braid_test_needs::needs;

use std::path::Path;

use common::{cmd, random_file, run, sha256, sparse_file, Serve};
use serde_json::Value;

const MIB: usize = 1 << 20;

#[needs("qemu-img")]
fn qemu_img_convert_and_compare_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let src = random_file(dir.path(), 16 * MIB, 5);
    let disk = sparse_file(dir.path(), "disk.img", 16 * MIB as u64);
    let serve = Serve::start(&[&format!("disk={}", disk.display()), "mem=mem:16MiB"]);
    for export in ["disk", "mem"] {
        let uri = serve.uri(export);
        let back = dir.path().join(format!("{export}.raw"));
        run(cmd("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&src)
            .arg(&uri));
        run(cmd("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw", &uri])
            .arg(&back));
        assert_eq!(sha256(&back), sha256(&src), "{export}");
        run(cmd("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&src)
            .arg(&uri));
    }
    // compare is not vacuous: one changed byte makes it fail.
    let uri = serve.uri("mem");
    if common::tool("qemu-io") {
        run(cmd("qemu-io").args(["-f", "raw", "-c", "write -P 0x01 12345 1", &uri]));
        let out = common::output(
            cmd("qemu-img")
                .args(["compare", "-f", "raw", "-F", "raw"])
                .arg(&src)
                .arg(&uri),
            common::TOOL_TIMEOUT,
        );
        assert_eq!(
            out.status.code(),
            Some(1),
            "compare after a change: {out:?}"
        );
    }
}

#[needs("qemu-io")]
fn qemu_io_pattern_write_reads_back_and_a_wrong_pattern_fails() {
    let serve = Serve::start(&["vol=mem:16MiB"]);
    let uri = serve.uri("vol");
    let qemu_io = |c: &str| {
        common::output(
            cmd("qemu-io").args(["-f", "raw", "-c", c, &uri]),
            common::TOOL_TIMEOUT,
        )
    };
    for c in [
        "write -P 0xab 4096 1M",
        "write -P 0xcd 1234567 77777",
        "aio_write -P 0x5a 8M 3M",
    ] {
        let out = qemu_io(c);
        assert!(out.status.success(), "{c}: {out:?}");
    }
    for c in [
        "read -P 0xab 4096 1M",
        "read -P 0xcd 1234567 77777",
        "read -P 0x5a 8M 3M",
        "read -P 0 0 4096",
    ] {
        let out = qemu_io(c);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && !stdout.contains("failed"),
            "{c}: {out:?}"
        );
    }
    let out = qemu_io("read -P 0xac 4096 1M");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Pattern verification failed"),
        "{out:?}"
    );
}

#[needs("fio")]
fn fio_random_read_write_with_crc32c_verify_has_no_errors() {
    let dir = tempfile::tempdir().unwrap();
    let disk = sparse_file(dir.path(), "disk.img", 32 * MIB as u64);
    let serve = Serve::start(&[&format!("disk={}", disk.display()), "mem=mem:32MiB"]);
    for export in ["disk", "mem"] {
        let json = dir.path().join(format!("{export}.json"));
        run(cmd("fio")
            .current_dir(dir.path())
            .args([
                "--name=verify",
                "--ioengine=nbd",
                "--size=16m",
                "--bs=4k",
                "--iodepth=16",
            ])
            .args([
                "--rw=randrw",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                // No state file left in the working directory.
                "--verify_state_save=0",
            ])
            .args(["--runtime=30", "--output-format=json"])
            .arg(format!("--uri={}", serve.uri(export)))
            .arg(format!("--output={}", json.display())));
        check_fio(&json, export);
    }
}

fn check_fio(json: &Path, what: &str) {
    let text = std::fs::read_to_string(json).unwrap();
    // fio may print a line before its JSON; the report starts at '{'.
    let start = text
        .find('{')
        .unwrap_or_else(|| panic!("no JSON from fio: {text}"));
    let j: Value = serde_json::from_str(&text[start..]).expect("fio JSON");
    for job in j["jobs"].as_array().expect("jobs") {
        assert_eq!(job["error"], 0, "{what}: {job:#}");
        assert!(
            job["read"]["io_bytes"].as_u64() > Some(0),
            "{what}: no reads"
        );
        assert!(
            job["write"]["io_bytes"].as_u64() > Some(0),
            "{what}: no writes"
        );
    }
}
