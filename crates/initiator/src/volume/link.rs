//! A path's connection, whatever it speaks (an NBD connection, an iSCSI
//! session): the engine's chunks go through [`Link::send`], one call
//! through the connection's vtable per chunk, with nothing allocated.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

use crate::conn::Wire;
use crate::engine::SendChunk;

/// A future a transport hands back, boxed: for what happens once per
/// path or per failure (dialing, fencing, closing), never per request.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One running connection of a path.
pub(crate) trait Link: Send + Sync + 'static {
    /// Sends a chunk; `false` if the connection is gone.
    fn send(&self, s: &SendChunk, payload: Option<Bytes>) -> bool;
    /// The kernel's figures of the connection.
    fn wire(&self) -> Option<Wire>;
    /// Drops the connection at once.
    fn abort(&self);
    /// Ends the connection the way its protocol asks (NBD_CMD_DISC, an
    /// iSCSI logout), bounded by `timeout`.
    fn close(self: Box<Self>, timeout: Duration) -> BoxFuture<'static, ()>;
    /// The connection itself, for its own transport's code (an iSCSI
    /// session's ALUA state, its reservation key).
    fn as_any(&self) -> &dyn Any;
}
