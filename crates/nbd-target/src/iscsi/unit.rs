//! SCSI commands carried out on an export's backend: the LUN behind an
//! iSCSI target.

use std::sync::Arc;

use braid_iscsi::scsi::cdb::unmap_ranges;
use braid_iscsi::scsi::respond::{self, Unit};
use braid_iscsi::scsi::{alua, check_range, Command, PortGroup, Sense};

use crate::backend::Backend;
use crate::export::{Export, Storage};

/// Logical block size every LUN is offered with.
pub const BLOCK: u32 = 512;

/// Most bytes one READ or WRITE may move: bounds what one command can pin.
pub const MAX_TRANSFER: u32 = 8 << 20;

/// What a command answers.
#[derive(Debug)]
pub enum Outcome {
    /// GOOD, with data for the initiator (possibly none).
    Good(Vec<u8>),
    /// CHECK CONDITION with this sense.
    Check(Sense),
}

/// The unit as SCSI describes it through the portal with tag `tag`, of
/// the target named `target`.
pub fn describe(export: &Export, target: &str, tag: u16) -> Unit {
    let (thin, rotational) = match &export.storage {
        Storage::Local(b) => {
            let c = b.caps();
            // UNMAP punches holes, which read back as zeroes; without
            // allocation status GET LBA STATUS could not answer.
            (c.trim && c.extents, c.rotational)
        }
        Storage::Forwarded(_) => (false, false),
    };
    Unit {
        blocks: export.size() / u64::from(BLOCK),
        block_size: BLOCK,
        uuid: *export.volume.as_bytes(),
        read_only: export.read_only,
        thin,
        zeroes_after_unmap: thin,
        rotational,
        max_transfer_blocks: MAX_TRANSFER / BLOCK,
        relative_port: tag,
        port_group: tag,
        target_port: format!("{target},t,0x{tag:04x}"),
    }
}

fn backend(export: &Export) -> Option<Arc<dyn Backend>> {
    match &export.storage {
        Storage::Local(b) => Some(b.clone()),
        Storage::Forwarded(_) => None,
    }
}

/// Runs a blocking backend call off the async threads when it may block.
async fn call<T: Send + 'static>(
    b: Arc<dyn Backend>,
    f: impl FnOnce(&dyn Backend) -> T + Send + 'static,
) -> T {
    if b.blocking() {
        tokio::task::spawn_blocking(move || f(b.as_ref()))
            .await
            .expect("backend call panicked")
    } else {
        f(b.as_ref())
    }
}

/// Bytes a READ or WRITE moves, checked against the unit and the limit.
///
/// # Errors
///
/// The sense to answer.
pub fn transfer_len(unit: &Unit, lba: u64, blocks: u32) -> Result<u32, Sense> {
    check_range(lba, blocks, unit.blocks)?;
    let bytes = u64::from(blocks) * u64::from(BLOCK);
    u32::try_from(bytes)
        .ok()
        .filter(|b| *b <= MAX_TRANSFER)
        .ok_or(Sense::INVALID_FIELD_IN_CDB)
}

/// A command sent to a LUN other than 0, where no unit is: REPORT LUNS
/// and INQUIRY answer (peripheral qualifier 3: no unit here), the rest
/// is LOGICAL UNIT NOT SUPPORTED.
pub fn answer_other_lun(unit: &Unit, cmd: Command) -> Outcome {
    match cmd {
        Command::ReportLuns { alloc } => Outcome::Good(respond::report_luns(&[0], alloc)),
        Command::Inquiry { vpd: None, alloc } => {
            let mut d = unit.inquiry(None, alloc).unwrap_or_default();
            if let Some(b) = d.first_mut() {
                *b = 0x7f;
            }
            Outcome::Good(d)
        }
        _ => Outcome::Check(Sense::LUN_NOT_SUPPORTED),
    }
}

/// Carries out `cmd` on LUN 0; `data` is a WRITE's data, gathered;
/// `groups` the target port groups as they stand.
pub async fn execute(
    export: &Export,
    unit: &Unit,
    cmd: Command,
    data: Option<Vec<u8>>,
    groups: impl FnOnce() -> Vec<PortGroup>,
) -> Outcome {
    let Some(b) = backend(export) else {
        return Outcome::Check(Sense::new(braid_iscsi::scsi::Key::NotReady, 0x04, 0x00));
    };
    match cmd {
        Command::TestUnitReady => Outcome::Good(Vec::new()),
        Command::Inquiry { vpd, alloc } => result(unit.inquiry(vpd, alloc)),
        Command::RequestSense { alloc } => Outcome::Good(respond::request_sense(None, alloc)),
        Command::ReadCapacity10 => Outcome::Good(unit.read_capacity10()),
        Command::ReadCapacity16 { alloc } => Outcome::Good(unit.read_capacity16(alloc)),
        Command::ModeSense {
            page,
            subpage,
            control,
            no_block_descriptors,
            alloc,
            ten,
        } => result(unit.mode_sense(page, subpage, control, no_block_descriptors, ten, alloc)),
        Command::Read { lba, blocks, .. } => match transfer_len(unit, lba, blocks) {
            Err(s) => Outcome::Check(s),
            Ok(len) => {
                let offset = lba * u64::from(BLOCK);
                let r = call(b, move |b| {
                    let mut buf = vec![0u8; len as usize];
                    b.read_at(&mut buf, offset).map(|()| buf)
                })
                .await;
                match r {
                    Ok(buf) => Outcome::Good(buf),
                    Err(_) => Outcome::Check(Sense::READ_ERROR),
                }
            }
        },
        Command::Write { lba, blocks, fua } => {
            if unit.read_only {
                return Outcome::Check(Sense::WRITE_PROTECTED);
            }
            let data = data.unwrap_or_default();
            match transfer_len(unit, lba, blocks) {
                Err(s) => Outcome::Check(s),
                Ok(len) if len as usize != data.len() => {
                    Outcome::Check(Sense::INVALID_FIELD_IN_CDB)
                }
                Ok(_) => {
                    let offset = lba * u64::from(BLOCK);
                    match call(b, move |b| b.write_at(&data, offset, fua)).await {
                        Ok(()) => Outcome::Good(Vec::new()),
                        Err(_) => Outcome::Check(Sense::WRITE_ERROR),
                    }
                }
            }
        }
        Command::SynchronizeCache { .. } => match call(b, |b| b.flush()).await {
            Ok(()) => Outcome::Good(Vec::new()),
            Err(_) => Outcome::Check(Sense::WRITE_ERROR),
        },
        Command::WriteSame { .. } | Command::Unmap { .. } if unit.read_only => {
            Outcome::Check(Sense::WRITE_PROTECTED)
        }
        Command::WriteSame {
            lba,
            blocks,
            unmap,
            no_data,
        } => {
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
            let offset = lba * u64::from(BLOCK);
            let len = u64::from(blocks) * u64::from(BLOCK);
            let zero = block.iter().all(|&b| b == 0);
            let trim = unmap && unit.thin;
            let r = call(b, move |b| {
                if zero {
                    b.zero(offset, len, trim, false, false).map_err(|_| ())
                } else {
                    let mut buf = Vec::with_capacity(len as usize);
                    for _ in 0..blocks {
                        buf.extend_from_slice(&block);
                    }
                    b.write_at(&buf, offset, false).map_err(|_| ())
                }
            })
            .await;
            match r {
                Ok(()) => Outcome::Good(Vec::new()),
                Err(()) => Outcome::Check(Sense::WRITE_ERROR),
            }
        }
        Command::Unmap { .. } | Command::GetLbaStatus { .. } if !unit.thin => {
            Outcome::Check(Sense::INVALID_OPCODE)
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
            let done = call(b, move |b| {
                ranges.iter().try_for_each(|r| {
                    b.trim(
                        r.lba * u64::from(BLOCK),
                        u64::from(r.blocks) * u64::from(BLOCK),
                        false,
                    )
                })
            })
            .await;
            match done {
                Ok(()) => Outcome::Good(Vec::new()),
                Err(_) => Outcome::Check(Sense::WRITE_ERROR),
            }
        }
        Command::GetLbaStatus { lba, alloc } => {
            if lba >= unit.blocks {
                return Outcome::Check(Sense::LBA_OUT_OF_RANGE);
            }
            let offset = lba * u64::from(BLOCK);
            // One answer covers at most 1 GiB; initiators ask again from
            // where it ends.
            let span = (unit.blocks - lba).min(1 << 21) * u64::from(BLOCK);
            match call(b, move |b| b.extents(offset, span)).await {
                Ok(extents) => {
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
                        at += u64::from(blocks) * u64::from(BLOCK);
                    }
                    Outcome::Good(respond::lba_status(&runs, alloc))
                }
                Err(_) => Outcome::Check(Sense::READ_ERROR),
            }
        }
        Command::ReportTargetPortGroups { extended, alloc } => {
            Outcome::Good(alua::report_target_port_groups(&groups(), extended, alloc))
        }
        Command::ReportLuns { alloc } => Outcome::Good(respond::report_luns(&[0], alloc)),
        Command::Unsupported { .. } => Outcome::Check(Sense::INVALID_OPCODE),
    }
}

fn result(r: Result<Vec<u8>, Sense>) -> Outcome {
    match r {
        Ok(d) => Outcome::Good(d),
        Err(s) => Outcome::Check(s),
    }
}
