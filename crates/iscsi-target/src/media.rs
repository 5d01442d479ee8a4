//! The SCSI commands that touch the medium, carried out on the export's
//! backend: READ, WRITE, SYNCHRONIZE CACHE, WRITE SAME, UNMAP, GET LBA
//! STATUS, COMPARE AND WRITE, VERIFY and WRITE AND VERIFY. With the write
//! cache off (the default, see `cache.rs`) everything that changes the
//! medium (writes, WRITE SAME, UNMAP) is on stable storage before GOOD.
//! Every write holds its range in the export's range lock beside NBD's
//! writers; COMPARE AND WRITE holds it alone, so nothing lands between its
//! compare and its write.

use std::sync::Arc;

use braid_block::{Error, Flags, Op};
use braid_iscsi::scsi::cdb::unmap_ranges;
use braid_iscsi::scsi::respond::{self, Unit};
use braid_iscsi::scsi::{check_range, Command, Sense};
use braid_store::exec::{self, run_on_its_thread as call, Data, Job};

use super::unit::{backend, transfer_len, Outcome, BLOCK};
use crate::backend::{Backend, Extent};
use crate::export::Export;

/// The one place a block error becomes SCSI sense: whatever its kind, a
/// medium error in the direction the command moved data (what initiators
/// have always been told here); the words go to the log.
fn sense(e: &Error, write: bool) -> Sense {
    tracing::debug!(kind = %e.kind, "iSCSI command failed: {}", e.message);
    if write {
        Sense::WRITE_ERROR
    } else {
        Sense::READ_ERROR
    }
}

/// A compound command's storage error (`what` at `offset`) as its sense.
fn failed(what: &'static str, offset: u64, write: bool) -> impl Fn(std::io::Error) -> Sense {
    move |e| sense(&exec::error(what, offset, &e), write)
}

/// A job whose writes are on stable storage before it ends when `durable`.
fn job(op: Op, offset: u64, len: u64, durable: bool) -> Job {
    let job = Job::new(op, offset, len);
    if durable {
        job.with(Flags::FUA)
    } else {
        job
    }
}

fn bytes(blocks: impl Into<u64>) -> u64 {
    blocks.into() * u64::from(BLOCK)
}

/// Carries out a command on the medium (`super::unit::execute` checked
/// the unit has one, and that writes are allowed).
pub async fn execute(
    export: &Arc<Export>,
    unit: &Unit,
    write_cache: bool,
    cmd: Command,
    data: Option<Vec<u8>>,
) -> Outcome {
    let Some(b) = backend(export) else {
        return Outcome::Check(Sense::INVALID_OPCODE);
    };
    let e = export.clone();
    match cmd {
        Command::Read { lba, blocks, .. } => match transfer_len(unit, lba, blocks) {
            Err(s) => Outcome::Check(s),
            Ok(len) => {
                let offset = bytes(lba);
                let r = call(b, move |b| {
                    let mut buf = vec![0u8; len as usize];
                    let read = Job::new(Op::Read, offset, u64::from(len));
                    exec::run(&e, b, read, Data::Read(&mut buf)).map(|_| buf)
                })
                .await;
                match r {
                    Ok(buf) => Outcome::Good(buf),
                    Err(e) => Outcome::Check(sense(&e, false)),
                }
            }
        },
        Command::Write { lba, blocks, fua } => {
            let fua = fua || !write_cache;
            let data = data.unwrap_or_default();
            match transfer_len(unit, lba, blocks) {
                Err(s) => Outcome::Check(s),
                Ok(len) if len as usize != data.len() => {
                    Outcome::Check(Sense::INVALID_FIELD_IN_CDB)
                }
                Ok(_) => {
                    let offset = bytes(lba);
                    let r = call(b, move |b| {
                        let write = job(Op::Write, offset, data.len() as u64, fua);
                        exec::run(&e, b, write, Data::Write(&data))
                    })
                    .await;
                    match r {
                        Ok(_) => Outcome::Good(Vec::new()),
                        Err(e) => Outcome::Check(sense(&e, true)),
                    }
                }
            }
        }
        Command::SynchronizeCache { .. } => {
            let flush = Job::new(Op::Flush, 0, 0);
            match call(b, move |b| exec::run(&e, b, flush, Data::None)).await {
                Ok(_) => Outcome::Good(Vec::new()),
                Err(e) => Outcome::Check(sense(&e, true)),
            }
        }
        Command::WriteSame {
            lba,
            blocks,
            unmap,
            no_data,
        } => {
            let same = Same {
                unmap,
                no_data,
                durable: !write_cache,
            };
            write_same(b, e, unit, lba, blocks, same, data).await
        }
        Command::Unmap { .. } => {
            let ranges = match unmap_ranges(&data.unwrap_or_default(), 256) {
                Ok(r) => r,
                Err(s) => return Outcome::Check(s),
            };
            for r in &ranges {
                if let Err(s) = check_range(r.lba, r.blocks, unit.blocks) {
                    return Outcome::Check(s);
                }
                if r.blocks > unit.max_transfer_blocks {
                    return Outcome::Check(Sense::INVALID_FIELD_IN_CDB);
                }
            }
            // Write-through: the holes are made stable once, after all.
            let durable = !write_cache;
            let done = call(b, move |b| {
                for r in &ranges {
                    let trim = Job::new(Op::Trim, bytes(r.lba), bytes(r.blocks));
                    exec::run(&e, b, trim, Data::None)?;
                }
                if durable {
                    exec::run(&e, b, Job::new(Op::Flush, 0, 0), Data::None)?;
                }
                Ok::<_, Error>(())
            })
            .await;
            match done {
                Ok(()) => Outcome::Good(Vec::new()),
                Err(e) => Outcome::Check(sense(&e, true)),
            }
        }
        Command::GetLbaStatus { lba, alloc } => lba_status(b, e, unit, lba, alloc).await,
        Command::CompareAndWrite { lba, blocks, fua } => {
            let fua = fua || !write_cache;
            compare_and_write(e, unit, lba, blocks, fua, data.unwrap_or_default()).await
        }
        Command::Verify {
            lba,
            blocks,
            bytchk,
        } => verify(b, e, unit, lba, blocks, bytchk, data).await,
        Command::OrWrite { lba, blocks, fua } => {
            let fua = fua || !write_cache;
            or_write(e, unit, lba, blocks, fua, data.unwrap_or_default()).await
        }
        // There is no cache of braid's own to fetch into: nothing to do
        // but check the range (GOOD, not CONDITION MET, says so).
        Command::Prefetch { lba, blocks } => match check_range(lba, blocks, unit.blocks) {
            Ok(()) => Outcome::Good(Vec::new()),
            Err(s) => Outcome::Check(s),
        },
        Command::WriteAndVerify { lba, blocks } => {
            write_and_verify(b, e, unit, lba, blocks, data.unwrap_or_default()).await
        }
        _ => Outcome::Check(Sense::INVALID_OPCODE),
    }
}

/// How a WRITE SAME writes: unmapping (UNMAP bit), zeroes without data
/// (NDOB), and on stable storage before GOOD (the write cache is off).
struct Same {
    unmap: bool,
    no_data: bool,
    durable: bool,
}

async fn write_same(
    b: Arc<dyn Backend>,
    e: Arc<Export>,
    unit: &Unit,
    lba: u64,
    blocks: u32,
    same: Same,
    data: Option<Vec<u8>>,
) -> Outcome {
    let Same {
        unmap,
        no_data,
        durable,
    } = same;
    // 0 blocks: to the end of the medium (the block limits page says
    // WSNZ 0), within the same bound as any other count.
    let blocks = match blocks {
        0 if lba >= unit.blocks => return Outcome::Check(Sense::LBA_OUT_OF_RANGE),
        0 => u32::try_from(unit.blocks - lba).unwrap_or(u32::MAX),
        n => n,
    };
    if blocks == 0 || blocks > unit.max_transfer_blocks {
        return Outcome::Check(Sense::INVALID_FIELD_IN_CDB);
    }
    if let Err(s) = check_range(lba, blocks, unit.blocks) {
        return Outcome::Check(s);
    }
    let block = if no_data {
        vec![0u8; BLOCK as usize]
    } else {
        data.unwrap_or_default()
    };
    if block.len() != BLOCK as usize {
        return Outcome::Check(Sense::PARAMETER_LIST_LENGTH);
    }
    let (offset, len) = (bytes(lba), bytes(blocks));
    // With UNMAP on a unit that unmaps, the blocks are unmapped whatever
    // the data (they then read as zeroes, LBPRZ), as the unmap request is
    // what the initiator asked for; otherwise the data is written.
    let trim = unmap && unit.thin;
    let zero = trim || block.iter().all(|&b| b == 0);
    let r = call(b, move |b| {
        if zero {
            let mut zeroes = job(Op::WriteZeroes, offset, len, durable);
            if !trim {
                zeroes = zeroes.with(Flags::NO_HOLE);
            }
            exec::run(&e, b, zeroes, Data::None)
        } else {
            let mut buf = Vec::with_capacity(len as usize);
            for _ in 0..blocks {
                buf.extend_from_slice(&block);
            }
            exec::run(
                &e,
                b,
                job(Op::Write, offset, len, durable),
                Data::Write(&buf),
            )
        }
    })
    .await;
    match r {
        Ok(_) => Outcome::Good(Vec::new()),
        Err(e) => Outcome::Check(sense(&e, true)),
    }
}

async fn lba_status(
    b: Arc<dyn Backend>,
    e: Arc<Export>,
    unit: &Unit,
    lba: u64,
    alloc: u32,
) -> Outcome {
    if lba >= unit.blocks {
        return Outcome::Check(Sense::LBA_OUT_OF_RANGE);
    }
    let offset = bytes(lba);
    // One answer covers at most 1 GiB; initiators ask again from where it
    // ends.
    let span = bytes((unit.blocks - lba).min(1 << 21));
    let status = Job::new(Op::BlockStatus, offset, span);
    match call(b, move |b| exec::run(&e, b, status, Data::None)).await {
        Ok(mut extents) => {
            if extents.is_empty() {
                // Storage that cannot tell holes from data: all mapped.
                extents.push(Extent {
                    len: span,
                    flags: 0,
                });
            }
            let mut runs = Vec::new();
            let mut at = offset;
            let end = offset + span;
            for e in extents {
                if at >= end {
                    break;
                }
                let len = e.len.min(end - at);
                let blocks = u32::try_from(len / u64::from(BLOCK)).unwrap_or(u32::MAX);
                if blocks == 0 {
                    break;
                }
                let hole = e.flags & braid_proto::wire::state::HOLE != 0;
                runs.push((at / u64::from(BLOCK), blocks, hole));
                at += bytes(blocks);
            }
            Outcome::Good(respond::lba_status(&runs, alloc))
        }
        Err(e) => Outcome::Check(sense(&e, false)),
    }
}

/// ORWRITE (SBC-4 5.12): with the range held alone, the blocks are read,
/// ORed with the data sent and written back, so no other write lands in
/// between.
async fn or_write(
    e: Arc<Export>,
    unit: &Unit,
    lba: u64,
    blocks: u32,
    fua: bool,
    data: Vec<u8>,
) -> Outcome {
    if e.peers.is_some() {
        // As for COMPARE AND WRITE: other gateways' writes are not held
        // off by this lock.
        return Outcome::Check(Sense::INVALID_OPCODE);
    }
    match transfer_len(unit, lba, blocks) {
        Err(s) => return Outcome::Check(s),
        Ok(len) if len as usize != data.len() => {
            return Outcome::Check(Sense::INVALID_FIELD_IN_CDB)
        }
        Ok(0) => return Outcome::Good(Vec::new()),
        Ok(_) => {}
    }
    let offset = bytes(lba);
    let r = tokio::task::spawn_blocking(move || {
        let Some(b) = backend(&e) else {
            return Err(Sense::WRITE_ERROR);
        };
        let _range = e.writes.exclusive(offset, data.len() as u64);
        let mut now = vec![0u8; data.len()];
        b.read_at(&mut now, offset)
            .map_err(failed("read", offset, false))?;
        for (n, d) in now.iter_mut().zip(&data) {
            *n |= d;
        }
        b.write_at(&now, offset, fua)
            .map_err(failed("write", offset, true))
    })
    .await
    .expect("ORWRITE panicked");
    match r {
        Ok(()) => Outcome::Good(Vec::new()),
        Err(s) => Outcome::Check(s),
    }
}

/// What a compare found.
enum Compared {
    Written,
    /// The first byte of the compare data that differed.
    Differs(u32),
}

/// COMPARE AND WRITE (SBC-4 5.3): `data` holds the blocks to compare,
/// then the blocks to write. With the range held alone, the medium is
/// read and compared, and written only if every byte matched; otherwise
/// MISCOMPARE, with the offset of the first byte that differed.
async fn compare_and_write(
    e: Arc<Export>,
    unit: &Unit,
    lba: u64,
    blocks: u32,
    fua: bool,
    data: Vec<u8>,
) -> Outcome {
    if e.peers.is_some() {
        // Other gateways write the same image, and this lock does not
        // reach them: a COMPARE AND WRITE here could not be atomic.
        return Outcome::Check(Sense::INVALID_OPCODE);
    }
    if let Err(s) = check_range(lba, blocks, unit.blocks) {
        return Outcome::Check(s);
    }
    let n = bytes(blocks) as usize;
    if data.len() != 2 * n {
        return Outcome::Check(Sense::INVALID_FIELD_IN_CDB);
    }
    if blocks == 0 {
        return Outcome::Good(Vec::new());
    }
    let offset = bytes(lba);
    // Always on a blocking thread: the section waits for writers of the
    // range to finish, and nothing async may wait on it meanwhile.
    let r = tokio::task::spawn_blocking(move || {
        let Some(b) = backend(&e) else {
            return Err(std::io::ErrorKind::NotFound.into());
        };
        let range = e.writes.exclusive(offset, n as u64);
        let mut now = vec![0u8; n];
        b.read_at(&mut now, offset)?;
        if let Some(at) = now.iter().zip(&data[..n]).position(|(a, b)| a != b) {
            return Ok(Compared::Differs(at as u32));
        }
        range.checkpoint();
        b.write_at(&data[n..], offset, fua)?;
        Ok::<_, std::io::Error>(Compared::Written)
    })
    .await
    .expect("COMPARE AND WRITE panicked");
    match r {
        Ok(Compared::Written) => Outcome::Good(Vec::new()),
        Ok(Compared::Differs(at)) => Outcome::Check(Sense::MISCOMPARE.with_information(at)),
        Err(e) => Outcome::Check(failed("compare and write", offset, true)(e)),
    }
}

/// The first byte of `medium` that differs from what the initiator sent
/// (`sent` is either as long as `medium`, or one block compared with each
/// of its blocks).
fn first_difference(medium: &[u8], sent: &[u8]) -> Option<usize> {
    if sent.is_empty() {
        return None;
    }
    medium
        .iter()
        .zip(sent.iter().cycle())
        .position(|(m, s)| m != s)
}

/// VERIFY (SBC-4 5.31): the blocks are read (a medium error shows), and
/// with BYTCHK compared with the data sent; MISCOMPARE names the first
/// byte that differed.
async fn verify(
    b: Arc<dyn Backend>,
    e: Arc<Export>,
    unit: &Unit,
    lba: u64,
    blocks: u32,
    bytchk: u8,
    data: Option<Vec<u8>>,
) -> Outcome {
    let len = match transfer_len(unit, lba, blocks) {
        Ok(len) => len as usize,
        Err(s) => return Outcome::Check(s),
    };
    let sent = data.unwrap_or_default();
    let expected = match bytchk {
        0 => 0,
        1 => len,
        _ => BLOCK as usize,
    };
    if sent.len() != expected {
        return Outcome::Check(Sense::INVALID_FIELD_IN_CDB);
    }
    if len == 0 {
        return Outcome::Good(Vec::new());
    }
    let offset = bytes(lba);
    let r = call(b, move |b| {
        let mut now = vec![0u8; len];
        let read = Job::new(Op::Read, offset, len as u64);
        exec::run(&e, b, read, Data::Read(&mut now)).map(|_| first_difference(&now, &sent))
    })
    .await;
    match r {
        Ok(None) => Outcome::Good(Vec::new()),
        Ok(Some(at)) => Outcome::Check(Sense::MISCOMPARE.with_information(at as u32)),
        Err(e) => Outcome::Check(sense(&e, false)),
    }
}

/// WRITE AND VERIFY (SBC-4 5.44): written through to the medium, read back
/// and compared.
async fn write_and_verify(
    b: Arc<dyn Backend>,
    e: Arc<Export>,
    unit: &Unit,
    lba: u64,
    blocks: u32,
    data: Vec<u8>,
) -> Outcome {
    match transfer_len(unit, lba, blocks) {
        Err(s) => return Outcome::Check(s),
        Ok(len) if len as usize != data.len() => {
            return Outcome::Check(Sense::INVALID_FIELD_IN_CDB)
        }
        Ok(_) => {}
    }
    let offset = bytes(lba);
    let r = call(b, move |b| {
        let _range = e.writes.shared(offset, data.len() as u64);
        b.write_at(&data, offset, true)
            .map_err(failed("write", offset, true))?;
        let mut back = vec![0u8; data.len()];
        b.read_at(&mut back, offset)
            .map_err(failed("read", offset, false))?;
        Ok::<_, Sense>(first_difference(&back, &data))
    })
    .await;
    match r {
        Ok(None) => Outcome::Good(Vec::new()),
        Ok(Some(at)) => Outcome::Check(Sense::MISCOMPARE.with_information(at as u32)),
        Err(s) => Outcome::Check(s),
    }
}
