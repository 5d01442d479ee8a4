//! One client connection: the handshake driven over the stream, then the
//! transmission phase with many requests in flight and replies sent in
//! completion order.
//!
//! Generic over the stream so TCP, unix sockets (and later TLS) share it.
//! Three kinds of task run per connection: the reader (parses and validates
//! requests, reads WRITE payloads), one per request (runs it on the backend,
//! on a blocking thread when the backend blocks), and the writer (batches
//! replies onto the socket). Reader and writer are registered with the
//! [`Conn`] so a fence can cut them off.

mod dispatch;
mod execute;
mod forwarded;
mod payload;
mod sock;
mod started;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use braid_proto::wire::REQUEST_HEADER_LEN;
use braid_proto::{
    Command, Errno, ProtoError, Request, ServerConfig, ServerEvent, ServerHandshake, Session,
    TlsMode,
};
use bytes::{Buf as _, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tracing::{debug, info, warn, Instrument};

use crate::export::{Export, Exports};
use braid_store::registry::{Conn, Registry};
pub use braid_store::Limits;
pub(crate) use execute::{error_reply, Reply, ReplyStyle};
use writer::{Outgoing, Permits};

/// A WRITE payload larger than this after a failed validation is not read
/// and skipped but ends the connection: reading it would only feed an
/// attacker's bandwidth (the spec allows a hard disconnect there).
const MAX_DISCARD: u64 = 64 << 20;

/// Bytes semaphore granularity: permits count 4 KiB units.
const UNIT: usize = 4096;

/// Why a connection ended other than by the client's choice.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol: {0}")]
    Proto(#[from] ProtoError),
    #[error("handshake not finished within {0:?}")]
    HandshakeTimeout(Duration),
    #[error("TLS handshake failed: {0}")]
    Tls(std::io::Error),
    #[error("client sent data before the TLS handshake")]
    DataBeforeTls,
    #[error("WRITE of {0} bytes refused and too large to skip")]
    HugeRefusedWrite(u32),
    #[error("idle for {0:?}")]
    Idle(Duration),
}

/// A byte stream a connection runs over (TCP, unix socket, TLS).
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The socket's descriptor when bytes written to it go straight to the
    /// peer (not through TLS), so replies can use `sendfile`.
    fn socket_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// The peer is a TCP client on this host (see `ReplyStyle::sendfile`).
    fn same_host(&self) -> bool {
        false
    }
}

impl Stream for tokio::net::TcpStream {
    fn socket_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(std::os::fd::AsRawFd::as_raw_fd(self))
    }

    fn same_host(&self) -> bool {
        match (self.local_addr(), self.peer_addr()) {
            (Ok(local), Ok(peer)) => same_host(local.ip(), peer.ip()),
            _ => false,
        }
    }
}

/// A connection between these addresses stays on this host: the peer is a
/// loopback address, or the address it reached (the kernel routes a
/// host's own address over loopback).
fn same_host(local: std::net::IpAddr, peer: std::net::IpAddr) -> bool {
    let peer = peer.to_canonical();
    peer.is_loopback() || peer == local.to_canonical()
}

impl Stream for tokio::net::UnixStream {
    fn socket_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(std::os::fd::AsRawFd::as_raw_fd(self))
    }
}

impl Stream for tokio_rustls::server::TlsStream<Box<dyn Stream>> {}

/// What every connection of a server shares.
#[derive(Clone)]
pub(crate) struct ConnCtx {
    pub exports: Arc<Exports>,
    pub portals: Arc<Vec<String>>,
    pub registry: Arc<Registry>,
    pub limits: Limits,
    pub shutdown: watch::Receiver<bool>,
    /// With TLS configured, nothing is served before STARTTLS (FORCEDTLS).
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub sendfile: crate::Sendfile,
    /// Payload bytes in flight on the whole server, in 4 KiB units.
    pub budget: Arc<Semaphore>,
    /// This process's instance (`x-braid:instance`): random at each start,
    /// so an initiator whose path comes back can tell a restarted target
    /// (which may have lost unflushed writes) from the same one.
    pub instance: braid_proto::braid_ns::InstanceId,
}

/// Serves one connection to its end, then removes it from the registry.
/// Everything it logs, and every task it starts, is in a `conn` span that
/// names the connection, its peer and (once chosen) its export.
pub(crate) async fn serve(
    stream: Box<dyn Stream>,
    conn: Arc<Conn>,
    peer: Option<std::net::IpAddr>,
    ctx: ConnCtx,
) {
    let span = tracing::info_span!(
        "conn",
        id = %conn.id,
        peer = %conn.peer,
        export = tracing::field::Empty
    );
    async move {
        let result = run(stream, &conn, peer, &ctx).await;
        match result {
            Ok(()) => debug!("connection closed"),
            Err(e) => info!("connection closed: {e}"),
        }
        conn.drain().await;
        ctx.registry.remove(conn.id);
    }
    .instrument(span)
    .await;
}

async fn run(
    stream: Box<dyn Stream>,
    conn: &Arc<Conn>,
    peer: Option<std::net::IpAddr>,
    ctx: &ConnCtx,
) -> Result<(), ConnError> {
    let timeout = ctx.limits.handshake_timeout;
    // The client's time to finish the handshake; a fence it asks for
    // stops this clock while the server works on it (see `handshake`).
    let (deadline, mut due) = watch::channel(tokio::time::Instant::now() + timeout);
    let handshake = handshake(stream, conn, peer, ctx, &deadline);
    tokio::pin!(handshake);
    let mut stop = ctx.shutdown.clone();
    let done = loop {
        let at = *due.borrow_and_update();
        tokio::select! {
            done = &mut handshake => break done,
            () = tokio::time::sleep_until(at) => return Err(ConnError::HandshakeTimeout(timeout)),
            _ = due.changed() => {}
            // A stopping server has nothing to offer a client still choosing.
            _ = stop.wait_for(|s| *s) => return Ok(()),
        }
    };
    let Some((session, leftover, stream)) = done? else {
        return Ok(());
    };
    let Some(export) = ctx.exports.find(&session.export.name).cloned() else {
        return Ok(());
    };
    *conn.export.lock().unwrap_or_else(|p| p.into_inner()) = Some(export.name.clone());
    *conn.session.lock().unwrap_or_else(|p| p.into_inner()) = session.braid_session;
    // After the export is recorded: a gateway that switches incarnation
    // either cuts this connection by its export or is seen here.
    if let Some(peers) = &export.peers {
        if !peers.admits(conn.id) {
            info!("closed: the gateway reconnected to its cluster since this connection began");
            return Ok(());
        }
    }
    tracing::Span::current().record("export", export.name.as_str());
    debug!(structured = session.structured, "transmission");
    transmission(stream, leftover, session, export, conn, ctx).await
}

type Negotiated = Option<(Session, BytesMut, Box<dyn Stream>)>;

async fn handshake(
    mut stream: Box<dyn Stream>,
    conn: &Conn,
    peer: Option<std::net::IpAddr>,
    ctx: &ConnCtx,
    deadline: &watch::Sender<tokio::time::Instant>,
) -> Result<Negotiated, ConnError> {
    let mut hs = ServerHandshake::new(ServerConfig {
        conn_id: conn.id,
        portals: ctx.portals.as_ref().clone(),
        instance: Some(ctx.instance),
        tls: if ctx.tls.is_some() {
            TlsMode::Required
        } else {
            TlsMode::Off
        },
        ..ServerConfig::default()
    });
    let catalog = crate::catalog::PeerCatalog::new(&ctx.exports, peer);
    let mut buf = BytesMut::with_capacity(4096);
    loop {
        let out = hs.take_output();
        if !out.is_empty() {
            stream.write_all(&out).await?;
            stream.flush().await?;
        }
        let event = match hs.handle_input(&mut buf, &catalog) {
            Ok(ev) => ev,
            Err(e) => {
                // Whatever was answered before the violation still goes out.
                let out = hs.take_output();
                let _ = stream.write_all(&out).await;
                return Err(e.into());
            }
        };
        match event {
            ServerEvent::NeedInput => {
                if hs.has_output() {
                    continue;
                }
                if stream.read_buf(&mut buf).await? == 0 {
                    return Ok(None);
                }
            }
            ServerEvent::Transmission(session) => {
                stream.write_all(&hs.take_output()).await?;
                stream.flush().await?;
                return Ok(Some((*session, buf, stream)));
            }
            ServerEvent::Closed => {
                stream.write_all(&hs.take_output()).await?;
                stream.flush().await?;
                return Ok(None);
            }
            ServerEvent::Fence {
                ids,
                export,
                session,
            } => {
                let named: Vec<String> = ids.iter().map(ToString::to_string).collect();
                info!(?named, %export, "fence requested");
                // The client waits on the server here, which may take
                // longer than the handshake's timeout (a stalled Ceph
                // gateway is asked first, then blocklisted, then every
                // live one must have the map): its clock stops meanwhile.
                let fencing = std::time::Instant::now();
                let paused = *deadline.borrow();
                deadline.send_replace(tokio::time::Instant::now() + Duration::from_secs(1 << 30));
                let fenced = match ctx.registry.fence_scoped(&ids, &export, session).await {
                    // Ids this server does not know may be another
                    // server's, for an export served by several (Ceph
                    // gateways): they fence those. Elsewhere only ids
                    // this server (or its earlier process) issued are
                    // known to have nothing left in flight.
                    Ok(unknown) => match ctx.exports.find(&export).and_then(|e| e.peers.clone()) {
                        Some(peers) if !unknown.is_empty() => peers.fence(unknown).await,
                        Some(_) => Ok(()),
                        None => ctx.registry.vouch(&unknown).await,
                    },
                    Err(why) => Err(why),
                };
                deadline.send_replace(paused + fencing.elapsed());
                match fenced {
                    Ok(()) => {
                        info!(?named, "fence complete");
                        hs.fence_done(Ok(()));
                    }
                    Err(why) => {
                        warn!(%export, ?named, "fence refused: {why}");
                        hs.fence_done(Err(format!("fence refused: {why}")));
                    }
                }
            }
            ServerEvent::StartTls => {
                stream.write_all(&hs.take_output()).await?;
                stream.flush().await?;
                // The client must wait for the ACK before starting TLS.
                if !buf.is_empty() {
                    return Err(ConnError::DataBeforeTls);
                }
                let acceptor = ctx.tls.clone().expect("StartTls only in TLS mode");
                let tls = acceptor.accept(stream).await.map_err(ConnError::Tls)?;
                debug!("TLS established");
                stream = Box::new(tls);
                hs.tls_established();
            }
        }
    }
}

async fn transmission(
    stream: Box<dyn Stream>,
    leftover: BytesMut,
    session: Session,
    export: Arc<Export>,
    conn: &Arc<Conn>,
    ctx: &ConnCtx,
) -> Result<(), ConnError> {
    let sock = stream
        .socket_fd()
        .and_then(|fd| sock::SockWriter::new(fd, ctx.limits.send_timeout).ok());
    let same_host = stream.same_host();
    let (rd, wr) = tokio::io::split(stream);
    let (tx, rx) = mpsc::unbounded_channel::<Outgoing>();
    let zero_copy = sock.is_some();
    let writer = match sock {
        Some(sock) => tokio::spawn(writer::sock_write_loop(sock, wr, rx).in_current_span()),
        None => tokio::spawn(writer::write_loop(wr, rx, ctx.limits.send_timeout).in_current_span()),
    };
    conn.own(writer.abort_handle());
    let reader = tokio::spawn(
        read_loop(
            rd,
            leftover,
            Reader {
                style: Arc::new(ReplyStyle {
                    structured: session.structured,
                    contexts: session.contexts.clone(),
                    zero_copy,
                    sendfile: zero_copy && ctx.sendfile.allows(same_host),
                }),
                negotiated: session.negotiated(),
                export,
                conn: conn.clone(),
                tx,
                requests: Arc::new(Semaphore::new(ctx.limits.max_requests)),
                bytes: Arc::new(Semaphore::new(ctx.limits.max_bytes.div_ceil(UNIT))),
                max_bytes_units: ctx.limits.max_bytes.div_ceil(UNIT),
                global: ctx.budget.clone(),
                global_units: ctx.limits.max_total_bytes.div_ceil(UNIT) as u32,
                idle_timeout: ctx.limits.idle_timeout,
            },
            ctx.shutdown.clone(),
        )
        .in_current_span(),
    );
    conn.own(reader.abort_handle());
    let mut reader = reader;
    let mut writer = writer;
    let read_result = tokio::select! {
        r = &mut reader => match r {
            Ok(r) => r,
            Err(e) if e.is_cancelled() => Ok(()),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        },
        // The writer ends first only when the socket failed or the client
        // took nothing for --send-timeout: nothing more can be answered,
        // so requests stop being read too and the connection closes.
        w = &mut writer => {
            reader.abort();
            conn.drain().await;
            return match w {
                Ok(w) => w,
                Err(e) if e.is_cancelled() => Ok(()),
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            };
        }
    };
    // Every request already received finishes before the writer is told
    // there is nothing more (its last sender is in those requests' tasks).
    conn.drain().await;
    match writer.await {
        Ok(w) => w?,
        Err(e) if e.is_cancelled() => {}
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
    read_result
}

struct Reader {
    /// Shared by every request's reply rather than copied into each: its
    /// contexts are a vector of names (two allocations a request for a
    /// client that selected `base:allocation`, as qemu and nbdcopy do).
    style: Arc<ReplyStyle>,
    negotiated: braid_proto::Negotiated,
    export: Arc<Export>,
    conn: Arc<Conn>,
    tx: mpsc::UnboundedSender<Outgoing>,
    requests: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    max_bytes_units: usize,
    global: Arc<Semaphore>,
    global_units: u32,
    idle_timeout: Option<Duration>,
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut rd: R,
    mut buf: BytesMut,
    r: Reader,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnError> {
    buf.reserve(64 * 1024);
    loop {
        while buf.len() < REQUEST_HEADER_LEN {
            let idle = async {
                match r.idle_timeout {
                    // Idle means nothing in flight: a client waiting for
                    // slow replies is not idle.
                    Some(t) => loop {
                        tokio::time::sleep(t).await;
                        if r.conn.inflight() == 0 {
                            return t;
                        }
                    },
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                n = rd.read_buf(&mut buf) => {
                    if n? == 0 {
                        return Ok(());
                    }
                }
                _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
                t = idle => return Err(ConnError::Idle(t)),
            }
        }
        let header: [u8; REQUEST_HEADER_LEN] = buf[..REQUEST_HEADER_LEN]
            .try_into()
            .expect("length checked above");
        buf.advance(REQUEST_HEADER_LEN);
        let req = Request::decode(&header)?;
        if req.command == Command::Disc {
            debug!("client disconnected");
            return Ok(());
        }
        if let Err(errno) = req.validate(&r.negotiated) {
            let skip = u64::from(req.payload_len());
            if skip > MAX_DISCARD {
                return Err(ConnError::HugeRefusedWrite(req.length));
            }
            payload::discard(&mut rd, &mut buf, skip).await?;
            r.refuse(&req, errno).await;
            continue;
        }
        let units = (req.length as usize).div_ceil(UNIT).min(r.max_bytes_units);
        let moves_data = matches!(req.command, Command::Read | Command::Write);
        let req_permit = take(&r.requests, 1).await;
        let (byte_permit, global_permit) = if moves_data && units > 0 {
            let conn = take(&r.bytes, units as u32).await;
            // The server-wide budget bounds memory across connections too.
            let global = take(&r.global, (units as u32).min(r.global_units)).await;
            (Some(conn), Some(global))
        } else {
            (None, None)
        };
        let payload = if req.command == Command::Write {
            Some(payload::read_payload(&mut rd, &mut buf, req.length as usize).await?)
        } else {
            None
        };
        r.dispatch(
            req,
            payload,
            Permits {
                _request: req_permit,
                _bytes: byte_permit,
                _global: global_permit,
            },
        );
    }
}

/// `n` permits of `sem`: taken at once when they are free, as they are
/// under any load short of the limits, without the future and waiter
/// queue of a wait; otherwise waited for in turn.
async fn take(sem: &Arc<Semaphore>, n: u32) -> OwnedSemaphorePermit {
    match sem.clone().try_acquire_many_owned(n) {
        Ok(permit) => permit,
        Err(_) => sem
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("never closed"),
    }
}

impl Reader {
    async fn refuse(&self, req: &Request, errno: Errno) {
        debug!(?req, %errno, "request refused");
        self.conn
            .stats
            .errors
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let permit = self
            .requests
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        let msg = format!(
            "{} of {} bytes at offset {} refused: {}",
            req.command.name(),
            req.length,
            req.offset,
            errno.describe()
        );
        let _ = self.tx.send(Outgoing {
            reply: error_reply(&self.style, req.cookie, errno, &msg),
            _permits: Permits {
                _request: permit,
                _bytes: None,
                _global: None,
            },
        });
    }
}

#[cfg(test)]
mod tests {
    use super::same_host;

    #[test]
    fn a_peer_on_loopback_or_at_the_address_it_reached_is_on_this_host() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert!(same_host(ip("127.0.0.2"), ip("127.0.0.1")));
        assert!(same_host(ip("::1"), ip("::1")));
        assert!(same_host(ip("::ffff:10.0.1.5"), ip("10.0.1.5")));
        assert!(same_host(ip("10.0.1.5"), ip("10.0.1.5")));
        assert!(!same_host(ip("10.0.1.5"), ip("10.0.1.2")));
        assert!(
            !same_host(ip("10.77.1.1"), ip("10.77.1.2")),
            "another namespace"
        );
    }
}
