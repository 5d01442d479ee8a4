//! The reply writer of a plain (non-TLS) socket: `writev` for headers and
//! data in memory, `sendfile` for data read straight from an in-memory
//! file into the socket, so READ data is not copied through user space.
//!
//! It writes through its own duplicate of the socket descriptor, watched
//! for writability by tokio, while the reader keeps the original stream,
//! and no call sends more than the connection's [`Pace`] suggests.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use braid_pool::Pace;
use tokio::io::unix::AsyncFd;

use super::execute::FileData;

/// Writes replies to a socket by descriptor.
pub(crate) struct SockWriter {
    fd: AsyncFd<OwnedFd>,
    pace: Pace,
}

impl SockWriter {
    /// Wraps a duplicate of `socket` (already non-blocking, as tokio
    /// sockets are).
    ///
    /// # Errors
    ///
    /// `dup` or the registration with tokio failed.
    pub fn new(socket: RawFd) -> io::Result<Self> {
        // SAFETY: dup of a descriptor the caller keeps open; the result is
        // owned here and closed on drop.
        let dup = unsafe { libc::dup(socket) };
        if dup < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `dup` is a fresh descriptor nobody else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(dup) };
        // SAFETY: an OwnedFd's descriptor stays open, and the same, until
        // the AsyncFd that owns it is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(owned, tokio::io::Interest::WRITABLE) }
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(Self {
            fd,
            pace: Pace::new(),
        })
    }

    /// Writes every slice, in as few `writev` calls as the socket and the
    /// pace allow.
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub async fn writev(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        let start = std::time::Instant::now();
        let mut at = braid_pool::Progress::new(parts);
        let mut sent = 0;
        while !at.done(parts) {
            let mut guard = self.fd.writable().await?;
            let iov: Vec<libc::iovec> = at
                .pending_upto(parts, self.pace.slice())
                .map(|p| libc::iovec {
                    iov_base: p.as_ptr() as *mut libc::c_void,
                    iov_len: p.len(),
                })
                .collect();
            let result = guard.try_io(|fd| {
                // SAFETY: the iovecs point into `parts`, alive for the call.
                let n = unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match result {
                Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(Ok(n)) => {
                    at.advance(parts, n);
                    sent += n;
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        self.pace.record(sent, start.elapsed());
        Ok(())
    }

    /// Sends `data.len` bytes of the file from `data.offset`.
    ///
    /// # Errors
    ///
    /// The socket's or file's error, or the file ended early (the reply's
    /// header already promised the bytes, so the connection must end).
    pub async fn sendfile(&mut self, data: &FileData) -> io::Result<()> {
        let start = std::time::Instant::now();
        let file = data
            .backend
            .zero_copy_fd()
            .ok_or_else(|| io::Error::other("backend has no file to send from"))?;
        let mut offset = data.offset as libc::off_t;
        let mut left = data.len;
        while left > 0 {
            let slice = left.min(self.pace.slice());
            let mut guard = self.fd.writable().await?;
            let result = guard.try_io(|fd| {
                // SAFETY: both descriptors are open; sendfile advances
                // `offset` and reads nothing else.
                let n = unsafe { libc::sendfile(fd.as_raw_fd(), file, &mut offset, slice) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match result {
                Ok(Ok(0)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the file ended before the data promised in the reply",
                    ))
                }
                Ok(Ok(n)) => left -= n,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        self.pace.record(data.len, start.elapsed());
        Ok(())
    }

    /// Ends the sending side of the connection.
    pub fn shutdown(&self) {
        // SAFETY: shutdown on an open socket descriptor.
        unsafe { libc::shutdown(self.fd.get_ref().as_raw_fd(), libc::SHUT_WR) };
    }
}
