//! `braid serve --iscsi` run inside the test process (iSCSI and NBD on
//! the same export), so that a test can reach its controls: the hold
//! hook that keeps an initiator's commands from the backend, the pause
//! inside COMPARE AND WRITE, the ALUA states.

use std::net::SocketAddr;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use braid_iscsi_target::{IscsiConfig, IscsiHandle, IscsiServer};
use braid_nbd_target::Target;
use braid_store::backend::FileBackend;
use braid_store::portal::Portal;
use braid_store::{Export, Exports, Limits};
use tokio::sync::watch;

/// A server with one export, `vol` (16 MiB of memory), on the loopback
/// addresses given; stopped when dropped.
pub struct InProcess {
    pub handle: IscsiHandle,
    pub portals: Vec<SocketAddr>,
    /// The NBD portal on the first address.
    pub nbd: SocketAddr,
    pub export: Arc<Export>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InProcess {
    pub fn start(addrs: &[&str]) -> InProcess {
        let export = Arc::new(Export::local(
            "vol",
            "memory",
            Arc::new(FileBackend::memory(16 << 20).expect("a memory volume")),
            false,
            uuid::Uuid::new_v4(),
        ));
        let portals: Vec<Portal> = addrs
            .iter()
            .map(|a| Portal {
                addr: format!("{a}:0").parse().expect("an address"),
                device: None,
            })
            .collect();
        let (tx, rx) = mpsc::channel();
        let (stop, stopped) = watch::channel(false);
        let exports = Exports::new(vec![export.clone()]);
        let thread = std::thread::spawn(move || {
            let rt = runtime(2);
            rt.block_on(async move {
                let server = IscsiServer::bind(&portals, &exports, &IscsiConfig::default())
                    .await
                    .expect("bind the iSCSI portals");
                let nbd = Target::bind(exports, &portals[..1], Limits::default())
                    .expect("bind the NBD portal");
                let nbd_addr = nbd.local_addrs()[0];
                let nbd_stop = nbd.stop_handle();
                tx.send((server.handle(), server.local_addrs(), nbd_addr))
                    .expect("the test waits");
                let mut watching = stopped.clone();
                tokio::spawn(async move {
                    let _ = watching.wait_for(|s| *s).await;
                    nbd_stop.stop();
                });
                let (_, nbd_done) = tokio::join!(server.run(stopped), nbd.run());
                nbd_done.expect("the NBD server ran");
            });
        });
        let (handle, portals, nbd) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the server started");
        InProcess {
            handle,
            portals,
            nbd,
            export,
            stop,
            thread: Some(thread),
        }
    }

    /// Bytes of the volume, read from its backend directly.
    pub fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let b = self.export.storage.backend().expect("a local export");
        let mut buf = vec![0; len];
        b.read_at(&mut buf, offset).expect("read the backend");
        buf
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An iSCSI target alone, in this process, on one loopback portal, over
/// the exports `make` builds on its runtime (where what they need, a
/// volume's tasks, can run); stopped when dropped.
pub struct IscsiOnly {
    pub addr: SocketAddr,
    pub handle: IscsiHandle,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What builds the exports of an [`IscsiOnly`].
pub type MakeExports =
    Box<dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = Exports>>> + Send>;

impl IscsiOnly {
    pub fn start(cfg: IscsiConfig, make: MakeExports) -> IscsiOnly {
        Self::start_on(2, cfg, make)
    }

    /// As [`Self::start`], on a runtime of `workers` threads (one: a
    /// thread blocked by the server stops every session).
    pub fn start_on(workers: usize, cfg: IscsiConfig, make: MakeExports) -> IscsiOnly {
        let (tx, rx) = mpsc::channel();
        let (stop, stopped) = watch::channel(false);
        let thread = std::thread::spawn(move || {
            let rt = runtime(workers);
            rt.block_on(async move {
                let portal = Portal {
                    addr: "127.0.0.1:0".parse().expect("an address"),
                    device: None,
                };
                let exports = make().await;
                let iscsi = IscsiServer::bind(&[portal], &exports, &cfg)
                    .await
                    .expect("bind the iSCSI portal");
                tx.send((iscsi.local_addrs()[0], iscsi.handle()))
                    .expect("the test waits");
                iscsi.run(stopped).await;
            });
        });
        let (addr, handle) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the server started");
        IscsiOnly {
            addr,
            handle,
            stop,
            thread: Some(thread),
        }
    }

    /// Over one export named `vol` of `size` bytes of memory.
    pub fn over_memory(cfg: IscsiConfig, size: u64) -> IscsiOnly {
        let export = Arc::new(Export::local(
            "vol",
            "memory",
            Arc::new(FileBackend::memory(size).expect("memory")),
            false,
            uuid::Uuid::new_v4(),
        ));
        Self::serving(cfg, export)
    }

    /// Over one export, ready made.
    pub fn serving(cfg: IscsiConfig, export: Arc<Export>) -> IscsiOnly {
        Self::serving_on(2, cfg, export)
    }

    /// Over one export, ready made, on `workers` threads.
    pub fn serving_on(workers: usize, cfg: IscsiConfig, export: Arc<Export>) -> IscsiOnly {
        Self::start_on(
            workers,
            cfg,
            Box::new(move || Box::pin(async move { Exports::new(vec![export]) })),
        )
    }
}

impl Drop for IscsiOnly {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The runtime a server of this kit runs on, on a thread of its own.
fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a runtime")
}
