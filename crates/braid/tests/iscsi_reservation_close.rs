//! A volume that fences by persistent reservation leaves no key behind
//! when it closes, even while a path is still reconnecting: a session
//! that logs in after the volume withdrew its keys must withdraw its own.
//!
//! The path's portal is a relay the test controls, so the reconnect can
//! be held at the door while the volume closes, then let in.

mod common;
mod iscsikit;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use braid_initiator::{Volume, VolumeConfig};
use common::{free_port, wait_until, Serve};
use iscsikit::Initiator;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const TARGET: &str = "iqn.2026-11.org.braid-storage:vol";

/// A TCP relay to one upstream address. Connections wait at a gate until
/// it opens; `cut` ends every connection made so far.
struct Relay {
    addr: SocketAddr,
    /// One message per accepted connection.
    accepted: mpsc::Receiver<()>,
    gate: watch::Sender<bool>,
    epoch: watch::Sender<u64>,
    live: Arc<AtomicUsize>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    fn start(listen: &str, upstream: SocketAddr) -> Relay {
        let (ready_tx, ready) = mpsc::channel();
        let (accepted_tx, accepted) = mpsc::channel();
        let (gate, gate_rx) = watch::channel(true);
        let (epoch, epoch_rx) = watch::channel(0u64);
        let (stop, mut stopped) = watch::channel(false);
        let live = Arc::new(AtomicUsize::new(0));
        let counted = live.clone();
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
                    tokio::spawn(async move {
                        relay(client, upstream, gate, epoch).await;
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
            stop,
            thread: Some(thread),
        }
    }

    /// Ends every connection so far and holds new ones at the gate.
    fn cut_and_hold(&self) {
        self.gate.send_replace(false);
        self.epoch.send_modify(|e| *e += 1);
    }

    fn open(&self) {
        self.gate.send_replace(true);
    }

    fn live(&self) -> usize {
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

/// Waits for the gate, then copies both ways until either side ends or
/// the relay is cut.
async fn relay(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut gate: watch::Receiver<bool>,
    mut epoch: watch::Receiver<u64>,
) {
    let born = *epoch.borrow();
    let work = async {
        if gate.wait_for(|open| *open).await.is_err() {
            return;
        }
        let Ok(mut server) = TcpStream::connect(upstream).await else {
            return;
        };
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
    };
    tokio::select! {
        () = work => {}
        _ = epoch.wait_for(|e| *e > born) => {}
    }
}

#[test]
fn a_path_that_reconnects_while_the_volume_closes_leaves_no_key() {
    let port = free_port();
    let _serve = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.2:0",
        "--iscsi",
        &port.to_string(),
        "vol=mem:16MiB",
    ]);
    let direct: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let relay = Relay::start("127.0.0.3:0", format!("127.0.0.2:{port}").parse().unwrap());
    let keys = || Initiator::login(direct, TARGET).registered_keys();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let vol = rt.block_on(async {
        let mut cfg = VolumeConfig::new(
            format!("iscsi://{direct}/{TARGET}/0")
                .parse::<braid_initiator::VolumeUri>()
                .unwrap(),
        );
        cfg.portals = vec![direct, relay.addr];
        cfg.persistent_reservations = true;
        let vol = Volume::open(cfg).await.expect("open the volume");
        vol.write(0, bytes::Bytes::from(vec![7u8; 64 << 10]), true)
            .await
            .expect("a write");
        vol
    });
    assert_eq!(vol.report().paths.len(), 2, "both portals are paths");
    assert_eq!(keys().len(), 2, "each path's session registered a key");
    while relay.accepted.try_recv().is_ok() {}

    // The relayed path fails; its reconnect is held at the door.
    relay.cut_and_hold();
    relay
        .accepted
        .recv_timeout(Duration::from_secs(10))
        .expect("the failed path redials");
    rt.block_on(vol.close());
    relay.open();

    // The reconnect runs to its end, whichever way it ends.
    assert!(
        wait_until(Duration::from_secs(10), || rt.metrics().num_alive_tasks()
            == 0),
        "the volume's tasks ended"
    );
    assert!(
        wait_until(Duration::from_secs(5), || relay.live() == 0),
        "the relayed sessions ended"
    );
    let left = keys();
    assert!(
        left.is_empty(),
        "keys left registered after the volume closed: {left:x?}"
    );
}
