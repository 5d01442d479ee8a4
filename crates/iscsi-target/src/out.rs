//! The sending half of a connection in full feature phase. Commands run
//! concurrently and finish in any order; every PDU they answer with goes
//! through one [`Outbox`] to one writer task, which numbers it as it goes
//! on the wire: StatSN counts up in the order responses are sent (RFC 7143
//! 4.2.2.2 asks exactly that of a connection), and ExpCmdSN and MaxCmdSN
//! are the window as it stands at that moment.
//!
//! Batches queued while the socket was busy are written together, and
//! data segments are sent from where they lie (no copy into the write
//! buffer): the headers, padding and digests are the only bytes made here.
//!
//! What waits here is bounded: READ data by the read budget it holds
//! (`budget.rs`), everything else by [`QUEUE_BYTES`], past which the
//! reader stops taking PDUs from the socket ([`Outbox::has_room`]) until
//! the writer catches up. An initiator that sends and never reads is so
//! held back by TCP itself, and nothing it sent is dropped. A command's
//! place in the window ([`Slot`]) goes back only once its answer is on
//! the wire, so MaxCmdSN never offers room that the socket has not made.

use std::io::IoSlice;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use braid_iscsi::pdu::{padded, Bhs};
use braid_iscsi::window::Window;
use braid_iscsi::{digest, Digests};
use braid_pool::{Pace, Progress};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{mpsc, Notify};

use crate::timers::Taking;

/// What a PDU's StatSN field carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sn {
    /// It carries status: the next StatSN, which then moves on.
    Takes,
    /// The next StatSN, without moving it (R2T, unsolicited NOP-In).
    Shows,
    /// Reserved (a Data-In without status).
    Reserved,
}

/// One PDU to send; the numbers are filled in by the writer.
#[derive(Debug)]
pub(crate) struct Out {
    pub bhs: Bhs,
    pub data: Bytes,
    pub sn: Sn,
}

impl Out {
    pub fn new(bhs: Bhs, data: Bytes, sn: Sn) -> Self {
        Self { bhs, data, sn }
    }
}

/// PDUs sent together, in order (a READ's Data-In, say), and what they
/// hold until they are on the wire: their data's room in the
/// connection's read budget, the command's place in the window.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub pdus: Vec<Out>,
    pub permit: Option<crate::budget::Held>,
    pub slot: Option<Slot>,
    /// Bytes counted against [`QUEUE_BYTES`] (set by [`Outbox::send`]).
    counted: usize,
}

impl Batch {
    /// `pdus`, holding nothing.
    pub fn of(pdus: Vec<Out>) -> Self {
        Self {
            pdus,
            ..Self::default()
        }
    }

    /// The batch, giving back `slot` once it is sent.
    pub fn with_slot(mut self, slot: Slot) -> Self {
        self.slot = Some(slot);
        self
    }
}

/// Bytes of answers other than READ data (which its budget bounds) that
/// one connection may have waiting for the socket: above it the reader
/// takes no more PDUs. One gather of the writer: enough that a writer
/// that can send never waits on the reader.
pub(crate) const QUEUE_BYTES: usize = MAX_GATHER;

/// What a PDU costs in the queue: its data and a header.
fn cost(pdus: &[Out]) -> usize {
    pdus.iter().map(|p| 48 + p.data.len()).sum()
}

/// A place taken in the command window, or among the immediate commands
/// ([`braid_iscsi::window::IMMEDIATE_DEPTH`]), given back when dropped:
/// by the writer once the command's answer is sent, or by the task when
/// it ends unanswered (aborted).
#[derive(Debug)]
pub(crate) struct Slot(Option<(SharedWindow, bool)>);

impl Slot {
    /// The place a non-immediate command took.
    pub fn taken(window: &SharedWindow) -> Self {
        Self(Some((window.clone(), false)))
    }

    /// The place an immediate SCSI command took.
    pub fn immediate(window: &SharedWindow) -> Self {
        Self(Some((window.clone(), true)))
    }

    /// Other immediate PDUs take none.
    pub fn none() -> Self {
        Self(None)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        match &self.0 {
            Some((w, false)) => lock(w).finish(),
            Some((w, true)) => lock(w).finish_immediate(),
            None => {}
        }
    }
}

/// The command window, shared by the reader (which takes commands), the
/// tasks (which finish them) and the writer (which states it).
pub(crate) type SharedWindow = Arc<Mutex<Window>>;

pub(crate) fn lock(w: &SharedWindow) -> std::sync::MutexGuard<'_, Window> {
    w.lock().unwrap_or_else(|p| p.into_inner())
}

/// Bytes queued and not yet written, and the writer's word that some
/// were.
#[derive(Debug)]
struct Queued {
    bytes: AtomicUsize,
    written: Notify,
    /// Batches queued and not yet written, and when the socket last took
    /// bytes (or, from empty, when the first of them was queued): what
    /// [`Outbox::taking`] tells the connection's liveness.
    waiting: AtomicUsize,
    took: Mutex<Instant>,
}

impl Default for Queued {
    fn default() -> Self {
        Self {
            bytes: AtomicUsize::new(0),
            written: Notify::new(),
            waiting: AtomicUsize::new(0),
            took: Mutex::new(Instant::now()),
        }
    }
}

impl Queued {
    fn took_now(&self) {
        *self
            .took
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
    }
}

/// Where everything a connection sends is queued.
#[derive(Clone, Debug)]
pub(crate) struct Outbox {
    tx: mpsc::UnboundedSender<Batch>,
    queued: Arc<Queued>,
}

impl Outbox {
    /// Queues `batch`; a connection already closed drops it.
    pub fn send(&self, mut batch: Batch) {
        if batch.permit.is_none() {
            batch.counted = cost(&batch.pdus);
            self.queued.bytes.fetch_add(batch.counted, Ordering::AcqRel);
        }
        if self.queued.waiting.fetch_add(1, Ordering::AcqRel) == 0 {
            self.queued.took_now();
        }
        if let Err(mpsc::error::SendError(b)) = self.tx.send(batch) {
            self.queued.bytes.fetch_sub(b.counted, Ordering::AcqRel);
            self.queued.waiting.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether the initiator takes what is sent: nothing waits, or when
    /// the socket last took bytes.
    pub fn taking(&self) -> Taking {
        if self.queued.waiting.load(Ordering::Acquire) == 0 {
            return Taking::All;
        }
        Taking::Since(
            *self
                .queued
                .took
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// Queues one PDU.
    pub fn pdu(&self, bhs: Bhs, data: Bytes, sn: Sn) {
        self.send(Batch::of(vec![Out::new(bhs, data, sn)]));
    }

    /// Whether the reader may take another PDU: answers queued are
    /// within [`QUEUE_BYTES`].
    pub fn has_room(&self) -> bool {
        self.queued.bytes.load(Ordering::Acquire) <= QUEUE_BYTES
    }

    /// Resolves once [`Self::has_room`] holds.
    pub async fn room(&self) {
        loop {
            let written = self.queued.written.notified();
            if self.has_room() {
                return;
            }
            written.await;
        }
    }
}

/// Most bytes gathered into one write.
const MAX_GATHER: usize = 4 << 20;

/// Starts the writer; returns the outbox and the writer's task, which
/// ends (with the error that ended it, if any) once every outbox is
/// dropped and everything queued is sent.
pub(crate) fn start(
    mut wr: OwnedWriteHalf,
    digests: Digests,
    stat_sn: u32,
    window: SharedWindow,
    stall: Option<std::time::Duration>,
) -> (Outbox, tokio::task::JoinHandle<std::io::Result<()>>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Batch>();
    let queued = Arc::new(Queued::default());
    let outbox = Outbox {
        tx,
        queued: queued.clone(),
    };
    let task = tokio::spawn(async move {
        let mut stat_sn = stat_sn;
        let mut heads = BytesMut::new();
        let mut pace = Pace::new();
        while let Some(first) = rx.recv().await {
            let mut batches = vec![first];
            let mut size: usize = batches[0].pdus.iter().map(|p| p.data.len()).sum();
            while size < MAX_GATHER {
                let Ok(b) = rx.try_recv() else { break };
                size += b.pdus.iter().map(|p| p.data.len()).sum::<usize>();
                batches.push(b);
            }
            let mut parts: Vec<Bytes> = Vec::new();
            // The places these answers held come back as they are framed,
            // so that the MaxCmdSN they carry counts them (a window of one
            // would otherwise never reopen): the room so shown reaches
            // the initiator with these answers, never before them.
            let slots: Vec<Slot> = batches.iter_mut().filter_map(|b| b.slot.take()).collect();
            drop(slots);
            {
                let w = lock(&window);
                for b in &mut batches {
                    for p in &mut b.pdus {
                        number(&mut p.bhs, p.sn, &mut stat_sn, &w);
                        frame(p, digests, &mut heads, &mut parts);
                    }
                }
            }
            write_all(&mut wr, &parts, &mut pace, &queued, stall).await?;
            // Read budget and room in the queue go back only now that the
            // answers are on their way.
            let written: usize = batches.iter().map(|b| b.counted).sum();
            let sent = batches.len();
            drop(batches);
            queued.bytes.fetch_sub(written, Ordering::AcqRel);
            queued.waiting.fetch_sub(sent, Ordering::AcqRel);
            queued.written.notify_waiters();
        }
        wr.shutdown().await
    });
    (outbox, task)
}

/// Fills in StatSN, ExpCmdSN and MaxCmdSN.
fn number(bhs: &mut Bhs, sn: Sn, stat_sn: &mut u32, w: &Window) {
    match sn {
        Sn::Takes => {
            bhs.set_u32(24, *stat_sn);
            *stat_sn = stat_sn.wrapping_add(1);
        }
        Sn::Shows => bhs.set_u32(24, *stat_sn),
        Sn::Reserved => {}
    }
    bhs.set_u32(28, w.exp);
    bhs.set_u32(32, w.max());
}

/// The PDU as wire pieces: header (with AHS length zero, data length,
/// header digest), then data, padding and data digest.
fn frame(p: &Out, digests: Digests, heads: &mut BytesMut, parts: &mut Vec<Bytes>) {
    let mut bhs = p.bhs;
    bhs.0[4] = 0;
    bhs.set_data_len(p.data.len());
    heads.extend_from_slice(&bhs.0);
    if digests.header {
        heads.extend_from_slice(&digest::wire(&bhs.0));
    }
    parts.push(heads.split().freeze());
    if p.data.is_empty() {
        return;
    }
    parts.push(p.data.clone());
    let pad = padded(p.data.len()) - p.data.len();
    heads.extend_from_slice(&[0u8; 3][..pad]);
    if digests.data {
        let crc = digest::crc32c_append(digest::crc32c(&p.data), &[0u8; 3][..pad]);
        heads.extend_from_slice(&crc.to_le_bytes());
    }
    if !heads.is_empty() {
        parts.push(heads.split().freeze());
    }
}

/// Writes `parts` whole, no more per call than the connection's [`Pace`]
/// suggests, and yields the worker between calls: as the NBD reply writer
/// does (`conn/sock.rs`, where the lab showed why), so that one session's
/// large READ data does not keep another connection's commands, queued on
/// the same worker, waiting until it has all gone. braid's initiator
/// over this target under the lab's `--shaping frames`, 1 MiB reads,
/// alternating runs: at queue depth 1, 1gbit + 100mbit 119-121 -> 127-128
/// MB/s and 2 x 1gbit 189-192 -> 218-224; at 16, 2 x 1gbit 175-207 ->
/// 206-211.
async fn write_all<W: AsyncWrite + Unpin>(
    wr: &mut W,
    parts: &[Bytes],
    pace: &mut Pace,
    queued: &Queued,
    stall: Option<std::time::Duration>,
) -> std::io::Result<()> {
    let parts: Vec<&[u8]> = parts.iter().map(|b| &b[..]).collect();
    let start = std::time::Instant::now();
    let mut at = Progress::new(&parts);
    let mut sent = 0;
    while !at.done(&parts) {
        let slices: Vec<IoSlice<'_>> = at
            .pending_upto(&parts, pace.slice())
            .map(IoSlice::new)
            .collect();
        let n = braid_pool::taken_within(stall, wr.write_vectored(&slices)).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        at.advance(&parts, n);
        queued.took_now();
        sent += n;
        if !at.done(&parts) {
            tokio::task::yield_now().await;
        }
    }
    pace.record(sent, start.elapsed());
    Ok(())
}

/// A PDU as it would be framed, for tests that compare with
/// [`Pdu::encode`].
#[cfg(test)]
fn framed(p: &Out, digests: Digests) -> Vec<u8> {
    let mut heads = BytesMut::new();
    let mut parts = Vec::new();
    frame(p, digests, &mut heads, &mut parts);
    parts.concat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_iscsi::pdu::{Opcode, Pdu};

    #[test]
    fn pieces_on_the_wire_are_what_the_encoder_writes() {
        for len in [0usize, 1, 3, 4, 4097] {
            let mut bhs = Bhs::new(Opcode::DataIn);
            bhs.set_itt(9);
            let data = Bytes::from(vec![0x5a; len]);
            for digests in [
                Digests::default(),
                Digests {
                    header: true,
                    data: true,
                },
            ] {
                let mut want = Vec::new();
                Pdu::new(bhs, data.clone()).encode(digests, &mut want);
                let got = framed(&Out::new(bhs, data.clone(), Sn::Reserved), digests);
                assert_eq!(got, want, "{len} bytes, {digests:?}");
            }
        }
    }

    #[test]
    fn stat_sn_moves_only_with_status() {
        let w = Window::new(5, 4);
        let mut sn = 100;
        let mut b = Bhs::new(Opcode::R2t);
        number(&mut b, Sn::Shows, &mut sn, &w);
        assert_eq!((b.u32_at(24), sn), (100, 100));
        number(&mut b, Sn::Takes, &mut sn, &w);
        assert_eq!((b.u32_at(24), sn), (100, 101));
        assert_eq!((b.u32_at(28), b.u32_at(32)), (5, 8));
    }

    /// Whether a task spawned beside a write of `len` bytes, sliced at
    /// [`braid_pool::MIN_SLICE`], ran before the write ended; and the
    /// bytes that arrived.
    async fn bystander_ran(len: usize) -> (bool, Vec<u8>, Vec<u8>) {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tokio::io::AsyncReadExt;
        let (mut ours, mut theirs) = tokio::net::UnixStream::pair().unwrap();
        let mut pace = Pace::new();
        // 50 MB/s: half a millisecond of it is less than the smallest slice.
        pace.record(1_000_000, std::time::Duration::from_millis(20));
        assert_eq!(pace.slice(), braid_pool::MIN_SLICE);
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let parts = [Bytes::from_static(b"head"), Bytes::from(data.clone())];
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        tokio::spawn(async move { flag.store(true, Ordering::SeqCst) });
        write_all(&mut ours, &parts, &mut pace, &Queued::default(), None)
            .await
            .unwrap();
        let ran = ran.load(Ordering::SeqCst);
        drop(ours);
        let mut got = Vec::new();
        theirs.read_to_end(&mut got).await.unwrap();
        let mut want = b"head".to_vec();
        want.extend_from_slice(&data);
        (ran, got, want)
    }

    #[test]
    fn data_sent_in_several_slices_lets_other_tasks_run_between_them() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // Two slices and a few bytes: fits the socket's buffer, so
            // nothing in the write waits.
            let (ran, got, want) = bystander_ran(2 * braid_pool::MIN_SLICE).await;
            assert!(ran, "another task on the worker waited for the whole write");
            assert!(got == want, "the bytes arrived changed");
        });
    }
}
