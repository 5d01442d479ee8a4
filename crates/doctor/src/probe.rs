//! The live probe: a short read over one path with braid's own connection
//! code (dial from the path's local side, NBD handshake, pipelined READs),
//! and what the kernel says of the connection afterwards (`TCP_INFO`).
//!
//! Read-only: it sends NBD READ and DISC only. It reads the same few MiB
//! over and over, which the target serves from its page cache, so the
//! figure is the path's, not the disk's. Bounded: a connect and handshake
//! of at most [`CONNECT_TIMEOUT`], reads for the time given, and a short
//! wait for the last replies.

use std::collections::HashSet;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use braid_initiator::conn::{self, Sink, TlsClient};
use braid_initiator::discover::PathSpec;
use braid_proto::{ClientConfig, CmdFlags, Command, Cookie, Request};
use bytes::Bytes;
use tokio::sync::mpsc;

/// How long connecting and the handshake may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Reads in flight.
const DEPTH: usize = 8;
/// The span read over and over: small enough to stay in the target's
/// cache, large enough for the requests in flight.
const SPAN: u64 = 8 << 20;

/// What one path's probe measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measured {
    /// Payload bytes read.
    pub bytes: u64,
    /// From the first request to the last reply.
    pub secs: f64,
    pub tcp: Option<TcpFigures>,
    /// Why the probe could not run or stopped early.
    pub error: Option<String>,
}

impl Measured {
    /// Bytes per second, when something was read.
    pub fn rate(&self) -> Option<f64> {
        (self.bytes > 0 && self.secs > 0.0).then(|| self.bytes as f64 / self.secs)
    }
}

/// The kernel's figures of the probe's connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpFigures {
    /// Smallest round trip seen, µs.
    pub min_rtt_us: u32,
    /// Segment size sent: the smaller of the peer's announced MSS and our
    /// path MTU's.
    pub snd_mss: u32,
    /// Segments retransmitted.
    pub retransmits: u32,
    /// Bytes the receive side keeps room for (auto-tuned up to tcp_rmem's
    /// maximum).
    pub rcv_space: u32,
    /// TCP timestamps are on (12 bytes of options in every segment).
    pub timestamps: bool,
}

/// Reads over `path` for `time`.
pub async fn read(
    path: &PathSpec,
    export: &str,
    tls: Option<&TlsClient>,
    time: Duration,
) -> Measured {
    match run(path, export, tls, time).await {
        Ok(m) => m,
        Err(e) => Measured {
            error: Some(e),
            ..Measured::default()
        },
    }
}

async fn run(
    path: &PathSpec,
    export: &str,
    tls: Option<&TlsClient>,
    time: Duration,
) -> Result<Measured, String> {
    let err = |e: conn::ConnectError| conn::chain(&e);
    let stream = conn::dial(&path.portal, &path.local, CONNECT_TIMEOUT)
        .await
        .map_err(err)?;
    let n = conn::negotiate(
        stream,
        ClientConfig::go(export),
        &path.portal.to_string(),
        CONNECT_TIMEOUT,
        tls,
    )
    .await
    .map_err(err)?;
    let details = n
        .outcome
        .export
        .clone()
        .ok_or("the server sent no export details")?;
    // A duplicate of the socket, to ask TCP_INFO whatever the tasks do.
    let socket = n.stream.tcp_fd().and_then(|fd| {
        // SAFETY: dup of a descriptor the stream keeps open.
        let d = unsafe { libc::dup(fd) };
        // SAFETY: a fresh descriptor nobody else owns.
        (d >= 0).then(|| unsafe { OwnedFd::from_raw_fd(d) })
    });
    let len = u64::from(details.max_payload.clamp(4096, 256 << 10))
        .min(details.size)
        .max(1);
    let span = SPAN.min(details.size) / len * len;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let sink = Arc::new(Counting {
        len: len as u32,
        bytes: AtomicU64::new(0),
        done: tx,
        lost: Mutex::new(None),
    });
    let handle = conn::start(n, details.max_payload, sink.clone());
    let mut next = 0u64;
    let mut cookie = 0u64;
    let mut inflight: HashSet<u64> = HashSet::new();
    let mut send = |inflight: &mut HashSet<u64>| {
        cookie += 1;
        let req = Request {
            flags: CmdFlags(0),
            command: Command::Read,
            cookie: Cookie(cookie),
            offset: next,
            length: len as u32,
        };
        next = if span == 0 { 0 } else { (next + len) % span };
        inflight.insert(cookie);
        handle.send(&req, None)
    };
    let start = Instant::now();
    let deadline = start + time;
    for _ in 0..DEPTH {
        send(&mut inflight);
    }
    let mut last = start;
    let mut failure = None;
    while !inflight.is_empty() {
        // Replies get a little longer than the reads themselves.
        let left = (deadline + Duration::from_secs(2)).saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(Done::Reply(c, error))) => {
                inflight.remove(&c);
                last = Instant::now();
                if let Some(e) = error {
                    failure = Some(format!("a READ failed: {e}"));
                    break;
                }
                if last < deadline {
                    send(&mut inflight);
                }
            }
            Ok(Some(Done::Lost(reason))) => {
                failure = Some(reason);
                break;
            }
            Ok(None) | Err(_) => {
                failure = Some(format!("{} replies still missing", inflight.len()));
                break;
            }
        }
    }
    let tcp = socket.as_ref().and_then(tcp_info);
    handle.disconnect();
    handle.finish(Duration::from_secs(1)).await;
    Ok(Measured {
        bytes: sink.bytes.load(Ordering::Relaxed),
        secs: last.duration_since(start).as_secs_f64(),
        tcp,
        error: failure,
    })
}

enum Done {
    Reply(u64, Option<String>),
    Lost(String),
}

struct Counting {
    len: u32,
    bytes: AtomicU64,
    done: mpsc::UnboundedSender<Done>,
    lost: Mutex<Option<String>>,
}

impl Sink for Counting {
    fn read_len(&self, _: Cookie) -> Option<u32> {
        Some(self.len)
    }
    fn data(&self, _: Cookie, _: Option<u64>, data: Bytes) {
        self.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
    }
    // A hole crossed no wire: not counted.
    fn hole(&self, _: Cookie, _: u64, _: u32) {}
    fn extents(&self, _: Cookie, _: Vec<braid_block::Extent>) {}
    fn done(&self, cookie: Cookie, error: Option<braid_block::Error>) {
        let _ = self
            .done
            .send(Done::Reply(cookie.0, error.map(|e| e.to_string())));
    }
    fn lost(&self, reason: String) {
        let mut l = self.lost.lock().unwrap_or_else(|p| p.into_inner());
        if l.is_none() {
            *l = Some(reason.clone());
            let _ = self.done.send(Done::Lost(reason));
        }
    }
}

/// `TCP_INFO` of a socket.
fn tcp_info(fd: &OwnedFd) -> Option<TcpFigures> {
    let i = conn::tcp_info_raw(fd.as_raw_fd())?;
    Some(TcpFigures {
        min_rtt_us: i.tcpi_min_rtt,
        snd_mss: i.tcpi_snd_mss,
        retransmits: i.tcpi_total_retrans,
        rcv_space: i.tcpi_rcv_space,
        // TCPI_OPT_TIMESTAMPS
        timestamps: i.tcpi_options & 1 != 0,
    })
}
