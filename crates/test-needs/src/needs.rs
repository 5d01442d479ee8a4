// The needs the workspace's tests may name: read by the `#[needs]`
// macro (crates/test-needs/src/lib.rs) and by every test crate's build
// script (crates/test-needs/skips.rs), so that the three agree.

/// Tools a test may need on PATH.
pub(crate) const TOOLS: &[&str] = &[
    "nbdkit",
    "nbdinfo",
    "nbdsh",
    "nbdcopy",
    "nbdfuse",
    "fusermount3",
    "qemu-img",
    "qemu-io",
    "qemu-nbd",
    "fio",
    "iperf3",
    "nft",
    "losetup",
    "systemd-analyze",
    "man",
    "nbd-client",
    "python3",
    "ip",
    "ss",
    "tc",
    "iscsi-ls",
    "iscsi-test-cu",
    "ceph-mon",
    "rbd",
    "sysctl",
    "tgtd",
    "gcc",
    "chromium",
    "chromedriver",
];

/// Needs that are not tools, and the file each is found by (none for
/// root).
pub(crate) const OTHERS: &[(&str, Option<&str>)] = &[
    ("root", None),
    ("libiscsi-dev", Some("/usr/include/iscsi/iscsi.h")),
];
