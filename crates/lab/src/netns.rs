//! Named network namespaces: creating and deleting them, running code or
//! processes inside, finding the processes that live in one, and removing the
//! leftovers of test runs that crashed. Knows nothing about paths or links.

use std::fs::{self, File};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::cmd::{self, run_ok, tool};
use crate::LabError;

/// Where `ip netns` keeps its bind mounts.
pub(crate) const NETNS_DIR: &str = "/var/run/netns";

/// Prefix of throwaway (test) labs: `brl-<pid>-<n>`. The owner's PID in the
/// name lets a later run tell a crashed run's namespaces from a live one's.
pub(crate) const TEST_PREFIX: &str = "brl-";

/// Prefix of persistent (CLI) labs: `braid-<name>`. Never auto-cleaned.
pub(crate) const NAMED_PREFIX: &str = "braid-";

/// A fresh tag for a throwaway lab in this process.
pub(crate) fn test_tag() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{TEST_PREFIX}{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

pub(crate) fn path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

pub(crate) fn exists(name: &str) -> bool {
    path(name).exists()
}

/// `ip netns add`.
pub(crate) fn add(name: &str) -> Result<(), LabError> {
    run_ok(tool("ip", ["netns", "add", name]), None).map(drop)
}

/// Stops every process inside the namespace, then deletes it. Deleting the
/// namespace deletes its veths (and so their peers) and nftables tables.
pub(crate) fn delete(name: &str) -> Result<(), LabError> {
    if !exists(name) {
        return Ok(());
    }
    stop_processes_in(name);
    run_ok(tool("ip", ["netns", "delete", name]), None).map(drop)
}

/// Runs `f` on a new thread that has joined the namespace, and returns its
/// result. Only that thread moves: the rest of the process stays where it
/// was, and the mount namespace (so `/sys`) is unchanged.
pub(crate) fn enter<F, R>(name: &str, f: F) -> Result<R, LabError>
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    let ns = open(name)?;
    thread::scope(|s| {
        let handle = s.spawn(move || -> Result<R, LabError> {
            setns(&ns, name)?;
            Ok(f())
        });
        match handle.join() {
            Ok(r) => r,
            // The caller's closure panicked: let the panic carry on in the
            // caller, as if the closure had run there.
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Opens the namespace's handle for `setns`.
pub(crate) fn open(name: &str) -> Result<File, LabError> {
    File::open(path(name)).map_err(|e| {
        LabError::io(
            format!("cannot open network namespace {name}; is the lab still up?"),
            e,
        )
    })
}

/// Moves the calling thread into the namespace.
pub(crate) fn setns(ns: &File, name: &str) -> Result<(), LabError> {
    // SAFETY: setns(2) takes a valid open fd (borrowed from `ns`, which
    // outlives the call) and a flag; it touches no memory of ours.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(LabError::io(
            format!("setns into {name} failed"),
            std::io::Error::last_os_error(),
        ))
    }
}

/// Writes a sysctl of the namespace (e.g. `net/ipv4/conf/all/rp_filter`).
pub(crate) fn sysctl(ns: &str, key: &str, value: &str) -> Result<(), LabError> {
    let file = format!("/proc/sys/{key}");
    enter(ns, || fs::write(&file, value))?
        .map_err(|e| LabError::io(format!("cannot set {key}={value} in {ns}"), e))
}

/// PIDs of the processes (other than this one) whose network namespace is
/// the named one.
pub(crate) fn pids_in(name: &str) -> Vec<u32> {
    let Ok(target) = fs::metadata(path(name)) else {
        return Vec::new();
    };
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            fs::metadata(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|m| m.dev() == target.dev() && m.ino() == target.ino())
        })
        .collect()
}

/// SIGTERM to everything inside, SIGKILL to what is left after
/// [`cmd::STOP_GRACE`]. These are processes the lab (or its user) started
/// inside its own namespace; nothing outside is touched.
fn stop_processes_in(name: &str) {
    let pids = pids_in(name);
    if pids.is_empty() {
        return;
    }
    tracing::debug!(
        netns = name,
        ?pids,
        "stopping processes left in the namespace"
    );
    for &pid in &pids {
        cmd::signal(pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + cmd::STOP_GRACE;
    while Instant::now() < deadline && !pids_in(name).is_empty() {
        thread::sleep(Duration::from_millis(20));
    }
    for pid in pids_in(name) {
        cmd::signal(pid, libc::SIGKILL);
    }
}

/// Deletes the namespaces of throwaway labs whose owner process is gone,
/// and returns their names. A namespace owned by a live process (another
/// test binary running now) is left alone.
pub(crate) fn clean_leftovers() -> Vec<String> {
    let Ok(entries) = fs::read_dir(NETNS_DIR) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for name in entries.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
        let Some(owner) = owner_pid(&name) else {
            continue;
        };
        if PathBuf::from(format!("/proc/{owner}")).exists() {
            continue;
        }
        // Two runs may race to remove the same leftover; losing is fine.
        match delete(&name) {
            Ok(()) => removed.push(name),
            Err(e) => tracing::debug!(netns = %name, error = %e, "leftover not removed"),
        }
    }
    if !removed.is_empty() {
        tracing::info!(?removed, "removed namespaces of crashed lab runs");
    }
    removed
}

/// The owner PID encoded in a throwaway lab's namespace name
/// (`brl-<pid>-<n>-s` or `-c`).
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(TEST_PREFIX)?;
    let rest = rest
        .strip_suffix("-s")
        .or_else(|| rest.strip_suffix("-c"))?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_only_from_test_lab_names() {
        assert_eq!(owner_pid("brl-1234-0-s"), Some(1234));
        assert_eq!(owner_pid("brl-1234-17-c"), Some(1234));
        assert_eq!(owner_pid("brl-1234-s"), None);
        assert_eq!(owner_pid("braid-lab-s"), None);
        assert_eq!(owner_pid("brl-x-0-s"), None);
        assert_eq!(owner_pid("brl-1-0-x"), None);
    }
}
