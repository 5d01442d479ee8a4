//! One NBD client connection: dialled (optionally from a given local
//! address or interface), negotiated with the `braid-proto` client
//! handshake, then run as two tasks — a writer that batches requests onto
//! the socket and a reader that matches replies to cookies, out of order,
//! and hands what it read to a [`Sink`].

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use braid_proto::reply::{
    BlockStatus, ChunkHeader, ErrorChunk, OffsetData, OffsetHole, ReplyHeader,
};
use braid_proto::wire::{chunk_type, REQUEST_HEADER_LEN};
use braid_proto::{
    ClientConfig, ClientEvent, ClientHandshake, ClientOutcome, CmdFlags, Command, Cookie, Errno,
    ProtoError, Request,
};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, UnixStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::uri::Endpoint;

/// A byte stream an NBD connection runs over.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The TCP socket underneath, if any (for the kernel's figures).
    fn tcp_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

impl Stream for tokio::net::TcpStream {
    fn tcp_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(std::os::fd::AsRawFd::as_raw_fd(self))
    }
}

impl Stream for UnixStream {}

impl Stream for tokio_rustls::client::TlsStream<Box<dyn Stream>> {
    fn tcp_fd(&self) -> Option<std::os::fd::RawFd> {
        self.get_ref().0.tcp_fd()
    }
}

/// What the kernel says about one TCP connection: bytes it has delivered
/// (acknowledged by the peer, and received from it) and its smallest
/// round trip. Unlike completions seen by this process, these do not
/// depend on when its tasks get a CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wire {
    pub bytes: u64,
    pub min_rtt: Option<Duration>,
}

/// Reads `TCP_INFO` of a socket.
fn tcp_info(fd: std::os::fd::RawFd) -> Option<Wire> {
    let mut info = std::mem::MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, which is
    // zero-initialised and that large.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: zero-initialised and (partly) filled by the kernel; every
    // field is a plain integer.
    let info = unsafe { info.assume_init() };
    let min_rtt = (info.tcpi_min_rtt != 0 && info.tcpi_min_rtt != u32::MAX)
        .then(|| Duration::from_micros(u64::from(info.tcpi_min_rtt)));
    Some(Wire {
        bytes: info.tcpi_bytes_acked + info.tcpi_bytes_received,
        min_rtt,
    })
}

/// Where a connection leaves this host from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Local {
    /// Interface to bind to (`SO_BINDTODEVICE`): traffic leaves by that
    /// NIC whatever the routing table says.
    pub device: Option<String>,
    /// Source address.
    pub addr: Option<IpAddr>,
}

impl std::fmt::Display for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.addr, &self.device) {
            (Some(a), Some(d)) => write!(f, "{a}%{d}"),
            (Some(a), None) => write!(f, "{a}"),
            (None, Some(d)) => write!(f, "%{d}"),
            (None, None) => write!(f, "*"),
        }
    }
}

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connecting to {endpoint} from {local}")]
    Dial {
        endpoint: String,
        local: String,
        #[source]
        source: io::Error,
    },
    #[error("connecting to {0}: timed out")]
    Timeout(String),
    #[error("handshake with {endpoint}")]
    Handshake {
        endpoint: String,
        #[source]
        source: ProtoError,
    },
    #[error("handshake with {endpoint}")]
    Io {
        endpoint: String,
        #[source]
        source: io::Error,
    },
    #[error("handshake with {0}: the server closed the connection")]
    Closed(String),
    #[error(
        "TLS with {endpoint} (check --tls-ca, --tls-cert, and the names in the server certificate)"
    )]
    Tls {
        endpoint: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Other(String),
}

/// An error with its causes, `outer: inner: innermost`, for log lines
/// (anyhow prints chains itself; logs need it spelled out).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// How long the kernel may hold unacknowledged data before it gives up on
/// a connection (TCP_USER_TIMEOUT), and how soon keepalives start.
const USER_TIMEOUT: Duration = Duration::from_secs(5);
const KEEPALIVE_IDLE: Duration = Duration::from_secs(2);

/// Opens a stream to `endpoint` from `local`.
///
/// # Errors
///
/// [`ConnectError::Dial`] or [`ConnectError::Timeout`].
pub async fn dial(
    endpoint: &Endpoint,
    local: &Local,
    timeout: Duration,
) -> Result<Box<dyn Stream>, ConnectError> {
    let dial_err = |source| ConnectError::Dial {
        endpoint: endpoint.to_string(),
        local: local.to_string(),
        source,
    };
    match endpoint {
        Endpoint::Unix(path) => {
            let s = tokio::time::timeout(timeout, UnixStream::connect(path))
                .await
                .map_err(|_| ConnectError::Timeout(endpoint.to_string()))?
                .map_err(dial_err)?;
            Ok(Box::new(s))
        }
        Endpoint::Tcp(addr) => {
            let socket = if addr.is_ipv4() {
                TcpSocket::new_v4()
            } else {
                TcpSocket::new_v6()
            }
            .map_err(dial_err)?;
            if let Some(dev) = &local.device {
                socket.bind_device(Some(dev.as_bytes())).map_err(dial_err)?;
            }
            if let Some(ip) = local.addr {
                socket.bind(SocketAddr::new(ip, 0)).map_err(dial_err)?;
            }
            let stream = tokio::time::timeout(timeout, socket.connect(*addr))
                .await
                .map_err(|_| ConnectError::Timeout(endpoint.to_string()))?
                .map_err(dial_err)?;
            stream.set_nodelay(true).map_err(dial_err)?;
            let sock = socket2::SockRef::from(&stream);
            // The kernel notices a dead peer too: keepalives on idle
            // connections, and a bound on unacknowledged data.
            let ka = socket2::TcpKeepalive::new()
                .with_time(KEEPALIVE_IDLE)
                .with_interval(Duration::from_secs(1))
                .with_retries(3);
            sock.set_tcp_keepalive(&ka).map_err(dial_err)?;
            sock.set_tcp_user_timeout(Some(USER_TIMEOUT))
                .map_err(dial_err)?;
            Ok(Box::new(stream))
        }
    }
}

/// TLS for the connections of a volume: how to verify the target, and the
/// name to verify it by (the URI's host, for every path).
#[derive(Clone)]
pub struct TlsClient {
    pub connector: tokio_rustls::TlsConnector,
    pub name: tokio_rustls::rustls::pki_types::ServerName<'static>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TlsClient({:?})", self.name)
    }
}

/// A connection after its handshake.
pub struct Negotiated {
    pub stream: Box<dyn Stream>,
    pub leftover: BytesMut,
    pub outcome: ClientOutcome,
}

/// Runs the client handshake over `stream`.
///
/// # Errors
///
/// The server refused or broke the protocol, the stream failed, or it
/// took longer than `timeout`.
pub async fn negotiate(
    stream: Box<dyn Stream>,
    mut cfg: ClientConfig,
    endpoint: &str,
    timeout: Duration,
    tls: Option<&TlsClient>,
) -> Result<Negotiated, ConnectError> {
    cfg.tls = tls.is_some();
    let mut stream = stream;
    let run = async move {
        let mut hs = ClientHandshake::new(cfg);
        let mut buf = BytesMut::with_capacity(4096);
        loop {
            let event = hs
                .handle_input(&mut buf)
                .map_err(|source| ConnectError::Handshake {
                    endpoint: endpoint.to_owned(),
                    source,
                })?;
            let out = hs.take_output();
            if !out.is_empty() {
                stream
                    .write_all(&out)
                    .await
                    .map_err(|source| ConnectError::Io {
                        endpoint: endpoint.to_owned(),
                        source,
                    })?;
                stream.flush().await.map_err(|source| ConnectError::Io {
                    endpoint: endpoint.to_owned(),
                    source,
                })?;
            }
            match event {
                ClientEvent::Done(outcome) => {
                    return Ok((*outcome, buf, stream));
                }
                ClientEvent::NeedInput => {
                    let n = stream
                        .read_buf(&mut buf)
                        .await
                        .map_err(|source| ConnectError::Io {
                            endpoint: endpoint.to_owned(),
                            source,
                        })?;
                    if n == 0 {
                        return match hs.eof() {
                            Some(outcome) => Ok((outcome, buf, stream)),
                            None => Err(ConnectError::Closed(endpoint.to_owned())),
                        };
                    }
                }
                ClientEvent::StartTls => {
                    let tls = tls.expect("STARTTLS is asked only with a TLS configuration");
                    if !buf.is_empty() {
                        return Err(ConnectError::Other(format!(
                            "{endpoint}: the server sent data before the TLS handshake"
                        )));
                    }
                    let up = tls
                        .connector
                        .connect(tls.name.clone(), stream)
                        .await
                        .map_err(|e| ConnectError::Tls {
                            endpoint: endpoint.to_owned(),
                            source: e,
                        })?;
                    stream = Box::new(up);
                    hs.tls_established();
                }
            }
        }
    };
    let (outcome, leftover, stream) = tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| ConnectError::Timeout(endpoint.to_owned()))??;
    Ok(Negotiated {
        stream,
        leftover,
        outcome,
    })
}

/// The cookie of a probe sent before a connection joins a path.
const PROBE_COOKIE: Cookie = Cookie(u64::MAX);

/// Reads `len` bytes at offset 0 and waits for the answer: proof that the
/// connection carries I/O, not just a handshake, before it joins a path.
///
/// # Errors
///
/// The read failed, the target answered with an error, or it took longer
/// than `timeout`.
pub async fn probe(n: &mut Negotiated, len: u32, timeout: Duration) -> Result<(), ConnectError> {
    if len == 0 {
        return Ok(());
    }
    let req = Request {
        flags: CmdFlags(0),
        command: Command::Read,
        cookie: PROBE_COOKIE,
        offset: 0,
        length: len,
    };
    let mut header = [0u8; REQUEST_HEADER_LEN];
    req.encode(&mut header);
    let sink = ProbeSink {
        len,
        result: std::sync::Mutex::new(None),
    };
    let run = async {
        n.stream
            .write_all(&header)
            .await
            .map_err(|e| e.to_string())?;
        n.stream.flush().await.map_err(|e| e.to_string())?;
        let mut prefix = std::io::Cursor::new(std::mem::take(&mut n.leftover));
        let mut errors = Default::default();
        let mut rd = (&mut prefix).chain(&mut n.stream);
        loop {
            if !read_one(&mut rd, len.max(4096), &sink, &mut errors).await? {
                return Err("the server closed the connection".to_string());
            }
            if let Some(result) = sink.result.lock().unwrap_or_else(|p| p.into_inner()).take() {
                let pos = prefix.position() as usize;
                let rest = prefix.into_inner();
                n.leftover = BytesMut::from(&rest[pos.min(rest.len())..]);
                return result.map_err(|(errno, msg)| format!("{errno}: {msg}"));
            }
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| ConnectError::Other("probe read: no answer in time".into()))?
        .map_err(|e| ConnectError::Other(format!("probe read: {e}")))
}

struct ProbeSink {
    len: u32,
    result: std::sync::Mutex<Option<Result<(), (Errno, String)>>>,
}

impl Sink for ProbeSink {
    fn read_len(&self, cookie: Cookie) -> Option<u32> {
        (cookie == PROBE_COOKIE).then_some(self.len)
    }
    fn data(&self, _: Cookie, _: Option<u64>, _: Bytes) {}
    fn hole(&self, _: Cookie, _: u64, _: u32) {}
    fn extents(&self, _: Cookie, _: BlockStatus) {}
    fn done(&self, cookie: Cookie, error: Option<(Errno, String)>) {
        if cookie == PROBE_COOKIE {
            *self.result.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(error.map_or(Ok(()), Err));
        }
    }
    fn lost(&self, _: String) {}
}

/// Receives what a connection's reader decodes. Calls for one cookie come
/// in wire order and end with [`Sink::done`] or [`Sink::data_done`].
pub trait Sink: Send + Sync + 'static {
    /// The length of the READ behind `cookie`, for simple replies (which do
    /// not say whether data follows); `None` if it is not a READ in flight.
    fn read_len(&self, cookie: Cookie) -> Option<u32>;
    /// READ data; `offset` is absolute, or `None` for a simple reply (the
    /// data then starts at the request's offset).
    fn data(&self, cookie: Cookie, offset: Option<u64>, data: Bytes);
    /// The last piece of a successful READ reply and its end at once: the
    /// common case, which a sink can take in one step.
    fn data_done(&self, cookie: Cookie, offset: Option<u64>, data: Bytes) {
        self.data(cookie, offset, data);
        self.done(cookie, None);
    }
    fn hole(&self, cookie: Cookie, offset: u64, len: u32);
    fn extents(&self, cookie: Cookie, status: BlockStatus);
    /// The reply is complete; `error` is the first error it carried.
    fn done(&self, cookie: Cookie, error: Option<(Errno, String)>);
    /// The connection failed; nothing more will come from it.
    fn lost(&self, reason: String);
}

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
    // SAFETY: dup of a descriptor the stream keeps open; the copy is owned
    // by the handle and closed with it.
    let socket = n.stream.tcp_fd().and_then(|fd| {
        let dup = unsafe { libc::dup(fd) };
        // SAFETY: a fresh descriptor nobody else owns.
        (dup >= 0).then(|| unsafe { std::os::fd::FromRawFd::from_raw_fd(dup) })
    });
    let (rd, wr) = tokio::io::split(n.stream);
    let (tx, rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_loop(wr, rx, sink.clone()));
    let reader = tokio::spawn(read_loop(rd, n.leftover, max_payload, sink));
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
            braid_pool::write_all_vectored(&mut wr, &parts, &mut pace).await?;
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
    max_payload: u32,
    sink: Arc<dyn Sink>,
) {
    // Bytes read past the handshake come first.
    let prefix = std::io::Cursor::new(leftover.freeze());
    let mut rd = BufReader::with_capacity(256 * 1024, prefix.chain(rd));
    let mut errors: std::collections::HashMap<u64, (Errno, String)> = Default::default();
    let reason = loop {
        match read_one(&mut rd, max_payload, sink.as_ref(), &mut errors).await {
            Ok(true) => {}
            Ok(false) => break "the server closed the connection".to_owned(),
            Err(e) => break e,
        }
    };
    sink.lost(reason);
}

/// Reads one reply message. `Ok(false)` on a clean end of stream.
async fn read_one<R: AsyncRead + Unpin>(
    rd: &mut R,
    max_payload: u32,
    sink: &dyn Sink,
    errors: &mut std::collections::HashMap<u64, (Errno, String)>,
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
                sink.done(s.cookie, Some((errno, format!("{errno}"))));
                return Ok(true);
            }
            match sink.read_len(s.cookie) {
                Some(n) => {
                    let data = read_bytes(rd, n as usize).await?;
                    sink.data_done(s.cookie, None, data);
                }
                None => sink.done(s.cookie, None),
            }
        }
        ReplyHeader::Chunk(c) => {
            c.check(max_payload).map_err(|e| format!("protocol: {e}"))?;
            let ended = chunk(rd, &c, sink, errors).await?;
            if c.done() && !ended {
                sink.done(c.cookie, errors.remove(&c.cookie.0));
            }
        }
    }
    Ok(true)
}

async fn chunk<R: AsyncRead + Unpin>(
    rd: &mut R,
    c: &ChunkHeader,
    sink: &dyn Sink,
    errors: &mut std::collections::HashMap<u64, (Errno, String)>,
) -> Result<bool, String> {
    match c.kind {
        chunk_type::NONE => {}
        chunk_type::OFFSET_DATA => {
            let mut off = [0u8; 8];
            rd.read_exact(&mut off)
                .await
                .map_err(|e| format!("read failed: {e}"))?;
            let offset = OffsetData::decode(&off).offset;
            let data = read_bytes(rd, c.length as usize - 8).await?;
            if c.done() && !errors.contains_key(&c.cookie.0) {
                sink.data_done(c.cookie, Some(offset), data);
                return Ok(true);
            }
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
            sink.extents(c.cookie, s);
        }
        kind => {
            // Every other type passed `check` only as an error chunk.
            let p = read_bytes(rd, c.length as usize).await?;
            let e = ErrorChunk::decode(kind, &p).map_err(|e| format!("protocol: {e}"))?;
            errors.entry(c.cookie.0).or_insert((e.error, e.message));
        }
    }
    Ok(false)
}

async fn read_bytes<R: AsyncRead + Unpin>(rd: &mut R, n: usize) -> Result<Bytes, String> {
    // A pooled buffer: no page faults or zeroing per chunk.
    let mut buf = braid_pool::Pool::global().get(n);
    rd.read_exact(&mut buf).await.map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            "the server closed the connection mid-reply".to_string()
        } else {
            format!("read failed: {e}")
        }
    })?;
    Ok(buf.into_bytes())
}
