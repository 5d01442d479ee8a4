//! What a logical unit keeps across every nexus that uses it, as far as
//! its decisions go: the I_T nexuses logged in, the unit attention
//! conditions each is owed and the reservations. (The task set, the
//! write cache and where the reservations are saved are the target's.)
//!
//! An iSCSI session is one I_T nexus (one connection per session), known
//! by a number drawn when it logs in and dropped when it ends, and, for
//! reservations, by its name (initiator port and target port), which a
//! session logging in again on the same path keeps.
//!
//! The first nexus of each initiator port (initiator name and ISID) since
//! this process started is owed POWER ON, RESET, OR BUS DEVICE RESET
//! OCCURRED (29h/00h; SAM-5 6.3.1: a power on establishes that condition
//! for every I_T nexus; 29h/00h rather than the narrower 29h/01h because
//! initiators and tools that clear a unit attention after login, as
//! libiscsi's iscsi-ls does, look for that one): an initiator whose
//! session comes back to a restarted target learns that what it wrote and
//! never flushed may be gone. A port seen before, logging in again to the
//! same process (a reinstated session, another portal), is owed nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Attentions, Command, Delivery, NexusName, Reservations, Sense};

/// Most initiator ports remembered as told of the power on.
const MAX_TOLD: usize = 65_536;

/// One logical unit's shared state.
#[derive(Debug)]
pub struct LogicalUnit {
    nexuses: Mutex<HashMap<u64, (NexusName, Attentions)>>,
    /// Initiator ports (`iqn…,i,0x<ISID>`) told of the power on.
    told: Mutex<std::collections::HashSet<String>>,
    next: AtomicU64,
    reservations: Mutex<Reservations>,
    /// A reservation is held: kept by [`Held`] each time the reservations
    /// change, so that a command's check takes no lock while none is
    /// (the common case, on every command of every session).
    held: AtomicBool,
    /// The results of EXTENDED COPY commands, for COPY STATUS.
    pub copies: crate::xcopy::Results,
    /// The outcomes of token commands, for RECEIVE ROD TOKEN INFORMATION.
    pub tokens: crate::rod::Results,
}

/// The reservations, locked; whether one is held is noted again when the
/// lock is let go.
pub struct Held<'a> {
    state: MutexGuard<'a, Reservations>,
    held: &'a AtomicBool,
}

impl std::ops::Deref for Held<'_> {
    type Target = Reservations;
    fn deref(&self) -> &Reservations {
        &self.state
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Reservations {
        &mut self.state
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.held.store(self.state.held(), Ordering::SeqCst);
    }
}

/// An I_T nexus logged in to the unit; leaves it when dropped.
#[derive(Debug)]
pub struct Nexus {
    lu: Arc<LogicalUnit>,
    pub id: u64,
    pub name: NexusName,
}

impl Drop for Nexus {
    fn drop(&mut self) {
        self.lu.lock().remove(&self.id);
        // A RESERVE (6) does not outlive its nexus.
        self.lu.reservations().nexus_lost(Some(&self.name));
    }
}

impl Nexus {
    /// What `cmd` meets on this nexus (a pending unit attention, or
    /// nothing).
    pub fn deliver(&self, cmd: &Command) -> Delivery {
        match self.lu.lock().get_mut(&self.id) {
            Some((_, a)) => a.deliver(cmd),
            None => Delivery::Run,
        }
    }
}

impl LogicalUnit {
    /// A unit holding `reservations` (as a restart found them saved),
    /// with no nexus yet.
    pub fn new(reservations: Reservations) -> Self {
        Self {
            nexuses: Mutex::default(),
            told: Mutex::default(),
            next: AtomicU64::new(0),
            held: AtomicBool::new(reservations.held()),
            reservations: Mutex::new(reservations),
            copies: crate::xcopy::Results::default(),
            tokens: crate::rod::Results::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, (NexusName, Attentions)>> {
        self.nexuses.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The reservations, to read or change.
    pub fn reservations(&self) -> Held<'_> {
        Held {
            state: self.reservations.lock().unwrap_or_else(|p| p.into_inner()),
            held: &self.held,
        }
    }

    /// Whether a reservation stops `cmd` from nexus `name`.
    pub fn conflicts(&self, name: &NexusName, cmd: &Command) -> bool {
        self.held.load(Ordering::SeqCst) && self.reservations().conflicts(name, cmd)
    }

    /// A new nexus named `name`, owed the power on condition when its
    /// initiator port is new to this process, else nothing.
    pub fn join(self: &Arc<Self>, name: NexusName) -> Nexus {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut pending = Attentions::default();
        let mut told = self.told.lock().unwrap_or_else(|p| p.into_inner());
        if told.len() >= MAX_TOLD {
            // Logins with ever new ISIDs must not grow this for ever; a
            // port told twice replays for nothing, which is safe.
            told.clear();
        }
        let new_port = told.insert(name.initiator_port.clone());
        drop(told);
        if new_port {
            pending.raise(Sense::POWER_ON_RESET);
        }
        self.lock().insert(id, (name.clone(), pending));
        Nexus {
            lu: self.clone(),
            id,
            name,
        }
    }

    /// The nexuses logged in under `name`.
    pub fn ids_of(&self, name: &NexusName) -> Vec<u64> {
        self.lock()
            .iter()
            .filter(|(_, (n, _))| n == name)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Establishes `sense` on nexus `id`.
    pub fn raise_on(&self, id: u64, sense: Sense) {
        if let Some((_, a)) = self.lock().get_mut(&id) {
            a.raise(sense);
        }
    }

    /// Establishes each condition of `tell` on every nexus logged in
    /// under its name (what a PERSISTENT RESERVE OUT does to others).
    pub fn tell(&self, tell: Vec<(NexusName, Sense)>) {
        for (name, sense) in tell {
            for id in self.ids_of(&name) {
                self.raise_on(id, sense);
            }
        }
    }

    /// The unit was reset (LOGICAL UNIT RESET, TARGET WARM RESET): every
    /// nexus is told so, the one that asked included (SAM-5 6.3.3), and
    /// a RESERVE (6) reservation ends.
    pub fn reset(&self) {
        self.reservations().nexus_lost(None);
        self.raise(Sense::DEVICE_RESET, None);
    }

    /// Establishes `sense` on every nexus but `except`.
    pub fn raise(&self, sense: Sense, except: Option<u64>) {
        for (id, (_, a)) in self.lock().iter_mut() {
            if Some(*id) != except {
                a.raise(sense);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit() -> Arc<LogicalUnit> {
        Arc::new(LogicalUnit::new(Reservations::default()))
    }

    #[test]
    fn each_initiator_port_is_told_of_the_power_on_once() {
        let lu = unit();
        let port = |who: &str, isid, tag| NexusName::new(who, [0x80, 0, 0, 0, 0, isid], tag);
        let a = lu.join(port("iqn.2026-11.org.example:a", 1, 1));
        let tur = Command::TestUnitReady;
        let inquiry = Command::Inquiry {
            vpd: None,
            alloc: 36,
        };
        assert_eq!(a.deliver(&inquiry), Delivery::Run, "INQUIRY is never told");
        assert_eq!(a.deliver(&Command::ReportLuns { alloc: 16 }), Delivery::Run);
        assert_eq!(a.deliver(&tur), Delivery::Report(Sense::POWER_ON_RESET));
        assert_eq!(a.deliver(&tur), Delivery::Run, "once");
        drop(a);
        // The same port again (a reinstated session), through another
        // portal too: nothing. Another ISID or initiator: told.
        let again = lu.join(port("IQN.2026-11.org.example:a", 1, 1));
        let elsewhere = lu.join(port("iqn.2026-11.org.example:a", 1, 2));
        let isid = lu.join(port("iqn.2026-11.org.example:a", 2, 1));
        let other = lu.join(port("iqn.2026-11.org.example:b", 1, 1));
        assert_eq!(again.deliver(&tur), Delivery::Run);
        assert_eq!(elsewhere.deliver(&tur), Delivery::Run);
        assert_eq!(
            isid.deliver(&Command::RequestSense { alloc: 18 }),
            Delivery::AsSenseData(Sense::POWER_ON_RESET),
            "REQUEST SENSE returns it as its data"
        );
        assert_eq!(other.deliver(&tur), Delivery::Report(Sense::POWER_ON_RESET));
    }

    #[test]
    fn a_condition_reaches_every_nexus_logged_in_once() {
        let lu = unit();
        let name = |isid| NexusName::new("iqn.2026-11.org.example:a", [0, 0, 0, 0, 0, isid], 1);
        let (a, b) = (lu.join(name(1)), lu.join(name(2)));
        // Told of the power on first.
        assert_eq!(
            a.deliver(&Command::TestUnitReady),
            Delivery::Report(Sense::POWER_ON_RESET)
        );
        assert_eq!(
            b.deliver(&Command::TestUnitReady),
            Delivery::Report(Sense::POWER_ON_RESET)
        );
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
