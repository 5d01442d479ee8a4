//! Reservations of one logical unit, without I/O: persistent reservations
//! (PERSISTENT RESERVE IN/OUT, SPC-5 5.14) and the older RESERVE/RELEASE
//! (SPC-2), which clusters use to keep a node that lost its membership
//! from writing.
//!
//! An I_T nexus is named by its initiator port (`iqn…,i,0x<ISID>`) and
//! the relative target port it came through, so a session that logs in
//! again on the same path keeps its registration. What must survive a
//! restart is [`Reservations::save`]d as text when the last REGISTER asked
//! for it (APTPL) and read back with [`Reservations::load`] (the format is
//! `reserve/file.rs`'s).

mod file;
mod shared;

use super::cdb::Command;
use super::sense::{Key, Sense};

/// An I_T nexus as reservations know it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NexusName {
    /// `iqn…,i,0x<ISID>` (lower case).
    pub initiator_port: String,
    /// The relative target port id.
    pub target_port: u16,
}

impl NexusName {
    /// The name of `initiator`'s session `isid` through `target_port`.
    pub fn new(initiator: &str, isid: [u8; 6], target_port: u16) -> Self {
        let hex: String = isid.iter().map(|b| format!("{b:02x}")).collect();
        Self {
            initiator_port: format!("{},i,0x{hex}", initiator.to_lowercase()),
            target_port,
        }
    }

    /// The iSCSI TransportID (SPC-5 7.6.4.6, format 01b: name and ISID),
    /// padded to a multiple of four bytes.
    fn transport_id(&self) -> Vec<u8> {
        let mut name = self.initiator_port.as_bytes().to_vec();
        name.push(0);
        while name.len() < 16 || !name.len().is_multiple_of(4) {
            name.push(0);
        }
        let mut t = vec![0x45, 0];
        t.extend_from_slice(&(name.len() as u16).to_be_bytes());
        t.extend(name);
        t
    }
}

/// Persistent reservation types (SPC-5 table 229).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    WriteExclusive = 1,
    ExclusiveAccess = 3,
    WriteExclusiveRegistrantsOnly = 5,
    ExclusiveAccessRegistrantsOnly = 6,
    WriteExclusiveAllRegistrants = 7,
    ExclusiveAccessAllRegistrants = 8,
}

impl Type {
    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Type::WriteExclusive,
            3 => Type::ExclusiveAccess,
            5 => Type::WriteExclusiveRegistrantsOnly,
            6 => Type::ExclusiveAccessRegistrantsOnly,
            7 => Type::WriteExclusiveAllRegistrants,
            8 => Type::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// Every registrant holds the reservation.
    fn all_registrants(self) -> bool {
        matches!(
            self,
            Type::WriteExclusiveAllRegistrants | Type::ExclusiveAccessAllRegistrants
        )
    }

    /// Registrants who do not hold it may still write.
    fn registrants_pass(self) -> bool {
        !matches!(self, Type::WriteExclusive | Type::ExclusiveAccess)
    }

    /// Non-holders may not even read.
    fn exclusive_access(self) -> bool {
        matches!(
            self,
            Type::ExclusiveAccess
                | Type::ExclusiveAccessRegistrantsOnly
                | Type::ExclusiveAccessAllRegistrants
        )
    }
}

/// How a command touches the unit, for the reservation rules (SPC-5
/// table 68, SBC-4 table 13).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    Read,
    Write,
    /// Allowed whatever is reserved (INQUIRY, READ CAPACITY, …).
    Free,
}

fn access(cmd: &Command) -> Access {
    match cmd {
        Command::Read { .. }
        | Command::Verify { .. }
        | Command::GetLbaStatus { .. }
        | Command::Prefetch { .. }
        | Command::ModeSense { .. }
        | Command::PopulateToken { .. } => Access::Read,
        Command::Write { .. }
        | Command::WriteSame { .. }
        | Command::Unmap { .. }
        | Command::CompareAndWrite { .. }
        | Command::SynchronizeCache { .. }
        | Command::WriteAndVerify { .. }
        | Command::OrWrite { .. }
        | Command::ExtendedCopy { .. }
        | Command::WriteUsingToken { .. }
        | Command::ModeSelect { .. } => Access::Write,
        _ => Access::Free,
    }
}

/// Why a PERSISTENT RESERVE OUT or RESERVE was not carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// RESERVATION CONFLICT status.
    Conflict,
    /// CHECK CONDITION with this sense.
    Check(Sense),
}

impl From<Sense> for Refusal {
    fn from(s: Sense) -> Self {
        Refusal::Check(s)
    }
}

/// What a PERSISTENT RESERVE OUT did beyond its own nexus, for the
/// caller to carry out.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// Unit attentions to establish, by nexus.
    pub tell: Vec<(NexusName, Sense)>,
    /// Nexuses whose tasks must be aborted (PREEMPT AND ABORT).
    pub abort: Vec<NexusName>,
    /// The state changed, and must be saved (or its saved copy removed)
    /// before the command is answered.
    pub changed: bool,
    /// The unit was reset (LOGICAL UNIT RESET, TARGET WARM RESET): every
    /// task of every nexus ends and every nexus is told so. Never set by a
    /// PERSISTENT RESERVE OUT; servers of a shared unit send it to each
    /// other.
    pub reset: bool,
}

const INVALID_FIELD_IN_PARAMETERS: Sense = Sense::new(Key::IllegalRequest, 0x26, 0x00);
const INVALID_RELEASE: Sense = Sense::new(Key::IllegalRequest, 0x26, 0x04);
pub const RESERVATIONS_PREEMPTED: Sense = Sense::new(Key::UnitAttention, 0x2a, 0x03);
pub const RESERVATIONS_RELEASED: Sense = Sense::new(Key::UnitAttention, 0x2a, 0x04);
pub const REGISTRATIONS_PREEMPTED: Sense = Sense::new(Key::UnitAttention, 0x2a, 0x05);

/// PERSISTENT RESERVE OUT service actions.
mod action {
    pub const REGISTER: u8 = 0;
    pub const RESERVE: u8 = 1;
    pub const RELEASE: u8 = 2;
    pub const CLEAR: u8 = 3;
    pub const PREEMPT: u8 = 4;
    pub const PREEMPT_AND_ABORT: u8 = 5;
    pub const REGISTER_AND_IGNORE: u8 = 6;
}

/// One logical unit's reservations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reservations {
    generation: u32,
    /// In the order they registered.
    registrations: Vec<(NexusName, u64)>,
    /// The persistent reservation and its type; for the all-registrants
    /// types the nexus is the one that took it, and every registrant
    /// holds it.
    holder: Option<(NexusName, Type)>,
    /// Activate persist through power loss: the last REGISTER asked for
    /// the state to outlive a restart.
    aptpl: bool,
    /// A RESERVE (6)/(10) reservation.
    legacy: Option<NexusName>,
}

impl Reservations {
    fn key_of(&self, n: &NexusName) -> Option<u64> {
        self.registrations
            .iter()
            .find(|(r, _)| r == n)
            .map(|(_, k)| *k)
    }

    fn holds(&self, n: &NexusName) -> bool {
        match &self.holder {
            Some((_, t)) if t.all_registrants() => self.key_of(n).is_some(),
            Some((h, _)) => h == n,
            None => false,
        }
    }

    /// Whether any reservation (persistent or RESERVE) is held: without
    /// one, no command can conflict.
    pub fn held(&self) -> bool {
        self.holder.is_some() || self.legacy.is_some()
    }

    /// The nexus holding a RESERVE (6)/(10) reservation.
    pub fn reserved_by(&self) -> Option<&NexusName> {
        self.legacy.as_ref()
    }

    /// No registration and no persistent reservation.
    pub fn is_empty(&self) -> bool {
        self.registrations.is_empty() && self.holder.is_none()
    }

    /// Whether the state should outlive a restart.
    pub fn persistent(&self) -> bool {
        self.aptpl
    }

    /// Whether `cmd` from `n` meets a reservation it may not pass (the
    /// answer is then RESERVATION CONFLICT).
    pub fn conflicts(&self, n: &NexusName, cmd: &Command) -> bool {
        if let Some(owner) = &self.legacy {
            if owner != n {
                // SPC-2: only what describes the unit passes another
                // nexus' RESERVE (and a RELEASE, which does nothing).
                return !matches!(
                    cmd,
                    Command::Inquiry { .. }
                        | Command::ReportLuns { .. }
                        | Command::RequestSense { .. }
                        | Command::ReportTargetPortGroups { .. }
                        | Command::ReportOpcodes { .. }
                        | Command::Release
                );
            }
            return false;
        }
        let Some((_, kind)) = &self.holder else {
            return false;
        };
        if self.holds(n) || (kind.registrants_pass() && self.key_of(n).is_some()) {
            return false;
        }
        match access(cmd) {
            Access::Free => false,
            Access::Write => true,
            Access::Read => kind.exclusive_access(),
        }
    }

    /// RESERVE (6)/(10) from `n`.
    ///
    /// # Errors
    ///
    /// [`Refusal::Conflict`] while another nexus holds it or while any
    /// persistent registration exists (SPC-5 5.14.3).
    pub fn reserve(&mut self, n: &NexusName) -> Result<(), Refusal> {
        if !self.registrations.is_empty() || self.holder.is_some() {
            return Err(Refusal::Conflict);
        }
        match &self.legacy {
            Some(owner) if owner != n => Err(Refusal::Conflict),
            _ => {
                self.legacy = Some(n.clone());
                Ok(())
            }
        }
    }

    /// RELEASE (6)/(10) from `n`: ends its own RESERVE, and does nothing
    /// otherwise.
    ///
    /// # Errors
    ///
    /// [`Refusal::Conflict`] while persistent registrations exist.
    pub fn release(&mut self, n: &NexusName) -> Result<(), Refusal> {
        if !self.registrations.is_empty() || self.holder.is_some() {
            return Err(Refusal::Conflict);
        }
        if self.legacy.as_ref() == Some(n) {
            self.legacy = None;
        }
        Ok(())
    }

    /// The unit was reset, or `n`'s nexus ended (`None`: a reset): a
    /// RESERVE reservation does not outlive either (SPC-2 5.5.1).
    pub fn nexus_lost(&mut self, n: Option<&NexusName>) {
        if n.is_none() || self.legacy.as_ref() == n {
            self.legacy = None;
        }
    }

    /// PERSISTENT RESERVE OUT `action` from `n`, with the parameter list
    /// `params`, and the scope and type of the CDB.
    ///
    /// # Errors
    ///
    /// The refusal to answer; nothing changed.
    pub fn out(
        &mut self,
        n: &NexusName,
        action: u8,
        scope: u8,
        kind: u8,
        params: &[u8],
    ) -> Result<Effects, Refusal> {
        if self.legacy.as_ref().is_some_and(|o| o != n) {
            return Err(Refusal::Conflict);
        }
        if params.len() != 24 {
            return Err(Sense::PARAMETER_LIST_LENGTH.into());
        }
        let key = u64::from_be_bytes(params[0..8].try_into().expect("eight bytes"));
        let sa_key = u64::from_be_bytes(params[8..16].try_into().expect("eight bytes"));
        let flags = params[20];
        // SPEC_I_PT and ALL_TG_PT are not offered (REPORT CAPABILITIES
        // says so): each path registers for itself.
        if flags & 0x0c != 0 {
            return Err(INVALID_FIELD_IN_PARAMETERS.into());
        }
        let aptpl = flags & 0x01 != 0;
        let mine = self.key_of(n);
        match action {
            action::REGISTER | action::REGISTER_AND_IGNORE => {
                if action == action::REGISTER && mine.unwrap_or(0) != key {
                    return Err(Refusal::Conflict);
                }
                Ok(self.register(n, mine, sa_key, aptpl))
            }
            action::RESERVE
            | action::RELEASE
            | action::CLEAR
            | action::PREEMPT
            | action::PREEMPT_AND_ABORT => {
                if mine != Some(key) {
                    return Err(Refusal::Conflict);
                }
                let typed = || {
                    if scope != 0 {
                        return Err(Sense::INVALID_FIELD_IN_CDB);
                    }
                    Type::from_code(kind).ok_or(Sense::INVALID_FIELD_IN_CDB)
                };
                match action {
                    action::RESERVE => self.take(n, typed()?),
                    action::RELEASE => self.give_up(n, typed()?),
                    action::CLEAR => Ok(self.clear(n)),
                    _ => self.preempt(n, sa_key, typed()?, action == action::PREEMPT_AND_ABORT),
                }
            }
            _ => Err(Sense::INVALID_FIELD_IN_CDB.into()),
        }
    }

    fn register(&mut self, n: &NexusName, mine: Option<u64>, new: u64, aptpl: bool) -> Effects {
        let mut fx = Effects::default();
        match (mine, new) {
            (None, 0) => return fx,
            (None, k) => self.registrations.push((n.clone(), k)),
            (Some(_), 0) => fx = self.unregister(n),
            (Some(_), k) => {
                for (r, old) in &mut self.registrations {
                    if r == n {
                        *old = k;
                    }
                }
            }
        }
        self.aptpl = aptpl;
        self.generation = self.generation.wrapping_add(1);
        fx.changed = true;
        fx
    }

    /// Removes `n`'s registration; a reservation it held alone goes with
    /// it (and so does an all-registrants one with the last registrant).
    fn unregister(&mut self, n: &NexusName) -> Effects {
        let mut fx = Effects::default();
        self.registrations.retain(|(r, _)| r != n);
        let ends = match &self.holder {
            Some((_, t)) if t.all_registrants() => self.registrations.is_empty(),
            Some((h, _)) => h == n,
            None => false,
        };
        if ends {
            let (_, t) = self.holder.take().expect("held");
            if t.registrants_pass() && !t.all_registrants() {
                self.tell_registrants(&mut fx, n, RESERVATIONS_RELEASED);
            }
        }
        fx
    }

    fn tell_registrants(&self, fx: &mut Effects, except: &NexusName, sense: Sense) {
        for (r, _) in &self.registrations {
            if r != except {
                fx.tell.push((r.clone(), sense));
            }
        }
    }

    fn take(&mut self, n: &NexusName, t: Type) -> Result<Effects, Refusal> {
        match &self.holder {
            None => {
                self.holder = Some((n.clone(), t));
                Ok(Effects {
                    changed: true,
                    ..Effects::default()
                })
            }
            Some((_, held)) if *held == t && self.holds(n) => Ok(Effects::default()),
            Some(_) => Err(Refusal::Conflict),
        }
    }

    fn give_up(&mut self, n: &NexusName, t: Type) -> Result<Effects, Refusal> {
        let mut fx = Effects::default();
        match &self.holder {
            Some((_, held)) if self.holds(n) => {
                if *held != t {
                    return Err(INVALID_RELEASE.into());
                }
                if held.registrants_pass() {
                    self.tell_registrants(&mut fx, n, RESERVATIONS_RELEASED);
                }
                self.holder = None;
                fx.changed = true;
                Ok(fx)
            }
            // Not the holder, or nothing held: nothing to do.
            _ => Ok(fx),
        }
    }

    fn clear(&mut self, n: &NexusName) -> Effects {
        let mut fx = Effects::default();
        self.tell_registrants(&mut fx, n, RESERVATIONS_PREEMPTED);
        self.registrations.clear();
        self.holder = None;
        self.generation = self.generation.wrapping_add(1);
        fx.changed = true;
        fx
    }

    fn preempt(
        &mut self,
        n: &NexusName,
        victim: u64,
        t: Type,
        abort: bool,
    ) -> Result<Effects, Refusal> {
        let all_registrants = matches!(&self.holder, Some((_, h)) if h.all_registrants());
        let holder_key = match &self.holder {
            Some((h, ht)) if !ht.all_registrants() => self.key_of(h),
            _ => None,
        };
        // Which registrations go, and whether the reservation passes to
        // `n` (SPC-5 5.14.11.4).
        let (gone, takes): (Vec<NexusName>, bool) = if all_registrants && victim == 0 {
            let gone = self
                .registrations
                .iter()
                .filter(|(r, _)| r != n)
                .map(|(r, _)| r.clone())
                .collect();
            (gone, true)
        } else {
            if victim == 0 {
                return Err(INVALID_FIELD_IN_PARAMETERS.into());
            }
            let gone: Vec<NexusName> = self
                .registrations
                .iter()
                .filter(|(r, k)| *k == victim && r != n)
                .map(|(r, _)| r.clone())
                .collect();
            let takes = holder_key == Some(victim);
            if gone.is_empty() && !takes {
                return Err(Refusal::Conflict);
            }
            (gone, takes)
        };
        let mut fx = Effects::default();
        self.registrations.retain(|(r, _)| !gone.contains(r));
        if takes {
            let changed_type = self.holder.as_ref().is_some_and(|(_, h)| *h != t);
            self.holder = Some((n.clone(), t));
            if changed_type {
                self.tell_registrants(&mut fx, n, RESERVATIONS_RELEASED);
            }
        } else if all_registrants && self.registrations.is_empty() {
            self.holder = None;
        }
        for g in &gone {
            fx.tell.retain(|(r, _)| r != g);
            fx.tell.push((g.clone(), REGISTRATIONS_PREEMPTED));
        }
        if abort {
            fx.abort = gone;
        }
        self.generation = self.generation.wrapping_add(1);
        fx.changed = true;
        Ok(fx)
    }

    /// PERSISTENT RESERVE IN `action`.
    ///
    /// # Errors
    ///
    /// INVALID FIELD IN CDB for an unknown service action.
    pub fn read(&self, action: u8, alloc: u16) -> Result<Vec<u8>, Sense> {
        let mut d = self.generation.to_be_bytes().to_vec();
        match action {
            0 => {
                let keys: Vec<u8> = self
                    .registrations
                    .iter()
                    .flat_map(|(_, k)| k.to_be_bytes())
                    .collect();
                d.extend_from_slice(&(keys.len() as u32).to_be_bytes());
                d.extend(keys);
            }
            1 => match &self.holder {
                None => d.extend_from_slice(&[0; 4]),
                Some((h, t)) => {
                    d.extend_from_slice(&16u32.to_be_bytes());
                    // An all-registrants reservation shows key 0.
                    let key = if t.all_registrants() {
                        0
                    } else {
                        self.key_of(h).unwrap_or(0)
                    };
                    d.extend_from_slice(&key.to_be_bytes());
                    d.extend_from_slice(&[0, 0, 0, 0, 0, *t as u8, 0, 0]);
                }
            },
            2 => {
                // REPORT CAPABILITIES: CRH, PTPL_C; TMV and PTPL_A; every
                // type but the obsolete ones.
                d = vec![0, 8, 0x11, 0x80 | u8::from(self.aptpl), 0xea, 0x01, 0, 0];
            }
            3 => {
                let mut body = Vec::new();
                for (r, k) in &self.registrations {
                    let holds = self.holds(r);
                    let tid = r.transport_id();
                    body.extend_from_slice(&k.to_be_bytes());
                    body.extend_from_slice(&[0; 4]);
                    body.push(u8::from(holds));
                    body.push(match &self.holder {
                        Some((_, t)) if holds => *t as u8,
                        _ => 0,
                    });
                    body.extend_from_slice(&[0; 4]);
                    body.extend_from_slice(&r.target_port.to_be_bytes());
                    body.extend_from_slice(&(tid.len() as u32).to_be_bytes());
                    body.extend(tid);
                }
                d.extend_from_slice(&(body.len() as u32).to_be_bytes());
                d.extend(body);
            }
            _ => return Err(Sense::INVALID_FIELD_IN_CDB),
        }
        d.truncate(usize::from(alloc));
        Ok(d)
    }
}
