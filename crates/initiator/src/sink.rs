//! The one reply sink every transport's reader hands what it decoded to,
//! in neutral words: data at a volume offset, the end of a reply with a
//! [`braid_block::Error`], a port that cannot serve the unit now, a sign
//! that the target restarted, the connection lost. NBD's reader
//! (`conn`) and iSCSI's (`iscsi::conn`) map their protocol's words to
//! these calls, each in one place; the volume's sink takes them to the
//! engine without knowing which protocol spoke.

use braid_block::{Error, ErrorKind, Extent};
use braid_pool::Piped;
use braid_proto::Cookie;
use bytes::Bytes;

use crate::engine::Access;

/// What a target told beside its replies, in the engine's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// The target says it was reset or powered on, and may have lost
    /// writes it acknowledged: how it said so.
    Restarted(&'static str),
    /// The target says the access states of its ports changed: every
    /// path's should be read again.
    AccessChanged,
}

/// Receives what a connection's reader decodes. Calls for one cookie come
/// in wire order and end with [`Sink::done`], [`Sink::data_done`] or
/// [`Sink::elsewhere`].
pub trait Sink: Send + Sync + 'static {
    /// The length of the READ behind `cookie`, for replies that do not
    /// say whether data follows (NBD's simple replies); `None` if it is
    /// not a READ in flight.
    fn read_len(&self, cookie: Cookie) -> Option<u32>;
    /// READ data; `offset` is absolute, or `None` where the data starts
    /// at the request's offset.
    fn data(&self, cookie: Cookie, offset: Option<u64>, data: Bytes);
    /// The last piece of a successful READ reply and its end at once: the
    /// common case, which a sink can take in one step.
    fn data_done(&self, cookie: Cookie, offset: Option<u64>, data: Bytes) {
        self.data(cookie, offset, data);
        self.done(cookie, None);
    }
    /// Whether a successful READ reply's data, `len` bytes at `offset`
    /// (as for [`Sink::data`]) and the reply's end, may be handed on in a
    /// pipe ([`Sink::piped_done`]) rather than a buffer.
    fn pipe_ok(&self, _cookie: Cookie, _offset: Option<u64>, _len: u32) -> bool {
        false
    }
    /// [`Sink::data_done`] with the data in a pipe, after
    /// [`Sink::pipe_ok`] said yes. A sink that cannot keep the pipe takes
    /// its bytes out.
    fn piped_done(&self, cookie: Cookie, offset: Option<u64>, piped: Piped) {
        match piped.into_bytes() {
            Ok(data) => self.data_done(cookie, offset, data),
            Err(e) => self.done(
                cookie,
                Some(Error::new(
                    ErrorKind::Io,
                    format!("reading the reply's pipe: {e}"),
                )),
            ),
        }
    }
    /// `len` bytes of zeroes at absolute `offset`.
    fn hole(&self, cookie: Cookie, offset: u64, len: u32);
    /// Allocation from the request's offset on, in order (NBD's
    /// `base:allocation`; answers for other contexts are not passed on).
    fn extents(&self, cookie: Cookie, extents: Vec<Extent>);
    /// The reply is complete; `error` is the first error it carried.
    fn done(&self, cookie: Cookie, error: Option<Error>);
    /// The port cannot serve the unit now (`access`): the request was not
    /// carried out and may go to another path. A sink that cannot move
    /// requests fails it.
    fn elsewhere(&self, cookie: Cookie, access: Access) {
        self.done(
            cookie,
            Some(Error::new(
                ErrorKind::Io,
                format!("the port cannot serve the unit now ({access:?})"),
            )),
        );
    }
    /// The target told something beside a reply.
    fn signal(&self, _signal: Signal) {}
    /// The connection failed; nothing more will come from it.
    fn lost(&self, reason: String);
}
