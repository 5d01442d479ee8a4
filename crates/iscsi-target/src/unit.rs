//! The LUN behind an iSCSI target: how SCSI describes the export, and
//! which commands it answers (those that touch the medium are in
//! [`super::media`]).

use std::sync::Arc;

use braid_iscsi::scsi::respond::{self, Unit};
use braid_iscsi::scsi::{alua, check_range, opcodes, Command, PortGroup, Sense};

use braid_block::Error;

use super::media;

use crate::export::Export;

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
    /// RESERVATION CONFLICT: another nexus holds a reservation this
    /// command may not pass.
    Conflict,
    /// Nothing: the storage is lost to this server
    /// ([`braid_store::exec::lost`]), and the connection closes instead.
    Lost,
}

/// The unit as SCSI describes it through the portal with tag `tag`, of
/// the target named `target`, served by the process `instance`.
pub fn describe(export: &Export, target: &str, tag: u16, instance: u128) -> Unit {
    let a = export.storage.abilities();
    // UNMAP punches holes, which read back as zeroes; without allocation
    // status GET LBA STATUS could not answer. Storage reached elsewhere
    // makes no such promise of its holes.
    let thin = a.trim && a.block_status && export.storage.backend().is_some();
    Unit {
        blocks: export.size() / u64::from(BLOCK),
        block_size: BLOCK,
        uuid: *export.volume.as_bytes(),
        read_only: export.read_only || a.read_only,
        thin,
        zeroes_after_unmap: thin,
        rotational: a.rotational,
        max_transfer_blocks: MAX_TRANSFER / BLOCK,
        relative_port: tag,
        port_group: tag,
        target_port: format!("{target},t,0x{tag:04x}"),
        instance: Some(instance),
    }
}

/// The one place a block error becomes the answer to a SCSI command. Storage
/// lost to this server is answered by closing the connection (the store's
/// rule, as over NBD): the initiator takes it for a failed path, fences
/// and sends the command elsewhere. A MEDIUM ERROR would tell it the data
/// itself is bad, which no multipath layer retries on another path; an
/// ALUA state or ABORTED COMMAND that the command never ran, so it would
/// be sent elsewhere at once, unfenced, though part of a write may have
/// landed. Anything else is a medium error in the direction the command
/// moved data (`write`: it changes the medium); the words go to the log.
pub(crate) fn failed(e: &Error, write: bool) -> Outcome {
    tracing::debug!(kind = %e.kind, "iSCSI command failed: {}", e.message);
    if braid_store::exec::lost(e) {
        return Outcome::Lost;
    }
    Outcome::Check(if write {
        Sense::WRITE_ERROR
    } else {
        Sense::READ_ERROR
    })
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
/// `groups` the target port groups as they stand; `write_cache` the
/// caching page's WCE.
pub async fn execute(
    export: &Arc<Export>,
    unit: &Unit,
    write_cache: bool,
    cmd: Command,
    data: Option<Vec<u8>>,
    groups: impl FnOnce() -> Vec<PortGroup>,
) -> Outcome {
    let writes = matches!(
        cmd,
        Command::Write { .. }
            | Command::WriteSame { .. }
            | Command::Unmap { .. }
            | Command::CompareAndWrite { .. }
            | Command::WriteAndVerify { .. }
            | Command::OrWrite { .. }
    );
    if writes && unit.read_only {
        return Outcome::Check(Sense::WRITE_PROTECTED);
    }
    match cmd {
        Command::TestUnitReady => Outcome::Good(Vec::new()),
        Command::Inquiry { vpd, alloc } => result(unit.inquiry(vpd, alloc)),
        Command::RequestSense { alloc } => Outcome::Good(respond::request_sense(None, alloc)),
        Command::ReadCapacity10 => Outcome::Good(unit.read_capacity10()),
        Command::ReadCapacity16 { alloc } => Outcome::Good(unit.read_capacity16(alloc)),
        Command::ReportLuns { alloc } => Outcome::Good(respond::report_luns(&[0], alloc)),
        Command::ModeSense {
            page,
            subpage,
            control,
            no_block_descriptors,
            alloc,
            ten,
        } => result(unit.mode_sense(
            page,
            subpage,
            control,
            no_block_descriptors,
            ten,
            alloc,
            write_cache,
        )),
        Command::ReportOpcodes {
            options,
            opcode,
            action,
            timeouts,
            alloc,
        } => result(opcodes::report(
            options,
            opcode,
            action,
            timeouts,
            alloc,
            |op, sa| offered(export, unit, op, sa),
        )),
        Command::ReportTargetPortGroups { extended, alloc } => {
            Outcome::Good(alua::report_target_port_groups(&groups(), extended, alloc))
        }
        Command::Unmap { .. } | Command::GetLbaStatus { .. } if !unit.thin => {
            Outcome::Check(Sense::INVALID_OPCODE)
        }
        Command::Unsupported { .. } => Outcome::Check(Sense::INVALID_OPCODE),
        _ => media::execute(export, unit, write_cache, cmd, data).await,
    }
}

/// Whether this unit carries out a command REPORT SUPPORTED OPERATION
/// CODES lists: UNMAP and GET LBA STATUS where the backend keeps holes,
/// COMPARE AND WRITE and ORWRITE where their read and write can be made
/// atomic.
fn offered(export: &Export, unit: &Unit, opcode: u8, action: Option<u16>) -> bool {
    match (opcode, action) {
        (0x42, _) | (0x9e, Some(0x12)) => unit.thin,
        (0x89 | 0x8b, _) => braid_store::compound::atomic(export),
        _ => true,
    }
}

pub(crate) fn result(r: Result<Vec<u8>, Sense>) -> Outcome {
    match r {
        Ok(d) => Outcome::Good(d),
        Err(s) => Outcome::Check(s),
    }
}
