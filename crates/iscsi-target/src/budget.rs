//! Payload held in memory, bounded as NBD's is by the store's
//! [`braid_store::Limits`]: READ data between the storage and the socket
//! per connection (`max_bytes`), and READ data and WRITE data waiting for
//! its Data-Out across every iSCSI connection of the server
//! (`max_total_bytes`). A READ waits for room before it reads, and the
//! room comes back once its data is written to the socket; a WRITE finds
//! room at once or is answered TASK SET FULL, and gives it back once
//! written. So initiators that never read their sockets, or never send
//! the data they announced, hold no more than the bounds between them.
//! What is held is counted ([`Budget::in_flight`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The server-wide budget is counted in these (so that a terabyte fits a
/// semaphore's count, as NBD's does).
const UNIT: usize = 4096;

/// The budget every connection of a server shares.
#[derive(Debug)]
pub(crate) struct Budget {
    all: Arc<Semaphore>,
    units: usize,
    held: Arc<AtomicUsize>,
}

impl Budget {
    pub fn new(max_total_bytes: usize) -> Self {
        let units = max_total_bytes.div_ceil(UNIT).max(1);
        Self {
            all: Arc::new(Semaphore::new(units)),
            units,
            held: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Bytes of READ data held now, across connections.
    pub fn in_flight(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// One connection's share, of at most `max_bytes`.
    pub fn connection(&self, max_bytes: usize) -> ConnBudget {
        ConnBudget {
            mine: Arc::new(Semaphore::new(max_bytes.max(1))),
            max_bytes: max_bytes.max(1),
            all: self.all.clone(),
            all_units: self.units,
            held: self.held.clone(),
        }
    }
}

/// One connection's budget, drawing on the server's.
#[derive(Clone, Debug)]
pub(crate) struct ConnBudget {
    mine: Arc<Semaphore>,
    max_bytes: usize,
    all: Arc<Semaphore>,
    all_units: usize,
    held: Arc<AtomicUsize>,
}

impl ConnBudget {
    /// Waits for room for `bytes` (at most the connection's whole budget,
    /// so one large command always fits in the end).
    pub async fn hold(&self, bytes: usize) -> Option<Held> {
        let bytes = bytes.min(self.max_bytes);
        let mine = self
            .mine
            .clone()
            .acquire_many_owned(bytes as u32)
            .await
            .ok()?;
        // Never more than the server has in all: a server-wide budget
        // smaller than one command still lets it through, alone.
        let units = bytes.div_ceil(UNIT).min(self.all_units);
        let all = self
            .all
            .clone()
            .acquire_many_owned(units as u32)
            .await
            .ok()?;
        self.held.fetch_add(bytes, Ordering::Relaxed);
        Some(Held {
            _mine: Some(mine),
            _all: all,
            held: self.held.clone(),
            bytes,
        })
    }
}

impl ConnBudget {
    /// Room for `bytes` of WRITE data in the server's budget, if there is
    /// some now (the connection bounds its own apart).
    pub fn try_hold_write(&self, bytes: usize) -> Option<Held> {
        let units = bytes.div_ceil(UNIT).min(self.all_units);
        let all = self.all.clone().try_acquire_many_owned(units as u32).ok()?;
        self.held.fetch_add(bytes, Ordering::Relaxed);
        Some(Held {
            _mine: None,
            _all: all,
            held: self.held.clone(),
            bytes,
        })
    }
}

/// Room held for one command's data; given back when dropped.
#[derive(Debug)]
pub(crate) struct Held {
    _mine: Option<OwnedSemaphorePermit>,
    _all: OwnedSemaphorePermit,
    held: Arc<AtomicUsize>,
    bytes: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}
