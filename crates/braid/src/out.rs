//! Standard output that outlives its reader.
//!
//! `println!` panics when standard output is closed: `braid copy ... |
//! head -1` ended in a panic and a backtrace after a copy that had
//! succeeded, and an `attach` whose terminal went away would stop serving
//! its device over a status line. Output that cannot be written is dropped
//! instead; the command carries on and exits with its own status, and
//! commands that only print (`status --watch`) ask [`closed`] to stop.
//! Standard error gets the same treatment ([`write_err`]): an error message
//! nobody can read must still leave the command's own exit status, not a
//! panic's.

use std::fmt;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes to standard output, dropping what cannot be written.
pub fn write(args: fmt::Arguments<'_>) {
    if put(std::io::stdout().lock(), args).is_err() {
        CLOSED.store(true, Ordering::Relaxed);
    }
}

/// Writes to standard error, dropping what cannot be written.
pub fn write_err(args: fmt::Arguments<'_>) {
    let _ = put(std::io::stderr().lock(), args);
}

fn put(mut w: impl Write, args: fmt::Arguments<'_>) -> std::io::Result<()> {
    w.write_fmt(args)?;
    w.flush()
}

/// Whether a write to standard output has failed: nobody reads it.
pub fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// `print!` through [`write()`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write(format_args!($($arg)*))
    };
}

/// `println!` through [`write()`].
macro_rules! outln {
    () => {
        $crate::out::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `eprint!` through [`write_err`].
macro_rules! err {
    ($($arg:tt)*) => {
        $crate::out::write_err(format_args!($($arg)*))
    };
}

/// `eprintln!` through [`write_err`].
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::write_err(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {err, errln, out, outln};
