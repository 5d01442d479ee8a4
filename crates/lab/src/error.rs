//! The lab's one error type. Each variant carries what failed (the command
//! line, its stderr, the path index) and its message says what to do about it.

use std::time::Duration;

/// Everything that can go wrong while building, changing or using a lab.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LabError {
    /// The process is not root; namespaces and qdiscs need CAP_NET_ADMIN.
    #[error("not root: the lab needs CAP_NET_ADMIN and CAP_SYS_ADMIN; run as root")]
    NotRoot,

    /// A tool the lab drives is not installed.
    #[error("`{tool}` not found: install the Debian package `{package}`")]
    ToolMissing {
        /// The program that could not be started.
        tool: String,
        /// The Debian package that provides it.
        package: &'static str,
    },

    /// A command ran but exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line, as a shell would show it.
        command: String,
        /// Its exit status, as the OS reported it.
        status: String,
        /// What it wrote to stderr, trimmed.
        stderr: String,
    },

    /// A command could not be started at all.
    #[error("cannot start `{command}`")]
    Spawn {
        /// The command line.
        command: String,
        /// Why the OS refused.
        #[source]
        source: std::io::Error,
    },

    /// A command did not finish in time; it has been killed.
    #[error("`{command}` did not finish within {after:?}; it was killed")]
    Timeout {
        /// The command line.
        command: String,
        /// How long it was given.
        after: Duration,
    },

    /// A file or system call the lab relies on failed.
    #[error("{what}")]
    Io {
        /// What the lab was doing, in words.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A path index outside `1..=paths`.
    #[error("no path {index}: this lab has paths 1..={paths}")]
    NoSuchPath {
        /// The index asked for (1-based).
        index: usize,
        /// How many paths the lab has.
        paths: usize,
    },

    /// A rate string that does not parse.
    #[error("invalid rate {input:?}: {reason}; write e.g. 1gbit, 100mbit, 2.5gbit or unlimited")]
    InvalidRate {
        /// What was given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A configuration that cannot be built.
    #[error("invalid lab configuration: {reason}")]
    InvalidConfig {
        /// What is wrong, and what to change.
        reason: String,
    },

    /// A tool's output was not what the lab expected.
    #[error("cannot read the output of {what}: {detail}")]
    Parse {
        /// Which tool's output.
        what: String,
        /// What was wrong with it.
        detail: String,
    },
}

impl LabError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        LabError::Io {
            what: what.into(),
            source,
        }
    }
}
