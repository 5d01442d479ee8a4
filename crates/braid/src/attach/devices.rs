//! How to reach an attached volume: a free kernel NBD device to suggest,
//! and the commands for each kind of client.

use std::path::Path;

use braid_store::source::format_size;

use crate::attached::Attached;
use crate::out::outln;

/// Kernel NBD devices no one uses, lowest first, one per volume: a device
/// is busy while its `pid` attribute exists (an nbd-client holds it) or
/// its size is not zero. Without the nbd module there are none yet, and
/// `modprobe nbd` makes nbd0 onwards.
pub(super) fn free_nbd_devices(sys_block: &Path, count: usize) -> Vec<String> {
    let mut devices: Vec<(u32, bool)> = std::fs::read_dir(sys_block)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n: u32 = e.file_name().to_str()?.strip_prefix("nbd")?.parse().ok()?;
            let dir = e.path();
            let size = std::fs::read_to_string(dir.join("size")).unwrap_or_default();
            Some((n, !dir.join("pid").exists() && size.trim() == "0"))
        })
        .collect();
    devices.sort_unstable();
    let mut out: Vec<String> = devices
        .iter()
        .filter(|(_, idle)| *idle)
        .map(|(n, _)| format!("/dev/nbd{n}"))
        .collect();
    // More volumes than free devices (or no module yet): name the ones
    // `modprobe nbd nbds_max=...` would add next.
    let mut next = devices.last().map_or(0, |(n, _)| n + 1);
    while out.len() < count {
        out.push(format!("/dev/nbd{next}"));
        next += 1;
    }
    out.truncate(count);
    out
}

/// How to use an attached volume, printed once it is served.
pub(super) fn print_usage(a: &Attached, device: &str) {
    let info = a.volume.info();
    let sock = a.socket.display();
    outln!(
        "attached {:?}: {} over {} paths, {}",
        a.name,
        format_size(info.size),
        info.paths.len(),
        info.paths.join(", ")
    );
    outln!("  NBD socket: {sock}");
    outln!("  kernel:  nbd-client -unix {sock} {device} -N {}", a.name);
    outln!(
        "  FUSE:    nbdfuse /mnt/{} 'nbd+unix:///{}?socket={sock}'",
        a.name,
        a.name
    );
    outln!(
        "  qemu:    -drive file=nbd+unix:///{}?socket={sock},format=raw",
        a.name
    );
    outln!("  status:  braid status");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nbd(dir: &Path, n: u32, size: &str, pid: bool) {
        let d = dir.join(format!("nbd{n}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("size"), size).unwrap();
        if pid {
            std::fs::write(d.join("pid"), "4242\n").unwrap();
        }
    }

    #[test]
    fn the_hint_names_devices_no_one_uses() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path();
        // No nbd module yet: modprobe makes nbd0 onwards.
        assert_eq!(free_nbd_devices(sys, 2), ["/dev/nbd0", "/dev/nbd1"]);
        nbd(sys, 0, "2097152\n", true);
        nbd(sys, 1, "0\n", false);
        nbd(sys, 2, "0\n", true);
        nbd(sys, 3, "0\n", false);
        nbd(sys, 10, "0\n", false);
        std::fs::create_dir_all(sys.join("sda")).unwrap();
        assert_eq!(free_nbd_devices(sys, 1), ["/dev/nbd1"]);
        assert_eq!(
            free_nbd_devices(sys, 4),
            ["/dev/nbd1", "/dev/nbd3", "/dev/nbd10", "/dev/nbd11"]
        );
        // Every device busy: the next one, never a busy one.
        let busy = tempfile::tempdir().unwrap();
        nbd(busy.path(), 0, "0\n", true);
        assert_eq!(free_nbd_devices(busy.path(), 1), ["/dev/nbd1"]);
    }
}
