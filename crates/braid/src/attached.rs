//! The volumes `braid attach` serves now, shared by the control socket,
//! the metrics endpoint and the rate sampler; a reload adds and removes
//! volumes while they read. Kept apart from `attach` so that none of them
//! depends on the others.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use braid_initiator::Volume;
use braid_nbd_target::{StopHandle, Target};
use tokio::sync::{broadcast, watch, OnceCell};

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
    stop: StopHandle,
    /// Whether its local target ended with the volume flushed; `None`
    /// while it runs. A watch rather than the task's handle, so that a
    /// detach cut short (a stop during a reload's) can be begun again and
    /// still learn how the target ended.
    done: watch::Receiver<Option<bool>>,
    /// Set once its paths are closed and its socket removed.
    closed: OnceCell<()>,
}

impl Attached {
    /// Runs `target` (the local NBD target of `volume`, bound) on its own
    /// task until [`Self::detach`] stops it.
    pub fn start(
        name: String,
        uri: String,
        socket: PathBuf,
        volume: Arc<Volume>,
        fingerprint: String,
        target: Target,
        stop: StopHandle,
    ) -> Self {
        let (done_tx, done) = watch::channel(None);
        let volume_name = name.clone();
        tokio::spawn(async move {
            let flushed = match target.run().await {
                Ok(()) => true,
                Err(e) => {
                    tracing::error!(
                        volume = %volume_name,
                        "volume {volume_name:?}: flushing as it is detached: {e:#}"
                    );
                    false
                }
            };
            done_tx.send_replace(Some(flushed));
        });
        Self {
            name,
            uri,
            socket,
            volume,
            fingerprint,
            stop,
            done,
            closed: OnceCell::new(),
        }
    }

    /// Stops serving the volume, waits for its clients' requests and the
    /// final flush, then closes its paths. Returns whether the flush
    /// worked (a failure is logged). Safe to cut short and call again: the
    /// second call waits for the same target and closes the paths once.
    pub async fn detach(&self) -> bool {
        self.stop.stop();
        let mut done = self.done.clone();
        let flushed = match done.wait_for(Option::is_some).await {
            Ok(flushed) => flushed.unwrap_or(false),
            Err(_) => {
                tracing::error!(volume = %self.name, "detaching: its local target's task ended without a result (see the log above)");
                false
            }
        };
        self.closed
            .get_or_init(|| async {
                self.volume.close().await;
                let _ = std::fs::remove_file(&self.socket);
            })
            .await;
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
