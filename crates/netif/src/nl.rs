//! The rtnetlink plumbing the other modules share: a socket to the
//! kernel's routing subsystem, requests built from a header and attributes,
//! and replies read message by message until the kernel says it is done.
//! Everything here answers for the caller's own network namespace.

use std::io;

/// `struct nlmsghdr`.
pub(crate) const NLMSG_HDR: usize = 16;

/// A `NETLINK_ROUTE` socket, closed on drop.
pub(crate) struct Socket(libc::c_int);

impl Socket {
    /// Opens a socket to the routing subsystem.
    pub(crate) fn route() -> io::Result<Self> {
        // SAFETY: plain socket(2); the descriptor is owned by the result.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self(raw))
    }

    /// Sends one request.
    pub(crate) fn send(&self, message: &[u8]) -> io::Result<()> {
        // SAFETY: the buffer is valid for its length; the kernel is the peer
        // (a null address sends to it).
        let sent = unsafe { libc::send(self.0, message.as_ptr().cast(), message.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads replies, handing each message of another type than DONE and
    /// ERROR to `on` as (type, body), until `on` returns true, the kernel
    /// ends a dump (NLMSG_DONE) or acknowledges (an error message with
    /// errno 0). A negative errno is returned as the error.
    pub(crate) fn replies(
        &self,
        mut on: impl FnMut(u16, &[u8]) -> io::Result<bool>,
    ) -> io::Result<()> {
        let mut buf = vec![0u8; 64 << 10];
        // The bound only guards against a kernel that never ends a reply.
        for _ in 0..10_000 {
            // SAFETY: recv writes at most buf.len() bytes into buf.
            let n = unsafe { libc::recv(self.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let n = usize::try_from(n).map_err(|_| bad("negative length"))?;
            if walk(&buf[..n], &mut on)? {
                return Ok(());
            }
        }
        Err(bad("the reply never ended"))
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

/// Walks the messages of one datagram; true once the reply is complete.
pub(crate) fn walk(
    mut buf: &[u8],
    on: &mut impl FnMut(u16, &[u8]) -> io::Result<bool>,
) -> io::Result<bool> {
    while buf.len() >= NLMSG_HDR {
        let len = u32_at(buf, 0) as usize;
        let kind = u16_at(buf, 4);
        if len < NLMSG_HDR || len > buf.len() {
            return Err(bad("a message longer than its datagram"));
        }
        let body = &buf[NLMSG_HDR..len];
        match kind {
            k if k == libc::NLMSG_DONE as u16 => return Ok(true),
            k if k == libc::NLMSG_ERROR as u16 => {
                let errno = body
                    .get(..4)
                    .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                if errno == 0 {
                    return Ok(true);
                }
                return Err(io::Error::from_raw_os_error(-errno));
            }
            k => {
                if on(k, body)? {
                    return Ok(true);
                }
            }
        }
        buf = &buf[align(len).min(buf.len())..];
    }
    Ok(false)
}

/// A request: header (sequence 1, port id left to the kernel) and body.
pub(crate) fn request(kind: u16, flags: u16, body: &[u8]) -> Vec<u8> {
    let len = (NLMSG_HDR + body.len()) as u32;
    let mut m = Vec::with_capacity(len as usize);
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&(flags | libc::NLM_F_REQUEST as u16).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(body);
    m
}

/// One route attribute, padded.
pub(crate) fn attr(ty: u16, value: &[u8]) -> Vec<u8> {
    let mut a = Vec::with_capacity(align(4 + value.len()));
    a.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    a.extend_from_slice(&ty.to_ne_bytes());
    a.extend_from_slice(value);
    a.resize(align(a.len()), 0);
    a
}

/// The (type, value) pairs of a run of route attributes; a truncated one
/// ends the run.
pub(crate) fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = usize::from(u16_at(buf, 0));
        if len < 4 || len > buf.len() {
            return None;
        }
        // NLA_F_NESTED and NLA_F_NET_BYTEORDER ride in the top bits.
        let ty = u16_at(buf, 2) & 0x3fff;
        let value = &buf[4..len];
        buf = &buf[align(len).min(buf.len())..];
        Some((ty, value))
    })
}

pub(crate) fn align(n: usize) -> usize {
    (n + 3) & !3
}

pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A 4-byte attribute value as u32, if it is one.
pub(crate) fn u32_of(v: &[u8]) -> Option<u32> {
    (v.len() >= 4).then(|| u32_at(v, 0))
}

pub(crate) fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

pub(crate) fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("rtnetlink: {what}"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A reply message as the kernel frames it.
    pub(crate) fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDR + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0u8; 10]);
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn acks_end_a_reply_and_errors_carry_their_errno() {
        let mut seen = 0;
        let mut on = |_: u16, _: &[u8]| {
            seen += 1;
            Ok(false)
        };
        let mut d = message(24, &[0u8; 12]);
        d.extend(message(libc::NLMSG_ERROR as u16, &0i32.to_ne_bytes()));
        assert!(walk(&d, &mut on).unwrap());
        assert_eq!(seen, 1);
        let e = message(
            libc::NLMSG_ERROR as u16,
            &(-libc::ENETUNREACH).to_ne_bytes(),
        );
        let err = walk(&e, &mut |_, _| Ok(false)).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENETUNREACH));
    }

    #[test]
    fn attributes_round_trip() {
        let mut run = attr(1, b"tbf\0");
        run.extend(attr(7, &9u32.to_ne_bytes()));
        let got: Vec<(u16, Vec<u8>)> = attrs(&run).map(|(t, v)| (t, v.to_vec())).collect();
        assert_eq!(got[0], (1, b"tbf\0".to_vec()));
        assert_eq!(u32_of(&got[1].1), Some(9));
        assert_eq!(c_string(&got[0].1), "tbf");
    }
}
