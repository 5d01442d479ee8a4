//! READ data held in a kernel pipe instead of a buffer: spliced in from
//! one socket and out to another, so a proxy hands a payload on without
//! copying it through its own memory. A [`Piped`] holds a whole payload;
//! whoever cannot splice takes its bytes out with [`Piped::into_bytes`].

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use bytes::Bytes;

use crate::Pool;

/// The largest payload put in a pipe: what an unprivileged process may
/// size one to by default (`/proc/sys/fs/pipe-max-size`).
pub const PIPE_MAX: usize = 1 << 20;

/// A pipe being filled with one payload of a known length.
#[derive(Debug)]
pub struct PipeFill {
    read: OwnedFd,
    write: OwnedFd,
    want: usize,
    got: usize,
}

impl PipeFill {
    /// A non-blocking pipe with room for `len` bytes.
    ///
    /// # Errors
    ///
    /// `len` is past [`PIPE_MAX`], or the kernel refused the pipe or its
    /// size (the user's pipe budget spent): the caller copies instead.
    pub fn new(len: usize) -> io::Result<Self> {
        if len > PIPE_MAX {
            return Err(io::Error::other("payload larger than a pipe may hold"));
        }
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors are fresh and owned here from now on.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // A socket's bytes come in pieces that need not fill a page, and
        // each takes a slot: twice the payload's pages, where the process
        // may have pipes that large, else as many as it has bytes.
        let sized = [2 * len, len].into_iter().any(|size| {
            // SAFETY: fcntl on a pipe this function owns.
            unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, size as libc::c_int) >= 0 }
        });
        if !sized {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            read,
            write,
            want: len,
            got: 0,
        })
    }

    /// The end to splice into.
    pub fn write_fd(&self) -> RawFd {
        self.write.as_raw_fd()
    }

    /// Bytes still missing.
    pub fn missing(&self) -> usize {
        self.want - self.got
    }

    /// Counts `n` bytes spliced in.
    pub fn filled(&mut self, n: usize) {
        self.got = (self.got + n).min(self.want);
    }

    /// Copies `data` in (what a reader had already buffered). `false` if
    /// the pipe took less than all of it.
    pub fn push(&mut self, data: &[u8]) -> bool {
        if data.is_empty() {
            return true;
        }
        // SAFETY: writes from a live slice to a pipe this value owns.
        let n = unsafe { libc::write(self.write.as_raw_fd(), data.as_ptr().cast(), data.len()) };
        if n > 0 {
            self.filled(n as usize);
        }
        n == data.len() as isize
    }

    /// The whole payload is in: the pipe, closed for writing.
    pub fn finish(self) -> Option<Piped> {
        (self.got == self.want).then(|| Piped {
            read: self.read,
            len: self.want,
        })
    }

    /// What is in the pipe so far, copied into `out` (at least
    /// [`Self::missing`]'s complement long): the way back to a copy when
    /// the pipe cannot take the rest (a payload in more pieces than the
    /// pipe has slots). Returns how many bytes were taken.
    ///
    /// # Errors
    ///
    /// Reading the pipe failed.
    pub fn spill(self, out: &mut [u8]) -> io::Result<usize> {
        drop(self.write);
        read_all(&self.read, &mut out[..self.got])?;
        Ok(self.got)
    }
}

/// A whole payload waiting in a pipe, closed for writing.
#[derive(Debug)]
pub struct Piped {
    read: OwnedFd,
    len: usize,
}

impl Piped {
    /// The payload's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The end to splice from.
    pub fn read_fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }

    /// The payload copied out into a pooled buffer, for a writer that
    /// cannot splice.
    ///
    /// # Errors
    ///
    /// Reading the pipe failed or it held less than its length.
    pub fn into_bytes(self) -> io::Result<Bytes> {
        let mut buf = Pool::global().get(self.len);
        read_all(&self.read, &mut buf[..])?;
        Ok(buf.into_bytes())
    }
}

/// Fills `out` from a pipe that already holds at least that much.
fn read_all(fd: &OwnedFd, out: &mut [u8]) -> io::Result<()> {
    let mut at = 0;
    while at < out.len() {
        let rest = &mut out[at..];
        // SAFETY: reads into a live slice from a pipe the caller owns.
        let n = unsafe { libc::read(fd.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len()) };
        match n {
            n if n > 0 => at += n as usize,
            0 => return Err(io::Error::other("the pipe held less than its payload")),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushed_bytes_come_back_whole_or_spilled() {
        let mut fill = PipeFill::new(10).unwrap();
        assert!(fill.push(b"hello"));
        assert_eq!(fill.missing(), 5);
        let mut out = [0u8; 10];
        assert_eq!(fill.spill(&mut out).unwrap(), 5);
        assert_eq!(&out[..5], b"hello");

        let mut fill = PipeFill::new(10).unwrap();
        assert!(fill.push(b"hello"));
        assert!(fill.push(b"world"));
        let piped = fill.finish().expect("the whole payload is in");
        assert_eq!(&piped.into_bytes().unwrap()[..], b"helloworld");
    }

    #[test]
    fn a_pipe_short_of_its_payload_is_not_finished() {
        let mut fill = PipeFill::new(4).unwrap();
        assert!(fill.push(b"ab"));
        assert!(fill.finish().is_none());
    }
}
