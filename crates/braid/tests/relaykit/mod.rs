//! A TCP relay to one upstream address, for tests that cut a path of a
//! volume on loopback without a lab: `cut_and_hold` ends every
//! connection made so far (both ways, as a pulled cable would end them
//! for the initiator, while the target's side of the cut closes too)
//! and holds new ones at a gate until `open`. It runs on a thread of
//! its own with its own runtime, so a test's runtime may block.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Relay {
    pub addr: SocketAddr,
    /// One message per accepted connection.
    pub accepted: mpsc::Receiver<()>,
    gate: watch::Sender<bool>,
    epoch: watch::Sender<u64>,
    live: Arc<AtomicUsize>,
    /// Bytes carried from clients to upstream.
    sent: Arc<AtomicU64>,
    /// Bytes carried from upstream to clients.
    received: Arc<AtomicU64>,
    /// The count of `received` at which the relay cuts (`u64::MAX`: never).
    cut_at: Arc<AtomicU64>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    /// A relay listening on `listen` (`ADDR:0` for any port) to `upstream`.
    pub fn start(listen: &str, upstream: SocketAddr) -> Relay {
        let (ready_tx, ready) = mpsc::channel();
        let (accepted_tx, accepted) = mpsc::channel();
        let (gate, gate_rx) = watch::channel(true);
        let (epoch, epoch_rx) = watch::channel(0u64);
        let (stop, mut stopped) = watch::channel(false);
        let live = Arc::new(AtomicUsize::new(0));
        let counted = live.clone();
        let sent = Arc::new(AtomicU64::new(0));
        let received = Arc::new(AtomicU64::new(0));
        let cut_at = Arc::new(AtomicU64::new(u64::MAX));
        let down = Down {
            received: received.clone(),
            cut_at: cut_at.clone(),
            gate: gate.clone(),
            epoch: epoch.clone(),
        };
        let carried = sent.clone();
        let listen = listen.to_owned();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let listener = TcpListener::bind(&listen).await.expect("bind the relay");
                ready_tx.send(listener.local_addr().unwrap()).unwrap();
                loop {
                    let (client, _) = tokio::select! {
                        a = listener.accept() => a.expect("accept"),
                        _ = stopped.wait_for(|s| *s) => return,
                    };
                    counted.fetch_add(1, Ordering::SeqCst);
                    let _ = accepted_tx.send(());
                    let (gate, epoch, live) = (gate_rx.clone(), epoch_rx.clone(), counted.clone());
                    let (carried, down) = (carried.clone(), down.clone());
                    tokio::spawn(async move {
                        relay(client, upstream, gate, epoch, &carried, &down).await;
                        live.fetch_sub(1, Ordering::SeqCst);
                    });
                }
            });
        });
        let addr = ready
            .recv_timeout(Duration::from_secs(5))
            .expect("relay up");
        Relay {
            addr,
            accepted,
            gate,
            epoch,
            live,
            sent,
            received,
            cut_at,
            stop,
            thread: Some(thread),
        }
    }

    /// Ends every connection so far and holds new ones at the gate.
    pub fn cut_and_hold(&self) {
        self.gate.send_replace(false);
        self.epoch.send_modify(|e| *e += 1);
    }

    /// Cuts once `bytes` more have gone from upstream to clients: the
    /// connection carrying that byte is given exactly the bytes before it
    /// and then its end (FIN, so nothing it was given is lost to a reset),
    /// every other connection is ended, and new ones are held until
    /// `open`. A cut placed by bytes lands where a test wants it (inside a
    /// reply's payload) however slowly the upstream answers, which a cut
    /// placed by time does not.
    pub fn cut_after_received(&self, bytes: u64) {
        let now = self.received.load(Ordering::SeqCst);
        self.cut_at.store(now + bytes, Ordering::SeqCst);
    }

    /// Whether a cut asked for by `cut_after_received` has happened.
    pub fn cut_done(&self) -> bool {
        self.cut_at.load(Ordering::SeqCst) != u64::MAX && !*self.gate.borrow()
    }

    /// Bytes carried so far from upstream to clients.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::SeqCst)
    }

    /// Lets held and new connections through.
    pub fn open(&self) {
        self.cut_at.store(u64::MAX, Ordering::SeqCst);
        self.gate.send_replace(true);
    }

    /// Bytes carried so far from clients to upstream (requests, for a
    /// relay in front of a target).
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// Connections accepted and not yet ended.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.epoch.send_modify(|e| *e += 1);
        self.stop.send_replace(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The downstream half's counters and the cut they may trigger.
#[derive(Clone)]
struct Down {
    received: Arc<AtomicU64>,
    cut_at: Arc<AtomicU64>,
    gate: watch::Sender<bool>,
    epoch: watch::Sender<u64>,
}

impl Down {
    /// Copies from upstream to the client until either ends, or until the
    /// cut's byte, which ends this connection and (a second later, so the
    /// client reads to the end first) every other.
    async fn copy(
        &self,
        from: &mut (impl AsyncReadExt + Unpin),
        to: &mut (impl AsyncWriteExt + Unpin),
    ) {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n as u64,
            };
            let before = self.received.fetch_add(n, Ordering::SeqCst);
            let at = self.cut_at.load(Ordering::SeqCst);
            let cut = before + n >= at;
            let give = if cut { at.saturating_sub(before) } else { n };
            if to.write_all(&buf[..give as usize]).await.is_err() {
                break;
            }
            if cut {
                self.gate.send_replace(false);
                let epoch = self.epoch.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    epoch.send_modify(|e| *e += 1);
                });
                break;
            }
        }
        let _ = to.shutdown().await;
    }
}

/// Waits for the gate, then copies both ways until either side ends or
/// the relay is cut.
async fn relay(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut gate: watch::Receiver<bool>,
    mut epoch: watch::Receiver<u64>,
    sent: &AtomicU64,
    down: &Down,
) {
    let born = *epoch.borrow();
    let work = async {
        if gate.wait_for(|open| *open).await.is_err() {
            return;
        }
        let Ok(mut server) = TcpStream::connect(upstream).await else {
            return;
        };
        let (mut from_client, mut to_client) = client.split();
        let (mut from_server, mut to_server) = server.split();
        let up = async {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match from_client.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if to_server.write_all(&buf[..n]).await.is_err() {
                    break;
                }
                sent.fetch_add(n as u64, Ordering::SeqCst);
            }
            let _ = to_server.shutdown().await;
        };
        tokio::join!(up, down.copy(&mut from_server, &mut to_client));
    };
    tokio::select! {
        () = work => {}
        _ = epoch.wait_for(|e| *e > born) => {}
    }
}
