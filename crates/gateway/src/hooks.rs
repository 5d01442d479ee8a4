//! Test hooks that hold a step of the gateway while a file exists, so that
//! a test can stall it at a chosen moment: active only in a build with the
//! `test-hooks` feature, and only when the test names the file in the
//! hook's environment variable.

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The file that `var` names, while it exists.
pub(crate) fn held(var: &str) -> Option<PathBuf> {
    if !braid_store::TEST_HOOKS {
        return None;
    }
    let path = PathBuf::from(std::env::var_os(var)?);
    path.exists().then_some(path)
}

/// Waits while the file that `var` names exists (at most two minutes),
/// saying `what` is held.
pub(crate) fn hold(var: &str, what: &str) {
    let Some(path) = held(var) else {
        return;
    };
    tracing::warn!(path = %path.display(), "TEST HOOK: {what} until the file is removed");
    let deadline = Instant::now() + Duration::from_secs(120);
    while path.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}
