//! SCSI commands on one connection. The reader hands each command here
//! in CmdSN order; what must follow that order (unit attentions, the
//! port's access state, taking WRITE data) happens at once, and the rest
//! runs at once as far as it can and as its own task from where it must
//! wait, so commands of one connection reach the backend together and
//! finish in any order (SIMPLE tasks, unrestricted reordering: the control
//! mode page says QAM 1).
//!
//! Memory is bounded: WRITEs waiting for their data may hold
//! [`MAX_PENDING_WRITE_BYTES`] per connection and what the store's
//! `max_total_bytes` leaves across the server (past either a WRITE is
//! answered TASK SET FULL), and READ data waiting to be sent what the
//! store's limits allow per connection and across the server
//! (`budget.rs`; past them READs wait their turn).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use braid_iscsi::negotiate::Params;
use braid_iscsi::pdu::Pdu;
use braid_iscsi::transfer::WriteTransfer;
use braid_scsi::dispatch::{self, Step};
use braid_scsi::respond::Unit;
use braid_scsi::sense::status;
use braid_scsi::{Command, Key, Sense};
use bytes::Bytes;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tracing::warn;

use super::answer::{check, conflict, outcome_batch, response, ZERO};
use super::budget::{ConnBudget, Held};
use super::lu::Nexus;
use super::out::{Batch, Out, Outbox, Slot, Sn};
use super::task::{abort_all, Task};
use super::timers::Awaited;
use super::unit::{self, Outcome};
use super::{media, rod, unitshared, unitwide, xcopy};
use super::{Served, Shared};
use crate::hold::Hold;

/// Bytes of WRITE data one connection may have waiting for their
/// Data-Out. Each waiting WRITE holds its whole buffer, so without a bound
/// an initiator that sends commands and never their data could pin the
/// queue depth times 8 MiB; past it a WRITE is answered TASK SET FULL and
/// the initiator retries it later.
pub(crate) const MAX_PENDING_WRITE_BYTES: usize = 32 << 20;

/// The logical unit as one session reaches it.
#[derive(Debug)]
pub(crate) struct Lun {
    pub served: Arc<Served>,
    /// The unit as this session had it described (use [`Self::unit`]).
    pub described: unit::Described,
    pub nexus: Nexus,
    pub shared: Arc<Shared>,
    /// The portal group (target port) of the session.
    pub tag: u16,
    /// Test hook: commands of this session wait here before the backend.
    pub hold: Arc<Hold>,
    /// Told when a command found the storage lost to this server: the
    /// connection then closes (see [`Outcome::Lost`]).
    pub lost: Arc<Notify>,
    /// The session in the connection registry: once a fence cut it,
    /// commands not yet started never reach the backend.
    pub conn: Option<Arc<braid_store::registry::Conn>>,
}

/// A RESERVE (6) does not outlive its nexus: where the reservations are
/// shared, every server learns that it ended.
impl Drop for Lun {
    fn drop(&mut self) {
        if !self.holds_shared_reserve() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (served, name) = (self.served.clone(), self.nexus.name.clone());
        rt.spawn(async move { unitshared::nexus_lost(&served.lu, Some(&name)).await });
    }
}

impl Lun {
    /// The unit as it is now. A change of the export's size since the
    /// last command (`rbd resize`) is this nexus's news: CAPACITY DATA HAS
    /// CHANGED, reported to its next command but INQUIRY.
    pub(crate) fn unit(&self) -> Arc<Unit> {
        let size = self.served.export.size();
        self.described.now(size, |was, now| {
            tracing::info!(
                export = %self.served.export.name,
                initiator = %self.nexus.name.initiator_port,
                was,
                now,
                "the unit's capacity changed (blocks): telling the session"
            );
            self.served
                .lu
                .raise_on(self.nexus.id, Sense::CAPACITY_CHANGED);
        })
    }

    /// Whether this nexus holds a RESERVE (6) of reservations every
    /// server shares.
    fn holds_shared_reserve(&self) -> bool {
        let lu = &self.served.lu;
        lu.shared.is_some() && lu.reservations().reserved_by() == Some(&self.nexus.name)
    }

    /// The nexus ends by a logout: a RESERVE (6) it holds ends on every
    /// server before the logout is answered, so an initiator that sends
    /// RESERVE through another server once it has the answer is not
    /// refused (the end of a nexus that just drops is told in the
    /// background, from [`Drop`]).
    pub(crate) async fn logging_out(&self) {
        if self.holds_shared_reserve() {
            unitshared::nexus_lost(&self.served.lu, Some(&self.nexus.name)).await;
        }
    }
}

/// A WRITE waiting for its data.
struct PendingWrite {
    task: Task,
    slot: Slot,
    cmd: Command,
    /// Bytes the CDB names, and bytes the initiator said it would send:
    /// when they differ, only the smaller moves and the response says by
    /// how much (overflow or underflow).
    cdb_bytes: u32,
    expected: u32,
    transfer: WriteTransfer,
    buf: Vec<u8>,
    /// Its room in the server's budget, until it is written.
    room: Held,
    /// The LUN field as the command carried it, for R2Ts.
    lun_field: u64,
}

/// Commands moving at most this many bytes run at once (see
/// [`Commands::start`]).
const RUN_NOW_BYTES: u32 = 64 << 10;

/// The command path of one connection.
pub(crate) struct Commands {
    pub lun: Arc<Lun>,
    pub outbox: Outbox,
    pub params: Params,
    /// Woken when a task of this connection is aborted from anywhere.
    pub owner: Arc<Notify>,
    reads: ConnBudget,
    pending: HashMap<u32, PendingWrite>,
    pending_bytes: usize,
    /// When each pending WRITE last heard of its data.
    awaited: Awaited,
    /// Tags of WRITEs aborted while owed data, latest last: Data-Out
    /// that the initiator still sends for them is dropped unanswered.
    aborted: VecDeque<u32>,
    running: JoinSet<()>,
}

/// Aborted WRITEs remembered for their late Data-Out: a window's worth.
const ABORTED_REMEMBERED: usize = 64;

impl Commands {
    pub fn new(lun: Arc<Lun>, outbox: Outbox, params: Params) -> Self {
        let reads = lun.shared.budget.connection(lun.shared.limits.max_bytes);
        let awaited = Awaited::new(lun.shared.timers.data_out);
        Self {
            lun,
            outbox,
            params,
            owner: Arc::new(Notify::new()),
            reads,
            pending: HashMap::new(),
            pending_bytes: 0,
            awaited,
            aborted: VecDeque::new(),
            running: JoinSet::new(),
        }
    }

    /// Runs `f` as a task of this connection.
    pub fn spawn(&mut self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        self.running.spawn(f);
        while self.running.try_join_next().is_some() {}
    }

    /// Runs `f` here at once as far as it goes without waiting, and as a
    /// task of this connection from where it must wait.
    ///
    /// For a command moving at most [`RUN_NOW_BYTES`] on an in-memory
    /// backend, which never waits: it is done before the reader takes the
    /// next PDU, so the answers to every command of one read of the socket
    /// leave in one write (the writer runs once the reader yields). As
    /// tasks of their own, each woke the writer and went out in a write of
    /// its own (4 KiB QD32 writes on loopback: 71k IOPS then, 88k now).
    /// Larger commands stay tasks, which the runtime's other threads can
    /// take: copying a MiB here holds up the reader and the writer, and
    /// halved 1 MiB QD16 reads.
    fn start(&mut self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut f = Box::pin(f);
        // Polled with a waker that does nothing: a future that is not ready
        // has registered it wherever it waits, and registers the task's
        // own waker when the task polls it again, as every future must.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        if f.as_mut().poll(&mut cx).is_pending() {
            self.spawn(f);
        }
    }

    /// Runs a command moving `bytes` with [`Self::start`] or [`Self::spawn`].
    fn run_command(
        &mut self,
        bytes: u32,
        f: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        if bytes <= RUN_NOW_BYTES {
            self.start(f);
        } else {
            self.spawn(f);
        }
    }

    /// CHECK CONDITION with `sense`; `slot` goes back once it is sent.
    fn check(&self, itt: u32, sense: Sense, slot: Slot) {
        self.outbox
            .send(Batch::of(vec![check(itt, sense)]).with_slot(slot));
    }

    /// A SCSI Command PDU, taken in CmdSN order with `slot`.
    pub fn command(&mut self, pdu: &Pdu, slot: Slot) {
        let b = pdu.bhs;
        let itt = b.itt();
        // The tag is the new command's now, not an aborted WRITE's.
        self.aborted.retain(|t| *t != itt);
        let expected = b.u32_at(20);
        let lun = b.lun() >> 48;
        let cmd = match Command::parse(&b.0[32..48]) {
            Ok(cmd) => cmd,
            Err(sense) => return self.check(itt, sense, slot),
        };
        // Another LUN, a unit attention, the port's access state: all
        // answered at once, without the backend.
        let state = self.lun.shared.ports.get(self.lun.tag).state();
        let unit = self.lun.unit();
        if let Some(outcome) = dispatch::admit(&unit, &self.lun.nexus, state, lun, &cmd) {
            return self
                .outbox
                .send(outcome_batch(itt, outcome, expected, &self.params, None).with_slot(slot));
        }
        let set = &self.lun.served.lu.tasks;
        let Ok(task) = set.enter(self.lun.nexus.id, itt, &self.owner) else {
            warn!(itt, "a task tag already in use");
            return self.check(itt, Sense::new(Key::AbortedCommand, 0x4e, 0x00), slot);
        };
        // Checked once the task is in the set: a PREEMPT AND ABORT that
        // removes this nexus' registration after the check finds the task
        // there and aborts it.
        if self.lun.served.lu.conflicts(&self.lun.nexus.name, &cmd) {
            if task.ctl.answer() {
                self.outbox
                    .send(Batch::of(vec![conflict(itt)]).with_slot(slot));
            }
            return;
        }
        if let Some(moved) = dispatch::data_out(&unit, cmd, expected) {
            return self.write(pdu, moved, task, slot);
        }
        let lun = self.lun.clone();
        let (outbox, params, reads) = (self.outbox.clone(), self.params, self.reads.clone());
        // Room for the data first: the largest READ moves 8 MiB.
        let want = match cmd {
            Command::Read { blocks, .. } => blocks.saturating_mul(unit::BLOCK),
            _ => 64 << 10,
        }
        .min(unit::MAX_TRANSFER);
        self.run_command(want, async move {
            let permit = tokio::select! {
                p = reads.hold(want as usize) => p,
                () = task.ctl.until_aborted() => return,
            };
            let Some(outcome) = run(&lun, &task, cmd, None).await else {
                return;
            };
            outbox.send(outcome_batch(itt, outcome, expected, &params, permit).with_slot(slot));
        });
    }

    /// A command that takes data, `moved` as [`dispatch::data_out`]
    /// checked it: gathered here until it is whole.
    fn write(
        &mut self,
        pdu: &Pdu,
        moved: Result<(Command, u32, u32), Sense>,
        task: Task,
        slot: Slot,
    ) {
        let b = pdu.bhs;
        let itt = b.itt();
        let expected = b.u32_at(20);
        let (cmd, cdb_bytes, total) = match moved {
            Ok(m) => m,
            Err(sense) => return self.check(itt, sense, slot),
        };
        let room = (self.pending_bytes + total as usize <= MAX_PENDING_WRITE_BYTES)
            .then(|| self.reads.try_hold_write(total as usize))
            .flatten();
        let Some(room) = room else {
            let r = response(itt, status::TASK_SET_FULL, Bytes::new(), 0, 0);
            return self.outbox.send(Batch::of(vec![r]).with_slot(slot));
        };
        // Immediate data past what moves is not used (the initiator sent
        // up to its expected length).
        let immediate = pdu.data.len().min(total as usize);
        let p = &self.params;
        let transfer = match WriteTransfer::new(
            total,
            immediate as u32,
            p.initial_r2t,
            p.first_burst,
            p.max_burst,
            p.max_outstanding_r2t,
        ) {
            Ok(t) => t,
            Err(e) => {
                warn!("WRITE refused: {e}");
                return self.check(itt, Sense::new(Key::AbortedCommand, 0x0c, 0x0d), slot);
            }
        };
        let mut buf = vec![0u8; total as usize];
        buf[..immediate].copy_from_slice(&pdu.data[..immediate]);
        let mut w = PendingWrite {
            task,
            slot,
            cmd,
            cdb_bytes,
            expected,
            transfer,
            buf,
            room,
            lun_field: b.lun(),
        };
        if w.transfer.complete() {
            return self.finish_write(itt, w);
        }
        self.send_r2ts(itt, &mut w);
        self.keep(itt, w);
    }

    /// Keeps `w` waiting for its data, the timeout running from now.
    fn keep(&mut self, itt: u32, w: PendingWrite) {
        self.awaited.wait(itt, std::time::Instant::now());
        self.pending_bytes += w.buf.len();
        self.pending.insert(itt, w);
    }

    fn send_r2ts(&self, itt: u32, w: &mut PendingWrite) {
        let pdus: Vec<Out> = w
            .transfer
            .r2ts()
            .into_iter()
            .map(|r| Out::new(r.bhs(itt, w.lun_field, ZERO), Bytes::new(), Sn::Shows))
            .collect();
        if !pdus.is_empty() {
            self.outbox.send(Batch::of(pdus));
        }
    }

    /// Whether `itt` names a WRITE waiting for data, or one aborted
    /// while it did (whose late data is dropped).
    pub fn awaits_data(&self, itt: u32) -> bool {
        self.pending.contains_key(&itt) || self.aborted.contains(&itt)
    }

    /// A Data-Out PDU for a waiting WRITE.
    pub fn data_out(&mut self, pdu: &Pdu) {
        let itt = pdu.bhs.itt();
        let Some(w) = self.pending.get_mut(&itt) else {
            return;
        };
        let at = match w.transfer.data_out(&pdu.bhs, pdu.data.len() as u32) {
            Ok(at) => at as usize,
            Err(e) => {
                // The task cannot complete as sent: it ends with DATA
                // PHASE ERROR, and the connection carries on.
                warn!("WRITE data out of turn: {e}");
                let w = self.take(itt);
                if w.task.ctl.answer() {
                    let sense = Sense::new(Key::AbortedCommand, 0x4b, 0x00);
                    self.check(itt, sense, w.slot);
                }
                return;
            }
        };
        w.buf[at..at + pdu.data.len()].copy_from_slice(&pdu.data);
        if w.task.ctl.aborted() {
            self.drop_aborted(itt);
        } else if w.transfer.complete() {
            let w = self.take(itt);
            self.finish_write(itt, w);
        } else {
            let mut w = self.take(itt);
            self.send_r2ts(itt, &mut w);
            self.keep(itt, w);
        }
    }

    fn take(&mut self, itt: u32) -> PendingWrite {
        let w = self.pending.remove(&itt).expect("present");
        self.awaited.forget(itt);
        self.pending_bytes -= w.buf.len();
        w
    }

    /// Ends an aborted WRITE at once, data owed or not, so that its abort
    /// answers: an initiator stops sending data for a task it aborts
    /// (Linux does), and one that has died sends none. What data still
    /// comes for it is dropped ([`Self::awaits_data`]).
    fn drop_aborted(&mut self, itt: u32) {
        if self.take(itt).transfer.awaiting_solicited() {
            if self.aborted.len() == ABORTED_REMEMBERED {
                self.aborted.pop_front();
            }
            self.aborted.push_back(itt);
        }
    }

    /// Ends aborted WRITEs that wait for data (see [`Self::drop_aborted`]).
    pub fn sweep(&mut self) {
        let done: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, w)| w.task.ctl.aborted())
            .map(|(itt, _)| *itt)
            .collect();
        for itt in done {
            self.drop_aborted(itt);
        }
    }

    /// When the first WRITE owed data has waited the Data-Out timeout.
    pub fn data_out_due(&self) -> Option<std::time::Instant> {
        self.awaited.next()
    }

    /// A WRITE whose data is overdue at `now`, and how long it waited.
    pub fn data_out_overdue(&self, now: std::time::Instant) -> Option<(u32, Duration)> {
        self.awaited.overdue(now)
    }

    fn finish_write(&mut self, itt: u32, w: PendingWrite) {
        let lun = self.lun.clone();
        let outbox = self.outbox.clone();
        self.run_command(w.buf.len() as u32, async move {
            let PendingWrite {
                task,
                slot,
                cmd,
                cdb_bytes,
                expected,
                mut buf,
                room: _room,
                ..
            } = w;
            if let Command::Write { blocks, .. } | Command::WriteAndVerify { blocks, .. } = cmd {
                buf.truncate((blocks * unit::BLOCK) as usize);
            }
            let Some(outcome) = run(&lun, &task, cmd, Some(buf)).await else {
                return;
            };
            let pdus = match outcome {
                Outcome::Good(_) => vec![response(
                    itt,
                    status::GOOD,
                    Bytes::new(),
                    cdb_bytes,
                    expected,
                )],
                Outcome::Check(sense) => vec![check(itt, sense)],
                Outcome::Conflict => vec![conflict(itt)],
                // Never sent: `run` closes the connection instead.
                Outcome::Lost => Vec::new(),
            };
            outbox.send(Batch::of(pdus).with_slot(slot));
        });
    }

    /// Whether nothing is in flight: no command running, none waiting
    /// for its data.
    pub fn idle(&mut self) -> bool {
        while self.running.try_join_next().is_some() {}
        self.running.is_empty() && self.pending.is_empty()
    }

    /// Ends every task of this connection: those waiting never run, those
    /// running finish; returns once all are gone.
    pub async fn shutdown(&mut self) {
        let nexus = self.lun.nexus.id;
        let mine = self.lun.served.lu.tasks.select(|n, _| n == nexus);
        self.pending.clear();
        self.awaited = Awaited::new(self.lun.shared.timers.data_out);
        self.pending_bytes = 0;
        abort_all(&mine).await;
        while self.running.join_next().await.is_some() {}
    }

    /// Waits for every running task to end on its own (a logout).
    pub async fn drain(&mut self) {
        self.pending.clear();
        self.awaited = Awaited::new(self.lun.shared.timers.data_out);
        self.pending_bytes = 0;
        while self.running.join_next().await.is_some() {}
    }
}

/// Runs `cmd` as `task`: waits while the session is held (a test hook),
/// then carries it out unless aborted first. `None` when aborted: nothing
/// is sent for an aborted task.
async fn run(lun: &Lun, task: &Task, cmd: Command, data: Option<Vec<u8>>) -> Option<Outcome> {
    let ctl = &task.ctl;
    tokio::select! {
        () = lun.hold.wait(|| ctl.aborted()) => {}
        () = ctl.until_aborted() => {}
    }
    if lun.conn.as_ref().is_some_and(|c| c.fenced()) {
        return None;
    }
    if !ctl.start() {
        return None;
    }
    let (export, wce) = (&lun.served.export, lun.served.lu.write_cache.on());
    let medium = unit::medium(export, wce);
    let groups = || lun.shared.ports.groups();
    let unit = lun.unit();
    if let (Some(shared), Command::Reserve | Command::Release) = (&lun.served.lu.shared, cmd) {
        let lu = &lun.served.lu;
        let outcome = unitshared::reserve_or_release(lu, shared, &lun.nexus.name, cmd).await;
        return ctl.answer().then_some(outcome);
    }
    if matches!(cmd, Command::PersistentReserveIn { .. }) {
        if let Err(answer) = unitshared::fresh(&lun.served.lu).await {
            return ctl.answer().then_some(answer);
        }
    }
    let outcome =
        match dispatch::decide(&lun.served.lu, &lun.nexus.name, &unit, medium, cmd, groups) {
            Step::Answer(outcome) => outcome,
            Step::UnitWide(cmd) => {
                unitwide::execute(&lun.served, &unit, &lun.nexus, cmd, data).await
            }
            Step::Medium(Command::ExtendedCopy { .. }) => {
                let params = data.unwrap_or_default();
                xcopy::execute(&lun.shared, lun.tag, &lun.served, &lun.nexus.name, &params).await
            }
            Step::Medium(Command::PopulateToken { list_id, .. }) => {
                let params = data.unwrap_or_default();
                rod::populate(
                    &lun.shared,
                    lun.tag,
                    &lun.served,
                    &lun.nexus.name,
                    list_id,
                    &params,
                )
            }
            Step::Medium(Command::WriteUsingToken { list_id, .. }) => {
                let params = data.unwrap_or_default();
                let (shared, served) = (&lun.shared, &lun.served);
                rod::write_using(shared, lun.tag, served, &lun.nexus.name, list_id, &params).await
            }
            Step::Medium(cmd) => media::execute(export, &unit, wce, cmd, data).await,
        };
    if let Outcome::Lost = outcome {
        warn!(
            "{} lost its storage (ESHUTDOWN): closing the connection unanswered \
             so that the initiator fails over",
            lun.served.export.name
        );
        lun.lost.notify_one();
        return None;
    }
    ctl.answer().then_some(outcome)
}
