//! The target as a whole: portals bound, connections accepted and served,
//! and an orderly stop (stop accepting, finish in-flight requests, flush
//! backends).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::conn::{self, ConnCtx, Limits};
use crate::export::Exports;
use crate::portal::{self, Portal};
use braid_store::registry::Registry;

/// How long a stopping server waits for connections to finish their
/// in-flight requests before it flushes and exits anyway.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A target with its portals bound, ready to [`Target::run`].
pub struct Target {
    exports: Arc<Exports>,
    listeners: Vec<(String, TcpListener)>,
    unix: Vec<(PathBuf, UnixListener)>,
    registry: Arc<Registry>,
    limits: Limits,
    stop_tx: watch::Sender<bool>,
    advertised: Vec<String>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    sendfile: Sendfile,
    /// This process's instance (`x-braid:instance`, and VPD page 0xC0
    /// over iSCSI): random per start.
    instance: braid_proto::braid_ns::InstanceId,
}

/// When large READs go out from the file with `sendfile` instead of
/// being copied into the reply (TCP without TLS only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sendfile {
    /// To peers on other hosts; over loopback the copy is cheaper.
    #[default]
    Remote,
    /// To every peer, this host's too.
    Always,
    /// Never: every READ is copied.
    Never,
}

impl Sendfile {
    pub(crate) fn allows(self, same_host: bool) -> bool {
        match self {
            Self::Remote => !same_host,
            Self::Always => true,
            Self::Never => false,
        }
    }
}

/// Stops a running target from elsewhere (a signal handler, a test).
#[derive(Clone)]
pub struct StopHandle(watch::Sender<bool>);

impl StopHandle {
    pub fn stop(&self) {
        self.0.send_replace(true);
    }

    /// Watches for the stop (true once stopped), for servers that stop
    /// with this target (iSCSI).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.0.subscribe()
    }
}

impl Target {
    /// Binds every portal. Must be called inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// The first portal that cannot be bound, named in the message.
    pub fn bind(exports: Exports, portals: &[Portal], limits: Limits) -> io::Result<Self> {
        let mut listeners = Vec::new();
        for p in portals {
            let std_listener = portal::bind(p)?;
            let local = std_listener.local_addr()?;
            listeners.push((local.to_string(), TcpListener::from_std(std_listener)?));
        }
        let advertised = advertise(listeners.iter().map(|(_, l)| l.local_addr()));
        let (stop_tx, _) = watch::channel(false);
        Ok(Self {
            exports: Arc::new(exports),
            listeners,
            unix: Vec::new(),
            registry: Arc::new(Registry::new()),
            limits,
            stop_tx,
            advertised,
            tls: None,
            sendfile: Sendfile::default(),
            instance: braid_proto::braid_ns::InstanceId(uuid::Uuid::new_v4().as_u128()),
        })
    }

    /// Requires TLS on every TCP connection (FORCEDTLS: nothing is listed or
    /// served before STARTTLS). Client certificates are checked if the
    /// configuration has a client verifier. Unix sockets stay plain: they
    /// are local and guarded by file permissions.
    pub fn set_tls(&mut self, config: Arc<tokio_rustls::rustls::ServerConfig>) {
        self.tls = Some(tokio_rustls::TlsAcceptor::from(config));
    }

    /// Which READs go out from the file with `sendfile` ([`Sendfile`]).
    pub fn set_sendfile(&mut self, sendfile: Sendfile) {
        self.sendfile = sendfile;
    }

    /// Also serves on a unix socket at `path` (replacing a stale socket
    /// file). Unix sockets are local, so they are not advertised as portals.
    ///
    /// # Errors
    ///
    /// The OS error from binding, with the path.
    pub fn bind_unix(&mut self, path: &Path) -> io::Result<()> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if meta.file_type().is_socket() {
                std::fs::remove_file(path)?;
            }
        }
        let l = UnixListener::bind(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        self.unix.push((path.to_owned(), l));
        Ok(())
    }

    /// The addresses actually bound (with real ports when 0 was asked).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|(_, l)| l.local_addr().ok())
            .collect()
    }

    /// What clients are told as `x-braid:portal=` contexts.
    pub fn advertised_portals(&self) -> &[String] {
        &self.advertised
    }

    /// This process's instance, as clients are told it.
    pub fn instance(&self) -> braid_proto::braid_ns::InstanceId {
        self.instance
    }

    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    pub fn exports(&self) -> Arc<Exports> {
        self.exports.clone()
    }

    pub fn stop_handle(&self) -> StopHandle {
        StopHandle(self.stop_tx.clone())
    }

    /// Serves until stopped, then finishes in-flight requests (up to a
    /// grace period), flushes every backend and returns.
    ///
    /// # Errors
    ///
    /// A backend flush failed at the end: data may not be stable.
    pub async fn run(self) -> io::Result<()> {
        let ctx = ConnCtx {
            exports: self.exports.clone(),
            portals: Arc::new(self.advertised.clone()),
            registry: self.registry.clone(),
            limits: self.limits.clone(),
            shutdown: self.stop_tx.subscribe(),
            tls: self.tls.clone(),
            sendfile: self.sendfile,
            budget: Arc::new(tokio::sync::Semaphore::new(
                self.limits.max_total_bytes.div_ceil(4096),
            )),
            instance: self.instance,
        };
        let mut accepting = JoinSet::new();
        for (name, listener) in self.listeners {
            accepting.spawn(accept_tcp(listener, name, ctx.clone()));
        }
        let local = ConnCtx { tls: None, ..ctx };
        for (path, listener) in self.unix {
            accepting.spawn(accept_unix(listener, path, local.clone()));
        }
        let mut stop = self.stop_tx.subscribe();
        let _ = stop.wait_for(|s| *s).await;
        info!("stopping: no new connections; finishing requests in flight");
        let mut conns = JoinSet::new();
        while let Some(r) = accepting.join_next().await {
            if let Ok(set) = r {
                conns.spawn(drain(set));
            }
        }
        if tokio::time::timeout(STOP_GRACE, async {
            while conns.join_next().await.is_some() {}
        })
        .await
        .is_err()
        {
            warn!("connections still busy after {STOP_GRACE:?}; flushing and exiting without them");
        }
        let mut result = Ok(());
        for e in self.exports.iter() {
            if !e.storage.unflushed() {
                debug!(export = %e.name, "nothing written since the last flush: none at exit");
                continue;
            }
            let flush = braid_store::exec::Job::new(braid_block::Op::Flush, 0, 0);
            let flushed = braid_store::exec::submit(e, flush, None)
                .await
                .map(drop)
                .map_err(|err| io::Error::other(err.to_string()));
            if let Err(err) = flushed {
                warn!(export = %e.name, "flush at exit failed: {err}");
                result = Err(err);
            }
        }
        result
    }
}

async fn drain(mut set: JoinSet<()>) {
    while set.join_next().await.is_some() {}
}

async fn accept_tcp(listener: TcpListener, portal: String, ctx: ConnCtx) -> JoinSet<()> {
    let mut conns = JoinSet::new();
    let mut stop = ctx.shutdown.clone();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                if let Err(why) = admit(&ctx, peer.ip()) {
                    warn!(%peer, %portal, "connection refused: {why}");
                    continue;
                }
                // The spec asks both sides to disable Nagle.
                let _ = stream.set_nodelay(true);
                let conn = ctx
                    .registry
                    .add(peer.to_string(), Some(peer.ip()), portal.clone());
                info!(conn = %conn.id, %peer, %portal, "connection");
                conns.spawn(conn::serve(
                    Box::new(stream),
                    conn,
                    Some(peer.ip()),
                    ctx.clone(),
                ));
            }
            Err(e) => {
                // Out of descriptors and the like: back off, keep serving.
                warn!(%portal, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        while conns.try_join_next().is_some() {}
    }
    conns
}

async fn accept_unix(listener: UnixListener, path: PathBuf, ctx: ConnCtx) -> JoinSet<()> {
    let mut conns = JoinSet::new();
    let mut stop = ctx.shutdown.clone();
    let name = path.display().to_string();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => break,
        };
        match accepted {
            Ok((stream, _)) => {
                if ctx.registry.count() >= ctx.limits.max_connections {
                    warn!(socket = %name, "connection refused: too many connections");
                    continue;
                }
                widen_send_buffer(&stream);
                let conn = ctx.registry.add("local".into(), None, name.clone());
                info!(conn = %conn.id, socket = %name, "connection");
                conns.spawn(conn::serve(Box::new(stream), conn, None, ctx.clone()));
            }
            Err(e) => {
                warn!(socket = %name, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        while conns.try_join_next().is_some() {}
    }
    let _ = std::fs::remove_file(&path);
    conns
}

/// A local socket's send buffer: room for a few 1 MiB replies at once.
/// At the default (208 KiB) a 1 MiB READ reply took about eight `writev`
/// calls, each followed by a wait for the client to drain the socket:
/// through `braid attach`, 27 to 29 system calls and 8 to 13 context
/// switches per 1 MiB read, against 12 to 17 and 3 to 7 with this.
const LOCAL_SEND_BUFFER: libc::c_int = 4 << 20;

/// Sets [`LOCAL_SEND_BUFFER`] on a Unix connection: past the system's cap
/// (`net.core.wmem_max`) where allowed (`CAP_NET_ADMIN`), else up to it.
/// A socket left at its default only costs system calls, so a refusal is
/// not an error.
fn widen_send_buffer(stream: &tokio::net::UnixStream) {
    let fd = std::os::fd::AsRawFd::as_raw_fd(stream);
    let set = |option| {
        // SAFETY: a valid descriptor, and an int option read from a live
        // local for the call.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                (&LOCAL_SEND_BUFFER as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            ) == 0
        }
    };
    if !set(libc::SO_SNDBUFFORCE) {
        set(libc::SO_SNDBUF);
    }
}

/// Whether one more connection from `peer` fits the limits.
fn admit(ctx: &ConnCtx, peer: std::net::IpAddr) -> Result<(), String> {
    let all = ctx.registry.list();
    if all.len() >= ctx.limits.max_connections {
        return Err(format!(
            "{} connections already (--max-connections)",
            all.len()
        ));
    }
    let mine = all.iter().filter(|c| c.peer_ip == Some(peer)).count();
    if mine >= ctx.limits.max_connections_per_client {
        return Err(format!(
            "{mine} connections from {peer} already (--max-connections-per-client)"
        ));
    }
    Ok(())
}

/// Portal names for clients. A wildcard listener (0.0.0.0, ::) stands for
/// every address of its family that a client could reach, so each of
/// those is advertised instead.
fn advertise(addrs: impl Iterator<Item = io::Result<SocketAddr>>) -> Vec<String> {
    let (ifaces, _) = braid_netif::reachable(&braid_netif::addrs().unwrap_or_default());
    let mut out: Vec<String> = Vec::new();
    for addr in addrs.flatten() {
        let expanded: Vec<SocketAddr> = if addr.ip().is_unspecified() {
            ifaces
                .iter()
                .filter(|a| a.ip.is_ipv4() == addr.is_ipv4())
                .map(|a| SocketAddr::new(a.ip, addr.port()))
                .collect()
        } else {
            vec![addr]
        };
        for a in expanded {
            let s = a.to_string();
            if !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}
