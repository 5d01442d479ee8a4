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
        EnvFilter::new(directive(level, target))
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

/// The level directive: `level` for everything, `target` for the target
/// side (the store, the Ceph gateway, and every front end, by the log
/// target each states). A directive matches every target it prefixes, so
/// each names a whole crate.
fn directive(level: &str, target: &str) -> String {
    ["braid_store", "braid_gateway"]
        .into_iter()
        .chain(crate::serve::FRONT_ENDS.iter().map(|c| c.log_target))
        .fold(level.to_owned(), |out, t| format!("{out},{t}={target}"))
}

#[cfg(test)]
mod tests {
    use crate::serve::FRONT_ENDS;

    #[test]
    fn the_target_side_directive_names_every_front_end_and_no_more() {
        let d = super::directive("info", "warn");
        let entries: Vec<&str> = d.split(',').collect();
        assert_eq!(entries[0], "info");
        for c in FRONT_ENDS {
            assert!(entries.contains(&&*format!("{}=warn", c.log_target)), "{d}");
        }
        for t in [
            "braid_store",
            "braid_gateway",
            "braid_nbd_target",
            "braid_iscsi_target",
        ] {
            assert!(entries.contains(&&*format!("{t}=warn")), "{t}: {d}");
        }
        // A directive matches by prefix: `braid=warn` would quiet the
        // binary's own lines too, so every entry is a crate's whole name.
        for entry in &entries[1..] {
            let (name, _) = entry.split_once('=').expect("name=level");
            assert!(
                name.starts_with("braid_") && !name.contains("::"),
                "{entry}"
            );
        }
    }
}
