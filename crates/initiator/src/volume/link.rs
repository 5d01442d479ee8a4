//! A path's connection, whatever it speaks: an NBD connection, or an
//! iSCSI session. The engine's chunks go through [`Link::send`] either
//! way; only what each is on the wire differs.

use std::sync::Arc;
use std::time::Duration;

use braid_proto::{CmdFlags, Command, Request};
use bytes::Bytes;

use crate::conn::{ConnHandle, Wire};
use crate::engine::SendChunk;
use crate::iscsi;

pub(crate) enum Link {
    Nbd(ConnHandle),
    Iscsi(Arc<iscsi::Conn>),
}

impl Link {
    /// Sends a chunk; `false` if the connection is gone.
    pub fn send(&self, s: &SendChunk, payload: Option<Bytes>) -> bool {
        match self {
            Self::Nbd(c) => c.send(
                &Request {
                    flags: CmdFlags::from_flags(s.flags),
                    command: Command::from_op(s.op),
                    cookie: s.cookie,
                    offset: s.offset,
                    length: s.len,
                },
                payload,
            ),
            Self::Iscsi(c) => c.send(s, payload),
        }
    }

    /// The kernel's figures of the connection.
    pub fn wire(&self) -> Option<Wire> {
        match self {
            Self::Nbd(c) => c.wire(),
            Self::Iscsi(c) => c.wire(),
        }
    }

    /// Drops the connection at once.
    pub fn abort(&self) {
        match self {
            Self::Nbd(c) => c.abort(),
            Self::Iscsi(c) => c.abort(),
        }
    }

    /// Ends the connection the way its protocol asks (NBD_CMD_DISC, or an
    /// iSCSI logout), bounded by `timeout`.
    pub async fn close(self, timeout: Duration) {
        match self {
            Self::Nbd(c) => {
                c.disconnect();
                c.finish(timeout).await;
            }
            Self::Iscsi(c) => {
                c.logout(timeout).await;
                c.abort();
            }
        }
    }
}
