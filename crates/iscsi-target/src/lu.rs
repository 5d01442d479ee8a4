//! One export's logical unit as the target keeps it: the unit's own
//! state ([`braid_scsi::lu`]: nexuses, unit attentions, reservations),
//! with what waits on tasks and files beside it: the task set, the file
//! the reservations are saved in, and the write cache setting.

use std::path::PathBuf;
use std::sync::Arc;

use braid_scsi::reserve::Effects;
use braid_scsi::Reservations;
use braid_store::shared::SharedState;

pub(crate) use braid_scsi::lu::Nexus;

use super::task::{abort_all, TaskSet};

/// One logical unit's shared state.
#[derive(Debug)]
pub(crate) struct LogicalUnit {
    unit: Arc<braid_scsi::lu::LogicalUnit>,
    pub tasks: Arc<TaskSet>,
    /// Where the reservations are kept when they must outlive a restart.
    pub saved: Option<PathBuf>,
    /// The caching page's WCE: off, every write goes through to the
    /// medium before it is acknowledged.
    pub write_cache: super::cache::WriteCache,
    /// One PERSISTENT RESERVE OUT at a time, from its decision until its
    /// state is current (its save runs in between, off the runtime).
    pub deciding: tokio::sync::Mutex<()>,
    /// Test hook: holds saves before their fsync.
    pub slow_save: Arc<super::slowsave::SlowSave>,
    /// The reservations every server of the export shares (a Ceph
    /// image's gateways), kept there instead of in `saved`
    /// (`unitshared.rs`).
    pub shared: Option<Arc<dyn SharedState>>,
}

/// The unit's decisions: nexuses, unit attentions, reservations.
impl std::ops::Deref for LogicalUnit {
    type Target = Arc<braid_scsi::lu::LogicalUnit>;
    fn deref(&self) -> &Self::Target {
        &self.unit
    }
}

impl LogicalUnit {
    /// A unit whose reservations are kept in `shared` (read by
    /// `unitshared::start`) or else in `saved` (and read from it now), or
    /// only in memory, with `write_cache`.
    ///
    /// # Errors
    ///
    /// The saved state could not be read, or is not what braid writes.
    pub fn new(
        saved: Option<PathBuf>,
        write_cache: super::cache::WriteCache,
        shared: Option<Arc<dyn SharedState>>,
    ) -> std::io::Result<Self> {
        let reservations = match (&shared, &saved) {
            // Read once the unit watches them (`unitshared::start`).
            (Some(_), _) | (None, None) => Reservations::default(),
            (None, Some(p)) => match std::fs::read_to_string(p) {
                Ok(text) => Reservations::load(&text).map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{}: {e}; fix or remove the file", p.display()),
                    )
                })?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Reservations::default(),
                Err(e) => return Err(e),
            },
        };
        Ok(Self {
            unit: Arc::new(braid_scsi::lu::LogicalUnit::new(reservations)),
            tasks: Arc::default(),
            saved,
            write_cache,
            deciding: tokio::sync::Mutex::new(()),
            slow_save: Arc::default(),
            shared,
        })
    }
}

impl LogicalUnit {
    /// What a PERSISTENT RESERVE OUT does to other nexuses of this
    /// server: their tasks aborted (PREEMPT AND ABORT) and ended, and the
    /// unit attentions they are owed.
    pub async fn carry_out(&self, fx: Effects) {
        if !fx.abort.is_empty() {
            let ids: Vec<u64> = fx.abort.iter().flat_map(|n| self.ids_of(n)).collect();
            tracing::info!(
                preempted = fx.abort.len(),
                sessions = ids.len(),
                "PREEMPT AND ABORT: ending the preempted nexuses' tasks"
            );
            abort_all(&self.tasks.select(|n, _| ids.contains(&n))).await;
        }
        self.tell(fx.tell);
    }
}

/// The reservations every server of the export shares, read (blocking;
/// `unitshared.rs`).
///
/// # Errors
///
/// They could not be read, or are not what braid writes.
pub(crate) fn read(shared: &dyn SharedState) -> Result<Reservations, String> {
    parse(&shared.load()?)
}

/// The shared reservations' text, read.
///
/// # Errors
///
/// It is not what braid writes.
pub(crate) fn parse(text: &[u8]) -> Result<Reservations, String> {
    let text = std::str::from_utf8(text).map_err(|e| format!("not text: {e}"))?;
    Reservations::from_shared(text).map_err(|e| format!("unreadable {e}"))
}
