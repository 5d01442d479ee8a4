//! READ payloads spliced from a plain TCP connection's socket into a pipe,
//! for a front end that splices the pipe into its own client's socket
//! (`braid attach`): the payload's bytes then never pass through this
//! process's memory.
//!
//! The whole payload goes into the pipe before anything is handed on, so
//! a path that dies half way costs what it costs today (the chunk is read
//! again elsewhere) and never a short reply to the client. Where the pipe
//! cannot take the rest (the payload came in more pieces than the pipe has
//! slots) or the kernel cannot splice from the socket, what is in the pipe
//! is copied out and the rest read as usual.
//!
//! A pipe holds less than its size here (each piece the socket gives takes
//! a slot, and on loopback a piece is about 3.6 KiB, not a page) and is at
//! most 1 MiB for a process without `CAP_SYS_RESOURCE`: a 1 MiB payload
//! takes about 920 KiB in one, so it goes on in another.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use braid_pool::{PipeFill, Piped, Pool};
use bytes::Bytes;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufRead, AsyncRead, BufReader};

use super::payload::{read_bytes, read_rest};

/// Payloads from this long are worth pipes of their own (its creation
/// and closing cost four system calls; the copy it saves, at this size,
/// costs more).
pub(super) const PIPE_MIN: usize = 128 * 1024;

/// A payload as it came off the socket.
pub(super) enum Payload {
    Piped(Piped),
    Copied(Bytes),
}

/// A connection's socket, watched for readability through a duplicate of
/// its descriptor while the reader's stream keeps the original.
pub(super) struct Splicer {
    fd: AsyncFd<OwnedFd>,
    /// The most pipes a payload is spread over.
    pipes: usize,
    /// The largest pipe made.
    pipe_size: usize,
}

impl Splicer {
    /// `None` where tokio cannot watch the duplicate: the connection then
    /// copies every payload.
    pub fn new(dup: OwnedFd) -> Option<Self> {
        // SAFETY: an OwnedFd's descriptor stays open, and the same, until
        // the AsyncFd that owns it is dropped.
        unsafe { AsyncFd::register_with_interest(dup, tokio::io::Interest::READABLE) }
            .ok()
            .map(|fd| Self {
                fd,
                pipes: braid_pool::PIPES,
                pipe_size: braid_pool::PIPE_MAX,
            })
    }

    /// Whether an `n`-byte payload, of which `buffered` bytes the reader
    /// already holds, is worth a pipe.
    pub fn worth(n: usize, buffered: usize) -> bool {
        (PIPE_MIN..=braid_pool::PIPE_MAX).contains(&n) && buffered < n
    }

    /// Reads an `n`-byte payload that follows what `rd` has consumed: what
    /// `rd` holds of it first, the rest spliced from the socket. `rd` must
    /// read nothing else than the socket from here on (what it read before
    /// the socket, a handshake's leftover, is used up).
    pub async fn read<R: AsyncRead + Unpin>(
        &self,
        rd: &mut BufReader<R>,
        n: usize,
    ) -> Result<Payload, String> {
        let Ok(mut fill) = PipeFill::sized(n, self.pipes, self.pipe_size) else {
            return Ok(Payload::Copied(read_bytes(rd, n).await?));
        };
        let have = rd.buffer().len().min(n);
        let pushed = fill.push(&rd.buffer()[..have]);
        std::pin::Pin::new(&mut *rd).consume(have);
        if !pushed {
            return spill(rd, fill, n).await;
        }
        // Splice again at once while the socket may hold more, and wait
        // for it only once a splice found it empty: a pipe that filled
        // (EAGAIN too) with the rest already in the socket would otherwise
        // wait for readiness that bytes already there never bring back.
        let mut again = true;
        while fill.missing() > 0 {
            let result = if std::mem::take(&mut again) {
                match splice_in(self.fd.get_ref(), &fill) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(()),
                    r => Ok(r),
                }
            } else {
                let mut guard = self
                    .fd
                    .readable()
                    .await
                    .map_err(|e| format!("read failed: {e}"))?;
                guard
                    .try_io(|fd| splice_in(fd.get_ref(), &fill))
                    .map_err(|_| ())
            };
            match result {
                Ok(Ok(0)) => {
                    return Err(format!(
                        "the server closed the connection mid-reply ({} of {n} bytes of a \
                         payload spliced in; the client is sent none of it)",
                        n - fill.missing()
                    ))
                }
                Ok(Ok(k)) => {
                    fill.filled(k);
                    again = true;
                }
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EINVAL) => {
                    return spill(rd, fill, n).await
                }
                Ok(Err(e)) => return Err(format!("read failed: {e}")),
                // EAGAIN is the socket's (nothing to read) or the pipe's
                // (no slot left): bytes waiting on the socket say which.
                // The pipe's must be acted on at once: the socket will not
                // turn readable again while the rest already sits in it.
                Err(()) if queued(self.fd.get_ref()) => {
                    if !fill.grow() {
                        tracing::debug!(
                            len = n,
                            missing = fill.missing(),
                            "a reply's pipes are full: copying"
                        );
                        return spill(rd, fill, n).await;
                    }
                    again = true;
                }
                Err(()) => {}
            }
        }
        fill.finish()
            .map(Payload::Piped)
            .ok_or_else(|| "a reply's pipe came out short".to_string())
    }
}

/// One splice from the socket into the pipe being filled, of at most what
/// the payload still misses.
fn splice_in(socket: &OwnedFd, fill: &PipeFill) -> io::Result<usize> {
    // SAFETY: both descriptors are open; no offsets are passed.
    let n = unsafe {
        libc::splice(
            socket.as_raw_fd(),
            std::ptr::null_mut(),
            fill.write_fd(),
            std::ptr::null_mut(),
            fill.missing(),
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// What the pipe holds copied out, and the rest read through the reader.
async fn spill<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    fill: PipeFill,
    n: usize,
) -> Result<Payload, String> {
    let mut buf = Pool::global().get(n);
    let got = fill
        .spill(&mut buf)
        .map_err(|e| format!("reading back a reply's pipe: {e}"))?;
    read_rest(rd, &mut buf[got..]).await?;
    Ok(Payload::Copied(buf.into_bytes()))
}

/// Whether the socket has bytes waiting to be read.
fn queued(fd: &OwnedFd) -> bool {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) };
    rc == 0 && n > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// A connected pair of loopback TCP sockets, and a splicer on the
    /// first.
    async fn pair() -> (TcpStream, TcpStream, Splicer) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ours = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (theirs, _) = l.accept().await.unwrap();
        theirs.set_nodelay(true).unwrap();
        let dup = ours.as_fd().try_clone_to_owned().unwrap();
        (ours, theirs, Splicer::new(dup).unwrap())
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    fn bytes_of(p: Payload) -> (bool, Vec<u8>) {
        match p {
            Payload::Piped(p) => (true, p.into_bytes().unwrap().to_vec()),
            Payload::Copied(b) => (false, b.to_vec()),
        }
    }

    #[tokio::test]
    async fn a_payload_behind_buffered_bytes_comes_whole_through_the_pipe() {
        let (ours, mut theirs, splicer) = pair().await;
        let data = pattern(PIPE_MIN * 2);
        let mut rd = BufReader::with_capacity(4096, ours);
        theirs.write_all(&data[..4096]).await.unwrap();
        // The reader holds the first bytes, as after a reply's header.
        assert_eq!(rd.fill_buf().await.unwrap().len(), 4096);
        let rest = data[4096..].to_vec();
        let send = tokio::spawn(async move {
            theirs.write_all(&rest).await.unwrap();
            theirs
        });
        let (piped, got) = bytes_of(splicer.read(&mut rd, data.len()).await.unwrap());
        assert!(piped, "the payload was copied, not spliced");
        assert!(got == data, "spliced bytes differ");
        drop(send.await);
    }

    #[tokio::test]
    async fn a_payload_more_than_its_pipes_can_hold_is_copied_whole() {
        let (ours, mut theirs, mut splicer) = pair().await;
        // Past what one pipe can hold (256 slots of at most 32 KiB, the
        // largest piece a socket gives): the pipe fills before the payload
        // is in, and what it holds is copied out and the rest read after.
        splicer.pipes = 1;
        let data = pattern(16 << 20);
        let mut rd = BufReader::with_capacity(4096, ours);
        let sent = data.clone();
        let send = tokio::spawn(async move {
            theirs.write_all(&sent).await.unwrap();
            theirs
        });
        let (piped, got) = bytes_of(splicer.read(&mut rd, data.len()).await.unwrap());
        assert!(!piped, "full pipes still took the whole payload");
        assert!(got == data, "bytes copied after the pipes filled differ");
        drop(send.await);
    }

    /// A pipe that fills while the rest of the payload already waits in
    /// the socket: the splice goes on into the next pipe at once. The
    /// socket will not turn readable again (nothing more is coming), so a
    /// reader that waited for it would wait for ever; through attach it
    /// waited for the next bytes the path happened to bring, a probe's
    /// reply a quarter of a second later.
    #[tokio::test]
    async fn a_full_pipe_with_the_rest_already_in_the_socket_goes_on_at_once() {
        let (ours, mut theirs, mut splicer) = pair().await;
        // Pipes of one slot: each fills with one piece the socket gives,
        // so a payload of 96 KiB takes several.
        splicer.pipe_size = 4096;
        splicer.pipes = 96;
        let data = pattern(96 << 10);
        theirs.write_all(&data).await.unwrap();
        for _ in 0..1000 {
            if fionread(&ours) >= data.len() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert_eq!(fionread(&ours), data.len(), "the payload is not all queued");
        let mut rd = BufReader::with_capacity(4096, ours);
        // Bounded so that the old behaviour fails instead of hanging.
        let read = splicer.read(&mut rd, data.len());
        let got = tokio::time::timeout(std::time::Duration::from_secs(20), read)
            .await
            .expect("the splice waited for the socket with the rest already in it")
            .unwrap();
        let (piped, got) = bytes_of(got);
        assert!(piped, "the payload was copied, not spliced");
        assert!(got == data, "spliced bytes differ");
    }

    fn fionread(s: &TcpStream) -> usize {
        use std::os::fd::AsRawFd;
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int.
        unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut n) };
        n as usize
    }

    #[tokio::test]
    async fn a_connection_that_ends_mid_payload_is_an_error_and_hands_nothing_on() {
        let (ours, mut theirs, splicer) = pair().await;
        let mut rd = BufReader::with_capacity(4096, ours);
        theirs.write_all(&pattern(PIPE_MIN)).await.unwrap();
        drop(theirs);
        let e = match splicer.read(&mut rd, 2 * PIPE_MIN).await {
            Ok(_) => panic!("a short payload was handed on"),
            Err(e) => e,
        };
        assert!(e.contains("closed the connection mid-reply"), "{e}");
    }
}
