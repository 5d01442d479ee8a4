//! A connection at work: a writer task that batches requests onto the
//! socket, and a reader task that matches replies to cookies, out of order,
//! and hands what it read to a [`Sink`].

use std::io;
use std::sync::Arc;
use std::time::Duration;

use braid_block::Error;
use braid_proto::reply::{
    BlockStatus, ChunkHeader, ErrorChunk, OffsetData, OffsetHole, ReplyHeader,
};
use braid_proto::wire::{chunk_type, state, REQUEST_HEADER_LEN};
use braid_proto::{CmdFlags, Command, Cookie, Request};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::payload::read_bytes;
use super::splice::{Payload, Splicer};
use super::{tcp_info, Negotiated, Wire};
use crate::sink::Sink;

struct Out {
    header: [u8; REQUEST_HEADER_LEN],
    payload: Option<Bytes>,
    /// NBD_CMD_DISC: the last thing this connection sends.
    disc: bool,
}

/// A running connection.
pub struct ConnHandle {
    tx: Option<mpsc::UnboundedSender<Out>>,
    reader: JoinHandle<()>,
    writer: Option<JoinHandle<()>>,
    /// A duplicate of the TCP socket, for `TCP_INFO` (valid however the
    /// tasks end).
    socket: Option<std::os::fd::OwnedFd>,
}

impl ConnHandle {
    /// Queues a request; `false` if the connection is gone.
    pub fn send(&self, req: &Request, payload: Option<Bytes>) -> bool {
        let mut header = [0u8; REQUEST_HEADER_LEN];
        req.encode(&mut header);
        let disc = req.command == Command::Disc;
        self.tx.as_ref().is_some_and(|tx| {
            tx.send(Out {
                header,
                payload,
                disc,
            })
            .is_ok()
        })
    }

    /// Sends NBD_CMD_DISC; the writer then closes its side.
    pub fn disconnect(&self) {
        self.send(
            &Request {
                flags: CmdFlags(0),
                command: Command::Disc,
                cookie: Cookie(0),
                offset: 0,
                length: 0,
            },
            None,
        );
    }

    /// The kernel's figures of the connection (TCP only).
    pub fn wire(&self) -> Option<Wire> {
        tcp_info(std::os::fd::AsRawFd::as_raw_fd(self.socket.as_ref()?))
    }

    /// Drops the connection at once.
    pub fn abort(&self) {
        self.reader.abort();
        if let Some(w) = &self.writer {
            w.abort();
        }
    }

    /// Waits for the writer to send what is queued (after
    /// [`Self::disconnect`]), bounded, then drops the connection.
    pub async fn finish(mut self, timeout: Duration) {
        self.tx = None;
        if let Some(w) = self.writer.take() {
            let _ = tokio::time::timeout(timeout, w).await;
        }
    }
}

impl Drop for ConnHandle {
    fn drop(&mut self) {
        self.abort();
    }
}

/// Starts the reader and writer of a negotiated connection.
pub fn start(n: Negotiated, max_payload: u32, sink: Arc<dyn Sink>) -> ConnHandle {
    let socket = super::dup_socket(n.stream.as_ref());
    let splice = super::dup_fd(n.stream.splice_fd());
    let allocation = n.allocation();
    let (rd, wr) = tokio::io::split(n.stream);
    let (tx, rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_loop(wr, rx, sink.clone()).in_current_span());
    let reader = tokio::spawn(
        read_loop(rd, n.leftover, splice, max_payload, allocation, sink).in_current_span(),
    );
    ConnHandle {
        tx: Some(tx),
        reader,
        writer: Some(writer),
        socket,
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<Out>,
    sink: Arc<dyn Sink>,
) {
    let result: io::Result<()> = async {
        let mut batch: Vec<Out> = Vec::with_capacity(braid_pool::BATCH);
        let mut pace = braid_pool::Pace::new();
        while braid_pool::next_batch(&mut rx, &mut batch).await {
            let disc = batch.iter().any(|o| o.disc);
            let parts: Vec<&[u8]> = batch
                .iter()
                .flat_map(|o| std::iter::once(&o.header[..]).chain(o.payload.as_deref()))
                .collect();
            // Headers and payloads of every queued request in one writev.
            braid_pool::write_all_vectored(&mut wr, &parts, &mut pace, None).await?;
            batch.clear();
            if disc {
                wr.shutdown().await?;
                return Ok(());
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = result {
        sink.lost(format!("write failed: {e}"));
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    rd: R,
    leftover: BytesMut,
    splice: Option<std::os::fd::OwnedFd>,
    max_payload: u32,
    allocation: Option<u32>,
    sink: Arc<dyn Sink>,
) {
    // Bytes read past the handshake come first.
    let prefix = std::io::Cursor::new(leftover.freeze());
    let mut rd = BufReader::with_capacity(READ_BUFFER, prefix.chain(rd));
    let splicer = splice.and_then(Splicer::new);
    let mut errors: std::collections::HashMap<u64, Error> = Default::default();
    let reason = loop {
        // Splicing reads the socket itself: only once the leftover is used.
        let (prefix, _) = rd.get_ref().get_ref();
        let splice = splicer
            .as_ref()
            .filter(|_| prefix.position() >= prefix.get_ref().len() as u64);
        let reply = read_one(
            &mut rd,
            max_payload,
            allocation,
            splice,
            sink.as_ref(),
            &mut errors,
        );
        match reply.await {
            Ok(true) => {}
            Ok(false) => break "the server closed the connection".to_owned(),
            Err(e) => break e,
        }
    };
    sink.lost(reason);
}

/// The reply reader's buffer: one read takes in a batch of small replies
/// (64 4 KiB reads), but little of a large payload, whose rest goes
/// straight into its own buffer (see [`read_bytes`]).
pub(super) const READ_BUFFER: usize = 64 * 1024;

/// Reads one reply message. `Ok(false)` on a clean end of stream.
/// `allocation` is the context id of `base:allocation`, if selected.
pub(super) async fn read_one<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    max_payload: u32,
    allocation: Option<u32>,
    splice: Option<&Splicer>,
    sink: &dyn Sink,
    errors: &mut std::collections::HashMap<u64, Error>,
) -> Result<bool, String> {
    let mut head = [0u8; 20];
    match rd.read_exact(&mut head[..4]).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(format!("read failed: {e}")),
    }
    let len = ReplyHeader::header_len(head[..4].try_into().expect("4 bytes"))
        .map_err(|e| format!("protocol: {e}"))?;
    rd.read_exact(&mut head[4..len])
        .await
        .map_err(|e| format!("read failed: {e}"))?;
    let header = ReplyHeader::decode(&head[..len]).map_err(|e| format!("protocol: {e}"))?;
    match header {
        ReplyHeader::Simple(s) => {
            if let Some(errno) = s.errno() {
                sink.done(s.cookie, Some(Error::new(errno.kind(), errno.name())));
                return Ok(true);
            }
            match sink.read_len(s.cookie) {
                Some(n) => data_done(rd, splice, sink, s.cookie, None, n as usize).await?,
                None => sink.done(s.cookie, None),
            }
        }
        ReplyHeader::Chunk(c) => {
            c.check(max_payload).map_err(|e| format!("protocol: {e}"))?;
            let ended = chunk(rd, &c, allocation, splice, sink, errors).await?;
            if c.done() && !ended {
                sink.done(c.cookie, errors.remove(&c.cookie.0));
            }
        }
    }
    Ok(true)
}

async fn chunk<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    c: &ChunkHeader,
    allocation: Option<u32>,
    splice: Option<&Splicer>,
    sink: &dyn Sink,
    errors: &mut std::collections::HashMap<u64, Error>,
) -> Result<bool, String> {
    match c.kind {
        chunk_type::NONE => {}
        chunk_type::OFFSET_DATA => {
            let mut off = [0u8; 8];
            rd.read_exact(&mut off)
                .await
                .map_err(|e| format!("read failed: {e}"))?;
            let offset = OffsetData::decode(&off).offset;
            let n = c.length as usize - 8;
            if c.done() && !errors.contains_key(&c.cookie.0) {
                data_done(rd, splice, sink, c.cookie, Some(offset), n).await?;
                return Ok(true);
            }
            let data = read_bytes(rd, n).await?;
            sink.data(c.cookie, Some(offset), data);
        }
        chunk_type::OFFSET_HOLE => {
            let p = read_bytes(rd, c.length as usize).await?;
            let h = OffsetHole::decode(&p).map_err(|e| format!("protocol: {e}"))?;
            sink.hole(c.cookie, h.offset, h.length);
        }
        chunk_type::BLOCK_STATUS => {
            let p = read_bytes(rd, c.length as usize).await?;
            let s = BlockStatus::decode(&p).map_err(|e| format!("protocol: {e}"))?;
            if Some(s.context_id) == allocation {
                let extents = s.extents.iter();
                sink.extents(
                    c.cookie,
                    extents
                        .map(|e| state::extent(u64::from(e.length), e.flags))
                        .collect(),
                );
            }
        }
        kind => {
            // Every other type passed `check` only as an error chunk.
            let p = read_bytes(rd, c.length as usize).await?;
            let e = ErrorChunk::decode(kind, &p).map_err(|e| format!("protocol: {e}"))?;
            errors.entry(c.cookie.0).or_insert_with(|| {
                Error::new(e.error.kind(), format!("{}: {}", e.error.name(), e.message))
            });
        }
    }
    Ok(false)
}

/// Reads the `n`-byte payload that ends a successful READ reply and hands
/// it to the sink with the reply's end: in a pipe where the connection
/// can splice and the sink takes one, else in a buffer.
async fn data_done<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    splice: Option<&Splicer>,
    sink: &dyn Sink,
    cookie: Cookie,
    offset: Option<u64>,
    n: usize,
) -> Result<(), String> {
    let splice = splice
        .filter(|_| Splicer::worth(n, rd.buffer().len()) && sink.pipe_ok(cookie, offset, n as u32));
    match splice {
        Some(s) => match s.read(rd, n).await? {
            Payload::Piped(piped) => sink.piped_done(cookie, offset, piped),
            Payload::Copied(data) => sink.data_done(cookie, offset, data),
        },
        None => sink.data_done(cookie, offset, read_bytes(rd, n).await?),
    }
    Ok(())
}
