//! braid's network lab: a storage host and a client host as two network
//! namespaces, joined by one veth pair per path, each direction shaped by
//! tbf to a link rate. Real kernel TCP over links of known speed, on one
//! machine, for integration tests and benchmarks.
//!
//! ```no_run
//! use braid_lab::{Cut, Lab, LabConfig, Rate};
//! # fn main() -> Result<(), braid_lab::LabError> {
//! if !braid_lab::require_or_skip("two_paths") {
//!     return Ok(());
//! }
//! let lab = Lab::up(LabConfig::new([Rate::GBIT, Rate::MBIT_100]))?;
//! let portal = lab.paths()[0].storage_addr;
//! lab.cut(1, Cut::Blackhole)?;
//! lab.restore(1)?;
//! # let _ = portal;
//! # Ok(()) }
//! ```
//!
//! What it does not do: it never sends traffic anywhere but into namespaces
//! it created; it does not measure or assert performance (benchmarks do);
//! it knows nothing about NBD. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN)
//! and iproute2; nftables for blackholes, iperf3 for [`Lab::iperf3`].
//!
//! Namespaces of throwaway labs are named `brl-<pid>-<n>-s` / `-c` so that a
//! later [`Lab::up`] can remove those of crashed runs; persistent labs (the
//! CLI's) are `braid-<name>-s` / `-c` and are left alone.

mod cmd;
mod config;
mod counters;
mod delay;
mod error;
mod iperf;
mod lab;
mod netns;
mod topo;

pub use cmd::{ChildGuard, STOP_GRACE};
pub use config::{Addressing, Cut, LabConfig, Rate, Shaping, Side, MAX_PATHS};
pub use counters::Counters;
pub use delay::Delay;
pub use error::LabError;
pub use lab::Lab;
pub use topo::{LabSpec, PathInfo, TBF_LATENCY_MS, TBF_MIN_BURST, TBF_MPU, TBF_OVERHEAD};

use std::io::Write;
use std::process::Command;

/// Checks that labs can be built here: running as root, with `ip` and `tc`.
///
/// # Errors
/// [`LabError::NotRoot`] or [`LabError::ToolMissing`], whose messages say
/// what to do.
pub fn available() -> Result<(), LabError> {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        return Err(LabError::NotRoot);
    }
    for tool in ["ip", "tc"] {
        let mut c = Command::new(tool);
        c.arg("-V");
        cmd::run(c, None, cmd::TOOL_TIMEOUT)?;
    }
    Ok(())
}

/// Whether a lab test should run. Outside CI, an unusable lab makes the
/// test skip with a line on stderr naming it and the reason; with the `CI`
/// environment variable set, nothing may skip, so this panics instead.
///
/// ```no_run
/// #[test]
/// fn failover_over_two_paths() {
///     if !braid_lab::require_or_skip("failover_over_two_paths") {
///         return;
///     }
///     // ...
/// }
/// ```
///
/// # Panics
/// Under CI when [`available`] fails.
pub fn require_or_skip(test_name: &str) -> bool {
    match available() {
        Ok(()) => true,
        Err(e) if in_ci() => panic!("{test_name}: the lab is required in CI but unusable: {e}"),
        Err(e) => {
            // Straight to the stderr handle, not eprintln!: the test harness
            // captures the macros' output of passing tests, and a skip must
            // be seen.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test_name}: {e} (set CI=1 to make this a failure)"
            );
            false
        }
    }
}

mod known_needs {
    // The tools list is for the build scripts; here only the files.
    #![allow(dead_code)]
    include!("../../test-needs/src/needs.rs");
}

/// Whether every need of a `#[needs(...)]` test (`braid-test-needs`) is
/// met: "root", a need found by a file (`libiscsi-dev`), or a tool on
/// PATH. Outside CI a missing need is reported (SKIPPED, with what to
/// install) and the test passes over; under CI it fails the test, since
/// CI installs everything.
pub fn needs(needs: &[&str]) -> bool {
    let missing: Vec<String> = needs
        .iter()
        .filter_map(|need| {
            let file = known_needs::OTHERS
                .iter()
                .find(|(n, _)| n == need)
                .map(|(_, f)| *f);
            let met = match file {
                // SAFETY: geteuid(2) cannot fail and touches no memory.
                Some(None) => (unsafe { libc::geteuid() }) == 0,
                Some(Some(f)) => std::path::Path::new(f).exists(),
                None => on_path(need),
            };
            (!met).then(|| match file {
                Some(None) => "root".to_owned(),
                Some(Some(f)) => format!("{need} ({f})"),
                None => format!("{need} on PATH"),
            })
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    if in_ci() {
        panic!(
            "{test}: CI must provide {}: scripts/test-all installs every tool the tests use, \
             as root",
            missing.join(", ")
        );
    }
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: needs {} (set CI=1 to make this a failure)",
        missing.join(", ")
    );
    false
}

fn on_path(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/sbin", "/sbin"].map(Into::into))
        .any(|dir: std::path::PathBuf| {
            std::fs::metadata(dir.join(tool)).is_ok_and(|m| {
                m.is_file()
                    && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
            })
        })
}

/// CI systems set `CI` (GitHub Actions, GitLab, and our `.ci/run`);
/// an empty or `false` value counts as unset.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}
