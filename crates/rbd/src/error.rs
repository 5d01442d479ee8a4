//! One error type for every librados and librbd call: what was being done
//! and the errno Ceph returned.

use std::io;

/// A failed librados or librbd call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{what}: {}", io::Error::from_raw_os_error(*.errno))]
pub struct Error {
    /// What was being done, e.g. `opening image rbd/vol`.
    pub what: String,
    /// The positive errno (`ESHUTDOWN` when this client is blocklisted).
    pub errno: i32,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Whether the OSDs refuse this client: another gateway (or an
    /// operator) blocklisted it, and it must reconnect as a new client.
    pub fn blocklisted(&self) -> bool {
        self.errno == crate::EBLOCKLISTED
    }
}

impl From<Error> for io::Error {
    /// Keeps the errno (so it maps to an NBD error and can be recognised),
    /// not the text.
    fn from(e: Error) -> Self {
        io::Error::from_raw_os_error(e.errno)
    }
}

/// `Ok(r)` for a non-negative return value, the error otherwise.
pub(crate) fn check(r: i64, what: impl FnOnce() -> String) -> Result<u64> {
    if r < 0 {
        Err(Error {
            what: what(),
            errno: i32::try_from(-r).unwrap_or(libc::EIO),
        })
    } else {
        Ok(r as u64)
    }
}
