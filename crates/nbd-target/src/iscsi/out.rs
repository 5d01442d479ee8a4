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

use std::io::IoSlice;
use std::sync::{Arc, Mutex};

use braid_iscsi::pdu::{padded, Bhs};
use braid_iscsi::window::Window;
use braid_iscsi::{digest, Digests};
use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

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

/// PDUs sent together, in order (a READ's Data-In, say), and what their
/// data holds of the connection's read budget until it is on the wire.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub pdus: Vec<Out>,
    pub permit: Option<OwnedSemaphorePermit>,
}

/// The command window, shared by the reader (which takes commands), the
/// tasks (which finish them) and the writer (which states it).
pub(crate) type SharedWindow = Arc<Mutex<Window>>;

pub(crate) fn lock(w: &SharedWindow) -> std::sync::MutexGuard<'_, Window> {
    w.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where everything a connection sends is queued.
#[derive(Clone, Debug)]
pub(crate) struct Outbox {
    tx: mpsc::UnboundedSender<Batch>,
}

impl Outbox {
    /// Queues `batch`; a connection already closed drops it.
    pub fn send(&self, batch: Batch) {
        let _ = self.tx.send(batch);
    }

    /// Queues one PDU.
    pub fn pdu(&self, bhs: Bhs, data: Bytes, sn: Sn) {
        self.send(Batch {
            pdus: vec![Out::new(bhs, data, sn)],
            permit: None,
        });
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
) -> (Outbox, tokio::task::JoinHandle<std::io::Result<()>>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Batch>();
    let task = tokio::spawn(async move {
        let mut stat_sn = stat_sn;
        let mut heads = BytesMut::new();
        while let Some(first) = rx.recv().await {
            let mut batches = vec![first];
            let mut size: usize = batches[0].pdus.iter().map(|p| p.data.len()).sum();
            while size < MAX_GATHER {
                let Ok(b) = rx.try_recv() else { break };
                size += b.pdus.iter().map(|p| p.data.len()).sum::<usize>();
                batches.push(b);
            }
            let mut parts: Vec<Bytes> = Vec::new();
            {
                let w = lock(&window);
                for b in &mut batches {
                    for p in &mut b.pdus {
                        number(&mut p.bhs, p.sn, &mut stat_sn, &w);
                        frame(p, digests, &mut heads, &mut parts);
                    }
                }
            }
            write_all(&mut wr, &parts).await?;
            // Read budget goes back only now that its data is on its way.
            for b in batches {
                drop(b.permit);
            }
        }
        wr.shutdown().await
    });
    (Outbox { tx }, task)
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

async fn write_all(wr: &mut OwnedWriteHalf, parts: &[Bytes]) -> std::io::Result<()> {
    let mut at = 0;
    let mut offset = 0;
    while at < parts.len() {
        let slices: Vec<IoSlice<'_>> = std::iter::once(&parts[at][offset..])
            .chain(parts[at + 1..].iter().map(|b| &b[..]))
            .take(64)
            .map(IoSlice::new)
            .collect();
        let mut n = wr.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let left = parts[at].len() - offset;
            if n >= left {
                n -= left;
                at += 1;
                offset = 0;
            } else {
                offset += n;
                n = 0;
            }
        }
    }
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
}
