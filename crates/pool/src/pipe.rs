//! READ data held in a kernel pipe instead of a buffer: spliced in from
//! one socket and out to another, so a proxy hands a payload on without
//! copying it through its own memory. A [`Piped`] holds a whole payload,
//! in one pipe or a few;
//! whoever cannot splice takes its bytes out with [`Piped::into_bytes`].

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use bytes::Bytes;

use crate::Pool;

/// The largest pipe made: what an unprivileged process may size one to by
/// default (`/proc/sys/fs/pipe-max-size`).
pub const PIPE_MAX: usize = 1 << 20;

/// The most pipes one payload is spread over, by default.
pub const PIPES: usize = 8;

/// One pipe of a payload and the bytes it holds.
#[derive(Debug)]
struct Part {
    read: OwnedFd,
    write: Option<OwnedFd>,
    len: usize,
}

impl Part {
    /// A non-blocking pipe with room for `len` bytes where the process
    /// may have one that large, and for at least half as many.
    fn new(len: usize) -> io::Result<Self> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors are fresh and owned here from now on.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let sized = [len.min(PIPE_MAX), (len / 2).min(PIPE_MAX)]
            .into_iter()
            .any(|size| {
                // SAFETY: fcntl on a pipe this function owns.
                unsafe {
                    libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, size as libc::c_int) >= 0
                }
            });
        if !sized {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            read,
            write: Some(write),
            len: 0,
        })
    }
}

/// Pipes being filled with one payload of a known length, in order.
///
/// A socket's bytes come in pieces that need not fill a page, and each
/// takes one of a pipe's slots, so a pipe holds less than its size; and
/// no pipe may be larger than [`PIPE_MAX`]. When one is full the payload
/// goes on in another ([`Self::grow`]).
#[derive(Debug)]
pub struct PipeFill {
    parts: Vec<Part>,
    most: usize,
    /// The largest pipe made for it.
    size: usize,
    want: usize,
    got: usize,
}

impl PipeFill {
    /// A first pipe for a `len`-byte payload, to be spread over at most
    /// `most` pipes.
    ///
    /// # Errors
    ///
    /// The kernel refused the pipe or its size (the user's pipe budget
    /// spent): the caller copies instead.
    pub fn new(len: usize, most: usize) -> io::Result<Self> {
        Self::sized(len, most, PIPE_MAX)
    }

    /// As [`Self::new`], with pipes of at most `size` bytes.
    ///
    /// # Errors
    ///
    /// As [`Self::new`].
    pub fn sized(len: usize, most: usize, size: usize) -> io::Result<Self> {
        Ok(Self {
            parts: vec![Part::new((2 * len).min(size))?],
            most,
            size,
            want: len,
            got: 0,
        })
    }

    /// One more pipe for the rest, the last one being full. `false` if the
    /// payload is spread over as many as it may be, or the kernel refused.
    pub fn grow(&mut self) -> bool {
        if self.parts.len() >= self.most {
            return false;
        }
        match Part::new((2 * self.missing()).min(self.size)) {
            Ok(part) => {
                self.parts.push(part);
                true
            }
            Err(_) => false,
        }
    }

    /// The end to splice into.
    pub fn write_fd(&self) -> RawFd {
        self.parts
            .last()
            .and_then(|p| p.write.as_ref())
            .map_or(-1, AsRawFd::as_raw_fd)
    }

    /// Bytes still missing.
    pub fn missing(&self) -> usize {
        self.want - self.got
    }

    /// Counts `n` bytes spliced in.
    pub fn filled(&mut self, n: usize) {
        let n = n.min(self.missing());
        self.got += n;
        if let Some(p) = self.parts.last_mut() {
            p.len += n;
        }
    }

    /// Copies `data` in (what a reader had already buffered). `false` if
    /// the pipe took less than all of it.
    pub fn push(&mut self, data: &[u8]) -> bool {
        if data.is_empty() {
            return true;
        }
        // SAFETY: writes from a live slice to a pipe this value owns.
        let n = unsafe { libc::write(self.write_fd(), data.as_ptr().cast(), data.len()) };
        if n > 0 {
            self.filled(n as usize);
        }
        n == data.len() as isize
    }

    /// The whole payload is in: the pipes, closed for writing.
    pub fn finish(self) -> Option<Piped> {
        (self.got == self.want).then(|| Piped {
            parts: self
                .parts
                .into_iter()
                .map(|p| (p.read, p.len))
                .filter(|(_, len)| *len > 0)
                .collect(),
            len: self.want,
        })
    }

    /// What is in the pipes so far, copied into `out`: the way back to a
    /// copy when the pipes cannot take the rest. Returns how many bytes
    /// were taken.
    ///
    /// # Errors
    ///
    /// Reading a pipe failed.
    pub fn spill(self, out: &mut [u8]) -> io::Result<usize> {
        let mut at = 0;
        for p in self.parts {
            read_all(&p.read, &mut out[at..at + p.len])?;
            at += p.len;
        }
        Ok(at)
    }
}

/// A whole payload waiting in pipes, in order, closed for writing.
#[derive(Debug)]
pub struct Piped {
    parts: Vec<(OwnedFd, usize)>,
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

    /// The pipes to splice from, in order, and the bytes each holds.
    pub fn parts(&self) -> impl Iterator<Item = (RawFd, usize)> + '_ {
        self.parts.iter().map(|(fd, len)| (fd.as_raw_fd(), *len))
    }

    /// The payload copied out into a pooled buffer, for a writer that
    /// cannot splice.
    ///
    /// # Errors
    ///
    /// Reading a pipe failed or it held less than its length.
    pub fn into_bytes(self) -> io::Result<Bytes> {
        let mut buf = Pool::global().get(self.len);
        let mut at = 0;
        for (fd, len) in &self.parts {
            read_all(fd, &mut buf[at..at + len])?;
            at += len;
        }
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
        let mut fill = PipeFill::new(10, PIPES).unwrap();
        assert!(fill.push(b"hello"));
        assert_eq!(fill.missing(), 5);
        let mut out = [0u8; 10];
        assert_eq!(fill.spill(&mut out).unwrap(), 5);
        assert_eq!(&out[..5], b"hello");

        let mut fill = PipeFill::new(10, PIPES).unwrap();
        assert!(fill.push(b"hello"));
        assert!(fill.push(b"world"));
        let piped = fill.finish().expect("the whole payload is in");
        assert_eq!(&piped.into_bytes().unwrap()[..], b"helloworld");
    }

    #[test]
    fn a_payload_goes_on_in_another_pipe_and_comes_back_in_order() {
        let mut fill = PipeFill::new(6, PIPES).unwrap();
        assert!(fill.push(b"abc"));
        assert!(fill.grow());
        assert!(fill.push(b"def"));
        let piped = fill.finish().unwrap();
        assert_eq!(piped.parts().map(|(_, n)| n).collect::<Vec<_>>(), [3, 3]);
        assert_eq!(&piped.into_bytes().unwrap()[..], b"abcdef");
    }

    #[test]
    fn a_pipe_short_of_its_payload_is_not_finished() {
        let mut fill = PipeFill::new(4, PIPES).unwrap();
        assert!(fill.push(b"ab"));
        assert!(fill.finish().is_none());
    }
}
