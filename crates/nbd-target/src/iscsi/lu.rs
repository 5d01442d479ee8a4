//! What one export's logical unit keeps across every iSCSI session that
//! uses it: the I_T nexuses logged in, the unit attention conditions
//! each is owed, and the task set.
//!
//! A session is one I_T nexus (one connection per session here), known
//! by a number drawn when it logs in and dropped when it ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use braid_iscsi::scsi::{Attentions, Command, Delivery, Sense};

use super::task::TaskSet;

/// One logical unit's shared state.
#[derive(Debug, Default)]
pub(crate) struct LogicalUnit {
    nexuses: Mutex<HashMap<u64, Attentions>>,
    next: AtomicU64,
    pub tasks: Arc<TaskSet>,
}

/// An I_T nexus logged in to the unit; leaves it when dropped.
#[derive(Debug)]
pub(crate) struct Nexus {
    lu: Arc<LogicalUnit>,
    pub id: u64,
}

impl Drop for Nexus {
    fn drop(&mut self) {
        self.lu.lock().remove(&self.id);
    }
}

impl Nexus {
    /// What `cmd` meets on this nexus (a pending unit attention, or
    /// nothing).
    pub fn deliver(&self, cmd: &Command) -> Delivery {
        match self.lu.lock().get_mut(&self.id) {
            Some(a) => a.deliver(cmd),
            None => Delivery::Run,
        }
    }
}

impl LogicalUnit {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Attentions>> {
        self.nexuses.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new nexus, with nothing pending.
    pub fn join(self: &Arc<Self>) -> Nexus {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(id, Attentions::default());
        Nexus {
            lu: self.clone(),
            id,
        }
    }

    /// Establishes `sense` on nexus `id`.
    pub fn raise_on(&self, id: u64, sense: Sense) {
        if let Some(a) = self.lock().get_mut(&id) {
            a.raise(sense);
        }
    }

    /// The unit was reset (LOGICAL UNIT RESET, TARGET WARM RESET): every
    /// nexus is told so, the one that asked included (SAM-5 6.3.3).
    pub fn reset(&self) {
        self.raise(Sense::DEVICE_RESET, None);
    }

    /// Establishes `sense` on every nexus but `except`.
    pub fn raise(&self, sense: Sense, except: Option<u64>) {
        for (id, a) in self.lock().iter_mut() {
            if Some(*id) != except {
                a.raise(sense);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_reaches_every_nexus_logged_in_once() {
        let lu = Arc::new(LogicalUnit::default());
        let (a, b) = (lu.join(), lu.join());
        lu.raise(Sense::ACCESS_STATE_CHANGED, None);
        lu.raise(Sense::REPORTED_LUNS_CHANGED, Some(b.id));
        let tur = Command::TestUnitReady;
        assert_eq!(
            a.deliver(&tur),
            Delivery::Report(Sense::ACCESS_STATE_CHANGED)
        );
        assert_eq!(
            a.deliver(&tur),
            Delivery::Report(Sense::REPORTED_LUNS_CHANGED)
        );
        assert_eq!(
            b.deliver(&tur),
            Delivery::Report(Sense::ACCESS_STATE_CHANGED)
        );
        assert_eq!(b.deliver(&tur), Delivery::Run, "not to the nexus excepted");
        drop(a);
        assert_eq!(lu.lock().len(), 1, "a nexus that ends is forgotten");
    }
}
