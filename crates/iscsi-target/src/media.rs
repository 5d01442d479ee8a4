//! The SCSI commands that touch the medium, carried out through the
//! store's executor on whatever storage the export has: READ, WRITE,
//! SYNCHRONIZE CACHE, WRITE SAME, UNMAP, GET LBA STATUS, COMPARE AND
//! WRITE, ORWRITE, VERIFY and WRITE AND VERIFY. With the write cache off
//! (the default, see `cache.rs`) everything that changes the medium
//! (writes, WRITE SAME, UNMAP) is on stable storage before GOOD. Every
//! write holds its range in the export's range lock beside NBD's writers;
//! COMPARE AND WRITE and ORWRITE hold it alone (the executor's
//! read-modify-write), so nothing lands between their read and their
//! write.

use std::sync::Arc;

use braid_block::{Error, Flags, Op};
use braid_iscsi::scsi::cdb::unmap_ranges;
use braid_iscsi::scsi::respond::{self, Unit};
use braid_iscsi::scsi::{check_range, Command, Sense};
use braid_store::compound::{self, Change};
use braid_store::exec::{self, Job};
use bytes::Bytes;

use super::unit::{failed, failed_at, transfer_len, Outcome, BLOCK};
use crate::backend::Extent;
use crate::export::Export;

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

/// Runs `job` through the executor; GOOD with no data, or the answer to
/// its error (`write`: the command changes the medium).
async fn submit(e: &Arc<Export>, job: Job, payload: Option<Bytes>, write: bool) -> Outcome {
    let (offset, len) = (job.offset, job.len);
    match exec::submit(e, job, payload).await {
        Ok(_) => Outcome::Good(Vec::new()),
        Err(err) => failed_at(&err, e, offset, len, write),
    }
}

/// A READ's data, in one buffer (a backend of this host's already is).
async fn read(e: &Arc<Export>, offset: u64, len: u64) -> Result<Vec<u8>, Error> {
    let done = exec::submit(e, Job::new(Op::Read, offset, len), None).await?;
    let mut pieces = done.data.into_iter();
    match (pieces.next(), pieces.len()) {
        (None, _) => Ok(Vec::new()),
        (Some((_, one)), 0) => Ok(Vec::from(one)),
        (Some((_, first)), _) => {
            let mut all = Vec::with_capacity(len as usize);
            all.extend_from_slice(&first);
            for (_, piece) in pieces {
                all.extend_from_slice(&piece);
            }
            Ok(all)
        }
    }
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
    let e = export.clone();
    match cmd {
        Command::Read { lba, blocks, .. } => match transfer_len(unit, lba, blocks) {
            Err(s) => Outcome::Check(s),
            Ok(len) => match read(&e, bytes(lba), u64::from(len)).await {
                Ok(buf) => Outcome::Good(buf),
                Err(e) => failed(&e, false),
            },
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
                    let write = job(Op::Write, bytes(lba), data.len() as u64, fua);
                    submit(&e, write, Some(Bytes::from(data)), true).await
                }
            }
        }
        Command::SynchronizeCache { .. } => submit(&e, Job::new(Op::Flush, 0, 0), None, true).await,
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
            write_same(e, unit, lba, blocks, same, data).await
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
            for r in &ranges {
                let trim = Job::new(Op::Trim, bytes(r.lba), bytes(r.blocks));
                match submit(&e, trim, None, true).await {
                    Outcome::Good(_) => {}
                    failed => return failed,
                }
            }
            if write_cache {
                return Outcome::Good(Vec::new());
            }
            submit(&e, Job::new(Op::Flush, 0, 0), None, true).await
        }
        Command::GetLbaStatus { lba, alloc } => lba_status(e, unit, lba, alloc).await,
        Command::CompareAndWrite { lba, blocks, fua } => {
            let fua = fua || !write_cache;
            compare_and_write(e, unit, lba, blocks, fua, data.unwrap_or_default()).await
        }
        Command::Verify {
            lba,
            blocks,
            bytchk,
        } => verify(e, unit, lba, blocks, bytchk, data).await,
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
            write_and_verify(e, unit, lba, blocks, data.unwrap_or_default()).await
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
    if zero {
        let mut zeroes = job(Op::WriteZeroes, offset, len, durable);
        if !trim {
            zeroes = zeroes.with(Flags::NO_HOLE);
        }
        return submit(&e, zeroes, None, true).await;
    }
    let mut buf = Vec::with_capacity(len as usize);
    for _ in 0..blocks {
        buf.extend_from_slice(&block);
    }
    let write = job(Op::Write, offset, len, durable);
    submit(&e, write, Some(Bytes::from(buf)), true).await
}

async fn lba_status(e: Arc<Export>, unit: &Unit, lba: u64, alloc: u32) -> Outcome {
    if lba >= unit.blocks {
        return Outcome::Check(Sense::LBA_OUT_OF_RANGE);
    }
    let offset = bytes(lba);
    // One answer covers at most 1 GiB; initiators ask again from where it
    // ends.
    let span = bytes((unit.blocks - lba).min(1 << 21));
    let status = Job::new(Op::BlockStatus, offset, span);
    match exec::submit(&e, status, None).await {
        Ok(done) => {
            let mut extents = done.extents;
            if extents.is_empty() {
                // Storage that cannot tell holes from data: all mapped.
                extents.push(Extent::data(span));
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
                let hole = e.hole;
                runs.push((at / u64::from(BLOCK), blocks, hole));
                at += bytes(blocks);
            }
            Outcome::Good(respond::lba_status(&runs, alloc))
        }
        Err(e) => failed(&e, false),
    }
}

/// ORWRITE (SBC-4 5.12): the executor reads the blocks with the range
/// held alone, ORs the data sent into them and writes them back, so no
/// other write lands in between.
async fn or_write(
    e: Arc<Export>,
    unit: &Unit,
    lba: u64,
    blocks: u32,
    fua: bool,
    data: Vec<u8>,
) -> Outcome {
    if !compound::atomic(&e) {
        // As for COMPARE AND WRITE: other writers are not held off by
        // this lock.
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
    let len = data.len();
    let or = move |now: &mut [u8]| {
        for (n, d) in now.iter_mut().zip(&data) {
            *n |= d;
        }
        Change::Write(())
    };
    match compound::read_modify_write(&e, bytes(lba), len, fua, or).await {
        Ok(()) => Outcome::Good(Vec::new()),
        Err(err) => failed(&err, true),
    }
}

/// COMPARE AND WRITE (SBC-4 5.3): `data` holds the blocks to compare,
/// then the blocks to write. Written only if every byte matched,
/// otherwise MISCOMPARE, with the offset of the first byte that differed.
/// The executor makes it atomic: with the range held alone where every
/// writer comes through this server, or as the storage's own operation
/// where other gateways write it too (a Ceph image, librbd's
/// compare-and-write).
async fn compare_and_write(
    e: Arc<Export>,
    unit: &Unit,
    lba: u64,
    blocks: u32,
    fua: bool,
    mut data: Vec<u8>,
) -> Outcome {
    if !compound::compares_and_writes(&e) {
        // Other servers write the storage, and neither this lock nor
        // the storage can hold them off between the compare and the
        // write: a COMPARE AND WRITE here could not be atomic.
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
    let write = data.split_off(n);
    match compound::compare_and_write(&e, bytes(lba), data, write, fua).await {
        Ok(None) => Outcome::Good(Vec::new()),
        Ok(Some(at)) => Outcome::Check(
            Sense::MISCOMPARE.with_information(u32::try_from(at).unwrap_or(u32::MAX)),
        ),
        Err(err) => failed(&err, true),
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
    let r = read(&e, bytes(lba), len as u64).await;
    match r.map(|now| first_difference(&now, &sent)) {
        Ok(None) => Outcome::Good(Vec::new()),
        Ok(Some(at)) => Outcome::Check(Sense::MISCOMPARE.with_information(at as u32)),
        Err(e) => failed(&e, false),
    }
}

/// WRITE AND VERIFY (SBC-4 5.44): written through to the medium, read back
/// and compared, by the executor.
async fn write_and_verify(
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
    match compound::write_and_verify(&e, bytes(lba), Bytes::from(data)).await {
        Ok(None) => Outcome::Good(Vec::new()),
        Ok(Some(at)) => Outcome::Check(Sense::MISCOMPARE.with_information(at as u32)),
        Err(err) => failed(&err, true),
    }
}
