//! The volumes `braid attach` serves now, shared by the control socket,
//! the metrics endpoint and the rate sampler; a reload adds and removes
//! volumes while they read. Kept apart from `attach` so that none of them
//! depends on the others.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use braid_initiator::Volume;
use braid_nbd_target::StopHandle;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

/// An attached volume: its multipath volume and the local NBD target that
/// serves it on its own socket.
pub struct Attached {
    pub name: String,
    pub uri: String,
    pub socket: PathBuf,
    pub volume: Arc<Volume>,
    /// What it was attached with, to tell on a reload whether it changed.
    pub fingerprint: String,
    /// Stops its local target.
    pub stop: StopHandle,
    /// The local target's task: ends once its clients' requests are done
    /// and the volume is flushed.
    pub served: Mutex<Option<JoinHandle<anyhow::Result<()>>>>,
}

impl Attached {
    /// Stops serving the volume, waits for its clients' requests and the
    /// final flush, then closes its paths. Returns whether the flush
    /// worked (a failure is logged).
    pub async fn detach(&self) -> bool {
        self.stop.stop();
        let task = self.served.lock().unwrap_or_else(|p| p.into_inner()).take();
        let flushed = match task {
            None => true,
            Some(task) => match task.await {
                Ok(Ok(())) => true,
                Ok(Err(e)) => {
                    tracing::error!(volume = %self.name, "{e:#}");
                    false
                }
                Err(e) => {
                    tracing::error!(volume = %self.name, "detaching: {e}");
                    false
                }
            },
        };
        self.volume.close().await;
        let _ = std::fs::remove_file(&self.socket);
        flushed
    }
}

/// The attached volumes, in the order they were attached, and their
/// timelines' events as one stream (for the console).
#[derive(Clone)]
pub struct Volumes(
    Arc<RwLock<Vec<Arc<Attached>>>>,
    broadcast::Sender<braid_console::EventView>,
);

impl Default for Volumes {
    fn default() -> Self {
        Self(Default::default(), broadcast::channel(256).0)
    }
}

impl Volumes {
    /// The volumes now; later changes do not affect the snapshot.
    pub fn snapshot(&self) -> Vec<Arc<Attached>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every volume's timeline events, as they happen.
    pub fn events(&self) -> broadcast::Sender<braid_console::EventView> {
        self.1.clone()
    }

    pub fn find(&self, name: &str) -> Option<Arc<Attached>> {
        self.snapshot().into_iter().find(|a| a.name == name)
    }

    pub fn add(&self, a: Arc<Attached>) {
        // Until the volume's timeline closes with it.
        let mut rx = a.volume.timeline().subscribe();
        let (name, tx) = (a.name.clone(), self.1.clone());
        tokio::spawn(async move {
            loop {
                match rx.recv().await {
                    Ok(ev) => {
                        let _ = tx.send(crate::console::event_view(&name, &ev));
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        self.0.write().unwrap_or_else(|p| p.into_inner()).push(a);
    }

    /// Takes `name` out of the list (it is still served until detached).
    pub fn remove(&self, name: &str) -> Option<Arc<Attached>> {
        let mut list = self.0.write().unwrap_or_else(|p| p.into_inner());
        let at = list.iter().position(|a| a.name == name)?;
        Some(list.remove(at))
    }
}
