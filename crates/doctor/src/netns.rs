//! Making `/sys/class/net` describe this process's network namespace.
//!
//! sysfs shows the network devices of the namespace that mounted it. A
//! process moved into another namespace by `setns` alone (`nsenter --net`,
//! a container runtime, a test harness) still sees the old one's devices
//! there, so every speed, MTU and queue it read would be another host's.
//! `ip netns exec` avoids that by mounting a fresh sysfs in a private mount
//! namespace; [`own_sysfs`] does the same when, and only when, netlink
//! (which always answers for the caller's namespace) and sysfs disagree.

use std::ffi::CString;
use std::io;

/// Remounts `/sys` privately if it belongs to another network namespace;
/// true if it did. Must run before the process starts threads (a new mount
/// namespace is the calling thread's only, and threads made later inherit
/// it).
///
/// # Errors
///
/// The links cannot be listed, or the remount is refused (it needs
/// CAP_SYS_ADMIN, as `ip netns exec` does).
pub fn own_sysfs() -> io::Result<bool> {
    let links = braid_netif::link::links()?;
    let matches = links.iter().all(|l| {
        std::fs::read_to_string(format!("/sys/class/net/{}/ifindex", l.name))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            == Some(l.index)
    });
    if matches {
        return Ok(false);
    }
    let c = |s: &str| CString::new(s).expect("no NUL in a constant");
    let check = |rc: libc::c_int, what: &str| {
        if rc == 0 {
            Ok(())
        } else {
            let e = io::Error::last_os_error();
            Err(io::Error::new(e.kind(), format!("{what}: {e}")))
        }
    };
    // SAFETY: unshare(2) with a flag; affects only this process's view of
    // mounts.
    check(
        unsafe { libc::unshare(libc::CLONE_NEWNS) },
        "unshare(CLONE_NEWNS)",
    )?;
    let root = c("/");
    let sys = c("/sys");
    let sysfs = c("sysfs");
    // SAFETY: NUL-terminated strings that outlive the calls; null pointers
    // where mount(2) allows them.
    unsafe {
        // Mounts made here must not propagate back to the host.
        check(
            libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ),
            "making / a slave mount",
        )?;
        check(
            libc::umount2(sys.as_ptr(), libc::MNT_DETACH),
            "unmounting /sys",
        )?;
        check(
            libc::mount(
                sysfs.as_ptr(),
                sys.as_ptr(),
                sysfs.as_ptr(),
                0,
                std::ptr::null(),
            ),
            "mounting sysfs",
        )?;
    }
    Ok(true)
}
