//! Log output: `tracing` to stderr, its level set by `-v`/`-q` or
//! `RUST_LOG`.

use tracing_subscriber::EnvFilter;

/// Installs the subscriber. `-v` shows debug, `-vv` trace; `-q` shows only
/// warnings, `-qq` only errors. `RUST_LOG`, when set, wins.
/// `quiet_target` keeps the in-process target at warnings (for `demo`,
/// where its connection lines would drown the output).
pub fn init(verbose: u8, quiet: u8, quiet_target: bool) {
    let level = match (i16::from(verbose) - i16::from(quiet)).clamp(-2, 2) {
        -2 => "error",
        -1 => "warn",
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        let target = if quiet_target && verbose == 0 {
            "warn"
        } else {
            level
        };
        EnvFilter::new(format!(
            "{level},braid_nbd_target={target},braid_iscsi_target={target},braid_gateway={target},braid_store={target}"
        ))
    });
    tracing_subscriber::fmt()
        // A closed log pipe must not stop the server: the subscriber's own
        // report of a failed write would panic on EPIPE in whichever task
        // was logging. Lost log lines are the lesser harm.
        .log_internal_errors(false)
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(std::io::stderr)
        .init();
}
