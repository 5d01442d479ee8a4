//! One NBD client connection: dialled (optionally from a given local
//! address or interface), negotiated with the `braid-proto` client
//! handshake, then run as two tasks — a writer that batches requests onto
//! the socket and a reader that matches replies to cookies, out of order,
//! and hands what it read to a [`Sink`].

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use braid_proto::wire::REQUEST_HEADER_LEN;
use braid_proto::{
    ClientConfig, ClientEvent, ClientHandshake, ClientOutcome, CmdFlags, Command, Cookie,
    ProtoError, Request,
};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, UnixStream};

use crate::uri::Endpoint;

mod payload;
mod run;
mod splice;

pub use crate::sink::Sink;
use run::read_one;
pub use run::{start, ConnHandle};

/// A byte stream an NBD connection runs over.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The TCP socket underneath, if any (for the kernel's figures).
    fn tcp_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// The socket itself carries the replies' bytes as they are (no TLS
    /// over it), so a payload can be spliced out of it.
    fn splice_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

impl Stream for tokio::net::TcpStream {
    fn tcp_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(std::os::fd::AsRawFd::as_raw_fd(self))
    }
    fn splice_fd(&self) -> Option<std::os::fd::RawFd> {
        self.tcp_fd()
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
    /// The kernel is waiting on the peer: data it sent is being
    /// retransmitted (an RTO fired), or a probe of a closed receive window
    /// went unanswered.
    pub stalled: bool,
    /// The peer's receive window is closed: its buffers are full (a slow
    /// server that has stopped reading), so new bytes cannot go out.
    pub window_closed: bool,
    /// Time since the last ACK came from the peer.
    pub last_ack: Duration,
}

/// The kernel's `TCP_INFO` of a socket, as it returns it; `None` if the
/// descriptor is not a TCP socket.
pub fn tcp_info_raw(fd: std::os::fd::RawFd) -> Option<libc::tcp_info> {
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
    // SAFETY: zero-initialised and (partly) filled by the kernel; every
    // field is a plain integer.
    (rc == 0).then(|| unsafe { info.assume_init() })
}

/// Reads `TCP_INFO` of a socket.
pub(crate) fn tcp_info(fd: std::os::fd::RawFd) -> Option<Wire> {
    let info = tcp_info_raw(fd)?;
    let min_rtt = (info.tcpi_min_rtt != 0 && info.tcpi_min_rtt != u32::MAX)
        .then(|| Duration::from_micros(u64::from(info.tcpi_min_rtt)));
    Some(Wire {
        bytes: info.tcpi_bytes_acked + info.tcpi_bytes_received,
        min_rtt,
        // One window probe is normally out while a full peer keeps its
        // window closed (each answer resets the count, the next probe
        // raises it to 1 again); two mean one went unanswered.
        stalled: info.tcpi_retransmits > 0 || info.tcpi_probes > 1,
        window_closed: info.tcpi_snd_wnd == 0,
        last_ack: Duration::from_millis(u64::from(info.tcpi_last_ack_recv)),
    })
}

/// A duplicate of the stream's TCP socket, for `TCP_INFO` however the
/// tasks that own the stream end.
pub(crate) fn dup_socket(stream: &dyn Stream) -> Option<std::os::fd::OwnedFd> {
    dup_fd(stream.tcp_fd())
}

/// A duplicate of `fd`, owned by the caller.
pub(crate) fn dup_fd(fd: Option<std::os::fd::RawFd>) -> Option<std::os::fd::OwnedFd> {
    fd.and_then(|fd| {
        // SAFETY: dup of a descriptor the stream keeps open; the copy is
        // owned by the caller and closed with it.
        let dup = unsafe { libc::dup(fd) };
        // SAFETY: a fresh descriptor nobody else owns.
        (dup >= 0).then(|| unsafe { std::os::fd::FromRawFd::from_raw_fd(dup) })
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
    /// The portal leads to other data than the first one did: another
    /// volume identity, or another size.
    #[error(
        "portal {portal} serves {found} but {first} serves {expected}: they are not the same \
         volume, so braid will not use them as paths of one (check --portal and the export name)"
    )]
    NotSameVolume {
        portal: String,
        found: String,
        first: String,
        expected: String,
    },
    /// The portal serves the volume (its identity matched) smaller than
    /// the volume was opened at: the image shrank under it.
    #[error(
        "portal {portal} serves {volume} at {found} bytes, less than the {opened} bytes it was \
         opened at: the image shrank under a running attach, so what lies past its new end is \
         gone and braid will not use this path; stop what uses the volume, then detach and \
         attach again (and check the file system on it) to use the image at its new size"
    )]
    Shrank {
        portal: String,
        volume: String,
        found: u64,
        opened: u64,
    },
    #[error("iSCSI login at {endpoint}")]
    Login {
        endpoint: String,
        #[source]
        source: braid_iscsi::initiator::LoginError,
    },
    #[error("{0}")]
    Other(String),
}

impl ConnectError {
    /// The portal leads to other data than the volume's (another volume,
    /// or the volume shrunk): trying again will not help until an
    /// operator acts.
    pub fn other_volume(&self) -> bool {
        matches!(self, Self::NotSameVolume { .. } | Self::Shrank { .. })
    }
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

impl Negotiated {
    /// Context id of `base:allocation`, when selected.
    pub fn allocation(&self) -> Option<u32> {
        self.outcome
            .contexts
            .iter()
            .find(|c| c.name == braid_proto::server::BASE_ALLOCATION)
            .map(|c| c.id)
    }
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
        let mut rd = tokio::io::BufReader::with_capacity(
            run::READ_BUFFER,
            (&mut prefix).chain(&mut n.stream),
        );
        loop {
            if !read_one(&mut rd, len.max(4096), None, None, &sink, &mut errors).await? {
                return Err("the server closed the connection".to_string());
            }
            if let Some(result) = sink.result.lock().unwrap_or_else(|p| p.into_inner()).take() {
                // What was read past the probe's reply (in the reader's
                // buffer, then what is left of the prefix) is the
                // connection's again.
                let mut left = BytesMut::from(rd.buffer());
                drop(rd);
                let pos = prefix.position() as usize;
                let rest = prefix.into_inner();
                left.extend_from_slice(&rest[pos.min(rest.len())..]);
                n.leftover = left;
                return result.map_err(|e| e.to_string());
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
    result: std::sync::Mutex<Option<Result<(), braid_block::Error>>>,
}

impl Sink for ProbeSink {
    fn read_len(&self, cookie: Cookie) -> Option<u32> {
        (cookie == PROBE_COOKIE).then_some(self.len)
    }
    fn data(&self, _: Cookie, _: Option<u64>, _: Bytes) {}
    fn hole(&self, _: Cookie, _: u64, _: u32) {}
    fn extents(&self, _: Cookie, _: Vec<braid_block::Extent>) {}
    fn done(&self, cookie: Cookie, error: Option<braid_block::Error>) {
        if cookie == PROBE_COOKIE {
            *self.result.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(error.map_or(Ok(()), Err));
        }
    }
    fn lost(&self, _: String) {}
}
