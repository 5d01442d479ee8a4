//! The reply writer of a plain (non-TLS) socket: `writev` for headers and
//! data in memory, `sendfile` for data read straight from an in-memory
//! file into the socket, so READ data is not copied through user space.
//!
//! It writes through its own duplicate of the socket descriptor, watched
//! for writability by tokio, while the reader keeps the original stream,
//! and no call sends more than the connection's [`Pace`] suggests.
//!
//! Between those calls it yields its worker. A slice is up to half a
//! millisecond of the link's work done inside the system call, and the
//! socket is usually still writable after it, so without a yield a large
//! reply kept its worker for the whole reply: on the lab (1gbit + 100mbit,
//! 1 MiB reads at queue depth 1, packet captures on both ends) the other
//! path's request, read by a task queued on the same worker, was answered
//! only once the 932 KiB on the fast path had left, 8 ms late, in one
//! request of ten. With the yield, the slow path's reply starts within
//! 0.1 ms of its request in 300 of 301, and 1 MiB reads at queue depth 1
//! rose from 194-199 to 220-225 MB/s on 2 x 1gbit (`--shaping frames`)
//! and from 120-123 to 124-127 on 1gbit + 100mbit.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use braid_pool::Pace;
use tokio::io::unix::AsyncFd;

use super::execute::FileData;

/// Writes replies to a socket by descriptor.
pub(crate) struct SockWriter {
    fd: AsyncFd<OwnedFd>,
    pace: Pace,
    /// How long the client may take nothing before the writer gives up
    /// (`--send-timeout`).
    stall: Option<std::time::Duration>,
}

impl SockWriter {
    /// Wraps a duplicate of `socket` (already non-blocking, as tokio
    /// sockets are).
    ///
    /// # Errors
    ///
    /// `dup` or the registration with tokio failed.
    pub fn new(socket: RawFd, stall: Option<std::time::Duration>) -> io::Result<Self> {
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
            stall,
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
            let mut guard = braid_pool::taken_within(self.stall, self.fd.writable()).await?;
            let result = guard.try_io(|fd| {
                // Built here, not held across the yield below: iovecs are
                // raw pointers, and the writer's future must stay `Send`.
                let iov: Vec<libc::iovec> = at
                    .pending_upto(parts, self.pace.slice())
                    .map(|p| libc::iovec {
                        iov_base: p.as_ptr() as *mut libc::c_void,
                        iov_len: p.len(),
                    })
                    .collect();
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
                    if !at.done(parts) {
                        drop(guard);
                        tokio::task::yield_now().await;
                    }
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
        let file = data
            .backend
            .zero_copy_fd()
            .ok_or_else(|| io::Error::other("backend has no file to send from"))?;
        let mut offset = data.offset as libc::off_t;
        self.send_from(
            data.len,
            "the file ended before the data promised in the reply",
            |fd, slice| {
                // SAFETY: both descriptors are open; sendfile advances
                // `offset` and reads nothing else.
                unsafe { libc::sendfile(fd, file, &mut offset, slice) }
            },
        )
        .await
    }

    /// Sends a payload held in a pipe, spliced into the socket: the bytes
    /// go from the pipe's pages to the socket without a copy here.
    ///
    /// # Errors
    ///
    /// The socket's error, or the pipe held less than its length.
    pub async fn splice(&mut self, piped: &braid_pool::Piped) -> io::Result<()> {
        for (pipe, len) in piped.parts() {
            self.splice_one(pipe, len).await?;
        }
        Ok(())
    }

    async fn splice_one(&mut self, pipe: RawFd, len: usize) -> io::Result<()> {
        self.send_from(
            len,
            "the pipe held less than the data promised in the reply",
            |fd, slice| {
                // SAFETY: both descriptors are open; no offsets are passed.
                unsafe {
                    libc::splice(
                        pipe,
                        std::ptr::null_mut(),
                        fd,
                        std::ptr::null_mut(),
                        slice,
                        libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
                    )
                }
            },
        )
        .await
    }

    /// Sends `len` bytes with `call(socket, slice)`, a system call that
    /// moves up to `slice` bytes from elsewhere into the socket, in slices
    /// of the pace, yielding the worker between them.
    async fn send_from(
        &mut self,
        len: usize,
        ended: &'static str,
        mut call: impl FnMut(RawFd, usize) -> isize,
    ) -> io::Result<()> {
        let start = std::time::Instant::now();
        let mut left = len;
        while left > 0 {
            let slice = left.min(self.pace.slice());
            let mut guard = braid_pool::taken_within(self.stall, self.fd.writable()).await?;
            let result = guard.try_io(|fd| {
                let n = call(fd.as_raw_fd(), slice);
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match result {
                Ok(Ok(0)) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, ended)),
                Ok(Ok(n)) => {
                    left -= n;
                    if left > 0 {
                        drop(guard);
                        tokio::task::yield_now().await;
                    }
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        self.pace.record(len, start.elapsed());
        Ok(())
    }

    /// Ends the sending side of the connection.
    pub fn shutdown(&self) {
        // SAFETY: shutdown on an open socket descriptor.
        unsafe { libc::shutdown(self.fd.get_ref().as_raw_fd(), libc::SHUT_WR) };
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::backend::{Backend, FileBackend};

    /// A writer on one end of a socket pair, paced at [`MIN_SLICE`] per
    /// call, whose socket tokio already knows to be writable: the sends
    /// below fit the socket's buffer, so nothing in them waits.
    async fn writer() -> (SockWriter, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let mut w = SockWriter::new(ours.as_raw_fd(), None).unwrap();
        // 50 MB/s: half a millisecond of it is less than the smallest slice.
        w.pace.record(1_000_000, Duration::from_millis(20));
        assert_eq!(w.pace.slice(), braid_pool::MIN_SLICE);
        w.writev(&[b"x"]).await.unwrap();
        (w, theirs)
    }

    /// A task that says whether it has run.
    fn bystander() -> Arc<AtomicBool> {
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
        ran
    }

    fn received(mut theirs: UnixStream, len: usize) -> Vec<u8> {
        let mut got = vec![0u8; len];
        theirs.read_exact(&mut got).unwrap();
        got
    }

    fn current_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn a_reply_sent_in_several_slices_lets_other_tasks_run_between_them() {
        current_thread().block_on(async {
            let (mut w, theirs) = writer().await;
            let ran = bystander();
            let data: Vec<u8> = (0..2 * braid_pool::MIN_SLICE).map(|i| i as u8).collect();
            w.writev(&[&data]).await.unwrap();
            assert!(
                ran.load(Ordering::SeqCst),
                "another task on the worker waited for the whole reply"
            );
            let got = received(theirs, 1 + data.len());
            assert_eq!(got[0], b'x');
            assert!(got[1..] == data[..], "the bytes arrived changed");
        });
    }

    #[test]
    fn file_data_sent_in_several_slices_lets_other_tasks_run_between_them() {
        current_thread().block_on(async {
            let len = 2 * braid_pool::MIN_SLICE;
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let backend = FileBackend::memory(len as u64 + 4096).unwrap();
            backend.write_at(&data, 4096, false).unwrap();
            let file = FileData {
                backend: Arc::new(backend),
                offset: 4096,
                len,
            };
            let (mut w, theirs) = writer().await;
            let ran = bystander();
            w.sendfile(&file).await.unwrap();
            assert!(
                ran.load(Ordering::SeqCst),
                "another task on the worker waited for the whole file data"
            );
            let got = received(theirs, 1 + len);
            assert!(got[1..] == data[..], "the bytes arrived changed");
        });
    }
}
