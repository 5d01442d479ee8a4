//! The reply writers: each connection's one task that puts replies on the
//! socket, in batches, releasing each request's permits only once its
//! reply is on the wire.

use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::execute::{Piece, ZeroCopy};
use super::{sock, ConnError, Reply};

/// What a request holds while in flight: a request slot, and its payload
/// bytes on the connection's and on the server's budget.
pub(crate) struct Permits {
    pub(super) _request: OwnedSemaphorePermit,
    pub(super) _bytes: Option<OwnedSemaphorePermit>,
    pub(super) _global: Option<OwnedSemaphorePermit>,
}

/// A reply and the permits it holds until it is on the socket, so a client
/// that stops reading replies stops being read from.
pub(crate) struct Outgoing {
    pub(super) reply: Reply,
    pub(super) _permits: Permits,
}

/// The writer of a stream that is not a bare socket (TLS): each batch of
/// replies in as few vectored writes as the connection's pace allows.
pub(super) async fn write_loop<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    stall: Option<Duration>,
) -> Result<(), ConnError> {
    let mut batch: Vec<Outgoing> = Vec::with_capacity(braid_pool::BATCH);
    let mut pace = braid_pool::Pace::new();
    while braid_pool::next_batch(&mut rx, &mut batch).await {
        let parts: Vec<&[u8]> = batch
            .iter()
            .flat_map(|o| o.reply.parts.iter().map(|p| &p[..]))
            .collect();
        braid_pool::write_all_vectored(&mut wr, &parts, &mut pace, stall).await?;
        // Permits are released only now that the replies are on the wire.
        batch.clear();
    }
    wr.shutdown().await.ok();
    Ok(())
}

/// The writer of a plain socket: `writev` for bytes, `sendfile` for file
/// data, `splice` for data in a pipe. `_wr` is the stream's write half, kept (unused) so the stream is
/// not shut down under the duplicate descriptor.
pub(super) async fn sock_write_loop<W>(
    mut sock: sock::SockWriter,
    _wr: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) -> Result<(), ConnError> {
    let mut batch: Vec<Outgoing> = Vec::with_capacity(braid_pool::BATCH);
    while braid_pool::next_batch(&mut rx, &mut batch).await {
        let mut start = 0;
        while start < batch.len() {
            // Bytes up to and including the next reply with file data go
            // in one writev; then its file data, with sendfile.
            let end = batch[start..]
                .iter()
                .position(|o| o.reply.file.is_some())
                .map_or(batch.len(), |i| start + i + 1);
            let parts: Vec<&[u8]> = batch[start..end]
                .iter()
                .flat_map(|o| o.reply.parts.iter().map(|p| &p[..]))
                .collect();
            sock.writev(&parts).await?;
            match &batch[end - 1].reply.file {
                Some(ZeroCopy::File(file)) => sock.sendfile(file).await?,
                Some(ZeroCopy::Pieces(pieces)) => write_pieces(&mut sock, pieces).await?,
                None => {}
            }
            start = end;
        }
        batch.clear();
    }
    sock.shutdown();
    Ok(())
}

/// Bytes and pipes in turn: each run of bytes in one `writev`, each pipe
/// spliced.
async fn write_pieces(sock: &mut sock::SockWriter, pieces: &[Piece]) -> std::io::Result<()> {
    let mut start = 0;
    while start < pieces.len() {
        let end = pieces[start..]
            .iter()
            .position(|p| matches!(p, Piece::Pipe(_)))
            .map_or(pieces.len(), |i| start + i);
        let mem: Vec<&[u8]> = pieces[start..end]
            .iter()
            .filter_map(|p| match p {
                Piece::Mem(b) => Some(&b[..]),
                Piece::Pipe(_) => None,
            })
            .collect();
        if !mem.is_empty() {
            sock.writev(&mem).await?;
        }
        if let Some(Piece::Pipe(pipe)) = pieces.get(end) {
            sock.splice(pipe).await?;
        }
        start = end + 1;
    }
    Ok(())
}
