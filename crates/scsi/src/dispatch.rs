//! One command's way through a logical unit, without I/O, in the order
//! the target takes it: [`admit`] (another LUN, a pending unit attention,
//! the port's access state), the reservations ([`LogicalUnit::conflicts`],
//! once the command is a task), how much data a command that takes some
//! moves ([`data_out`]), then [`decide`]: the answer, or the command
//! handed back to be carried out on the medium or to change the unit for
//! every nexus. The iSCSI target and the fuzz harness both go this way,
//! so a command the target takes is fuzzed as the target answers it.

use crate::lu::{LogicalUnit, Nexus};
use crate::reserve::Effects;
use crate::respond::{self, Unit};
use crate::{alua, check_range, opcodes, rod, xcopy, AccessState, Command, Delivery, NexusName};
use crate::{PortGroup, Refusal, Reservations, Sense};

/// Logical block size every LUN is offered with.
pub const BLOCK: u32 = 512;

/// Most bytes one READ or WRITE may move: bounds what one command can pin.
pub const MAX_TRANSFER: u32 = 8 << 20;

/// Most bytes of a parameter list (MODE SELECT, UNMAP, PERSISTENT RESERVE
/// OUT...) taken from an initiator.
pub const MAX_PARAMETERS: u64 = 65_536;

/// What a command answers.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// GOOD, with data for the initiator (possibly none).
    Good(Vec<u8>),
    /// CHECK CONDITION with this sense.
    Check(Sense),
    /// RESERVATION CONFLICT: another nexus holds a reservation this
    /// command may not pass.
    Conflict,
    /// No answer: the storage is lost to this server, and the connection
    /// closes instead (the target's rule; [`decide`] never gives it).
    Lost,
}

impl From<Result<Vec<u8>, Sense>> for Outcome {
    fn from(r: Result<Vec<u8>, Sense>) -> Self {
        match r {
            Ok(d) => Outcome::Good(d),
            Err(s) => Outcome::Check(s),
        }
    }
}

impl From<Refusal> for Outcome {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Conflict => Outcome::Conflict,
            Refusal::Check(s) => Outcome::Check(s),
        }
    }
}

/// Where a decided command goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Answered here.
    Answer(Outcome),
    /// To be carried out on the medium (READ, WRITE, SYNCHRONIZE CACHE,
    /// WRITE SAME, UNMAP, ...): the unit has one and may be written.
    Medium(Command),
    /// PERSISTENT RESERVE OUT or MODE SELECT: decided on by
    /// [`reserve_out`] or [`respond::mode_select`], then kept (saved, or
    /// set) before it is answered.
    UnitWide(Command),
}

/// What [`decide`] needs to know of the unit beyond its description.
#[derive(Clone, Copy, Debug)]
pub struct Medium {
    /// The caching page's WCE.
    pub write_cache: bool,
    /// ORWRITE is offered: its read and write can be made atomic (no
    /// other gateway writes the image, and the storage is on this host).
    pub atomic: bool,
    /// COMPARE AND WRITE is offered: atomic as ORWRITE is, or by the
    /// storage's own compare-and-write (a Ceph image's gateways).
    pub compare_and_write: bool,
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

/// What `cmd`, sent to LUN `lun` on `nexus` through a port in `state`,
/// meets before it becomes a task: `None` when it goes on, else its
/// answer. A unit attention pending for the nexus comes first (SAM-5
/// 5.14), then what the port's access state allows.
pub fn admit(
    unit: &Unit,
    nexus: &Nexus,
    state: AccessState,
    lun: u64,
    cmd: &Command,
) -> Option<Outcome> {
    if lun != 0 {
        return Some(answer_other_lun(unit, *cmd));
    }
    match nexus.deliver(cmd) {
        Delivery::Run => {}
        Delivery::Report(sense) => return Some(Outcome::Check(sense)),
        Delivery::AsSenseData(sense) => {
            let alloc = match cmd {
                Command::RequestSense { alloc } => *alloc,
                _ => 0,
            };
            return Some(Outcome::Good(respond::request_sense(Some(sense), alloc)));
        }
    }
    state.check(cmd).err().map(Outcome::Check)
}

/// What a command that takes data moves, the initiator having said it
/// would send `expected` bytes: the command (a WRITE cut to the blocks
/// that come whole), the bytes its CDB names and the bytes to gather.
/// Checked before any data is taken: a WRITE's range and size, a
/// parameter list's size. `None` for a command that takes no data.
///
/// # Errors
///
/// The sense to answer instead.
pub fn data_out(
    unit: &Unit,
    cmd: Command,
    expected: u32,
) -> Option<Result<(Command, u32, u32), Sense>> {
    let wanted = cmd.data_out_len(BLOCK)?;
    let checked = match cmd {
        Command::Write { lba, blocks, .. }
        | Command::WriteAndVerify { lba, blocks }
        | Command::OrWrite { lba, blocks, .. }
        | Command::Verify {
            lba,
            blocks,
            bytchk: 1,
        } => transfer_len(unit, lba, blocks),
        Command::Verify { lba, blocks, .. } => transfer_len(unit, lba, blocks).map(|_| BLOCK),
        Command::CompareAndWrite { blocks, .. }
            if blocks > respond::MAX_COMPARE_AND_WRITE_BLOCKS =>
        {
            Err(Sense::INVALID_FIELD_IN_CDB)
        }
        Command::CompareAndWrite { lba, blocks, .. } => {
            check_range(lba, blocks, unit.blocks).map(|()| wanted as u32)
        }
        _ if wanted > MAX_PARAMETERS => Err(Sense::PARAMETER_LIST_LENGTH),
        _ => Ok(wanted as u32),
    };
    // What moves is the smaller of what the CDB names and what the
    // initiator expects to send.
    Some(checked.and_then(|cdb_bytes| {
        let total = cdb_bytes.min(expected);
        match cmd {
            // A partial last block is taken from the wire but not
            // written; the residual tells the initiator.
            Command::Write { .. } | Command::WriteAndVerify { .. } => {
                Ok((whole_blocks(cmd, total / BLOCK), cdb_bytes, total))
            }
            // Compare and write data must come exactly as the CDB says
            // (SBC-4 5.3); a length the CDB cannot name (256 blocks and
            // more wrap to 0) is caught here too.
            Command::CompareAndWrite { .. } if expected != cdb_bytes => {
                Err(Sense::INVALID_FIELD_IN_CDB)
            }
            _ if total == cdb_bytes => Ok((cmd, cdb_bytes, total)),
            _ => Err(Sense::PARAMETER_LIST_LENGTH),
        }
    }))
}

/// A WRITE or WRITE AND VERIFY cut to the `blocks` whose data came whole.
fn whole_blocks(cmd: Command, blocks: u32) -> Command {
    match cmd {
        Command::Write { lba, fua, .. } => Command::Write { lba, blocks, fua },
        Command::WriteAndVerify { lba, .. } => Command::WriteAndVerify { lba, blocks },
        other => other,
    }
}

/// Decides `cmd` (admitted, not in conflict) from nexus `me` on `lu`,
/// described as `unit` with `medium`; `groups` the target port groups as
/// they stand.
pub fn decide(
    lu: &LogicalUnit,
    me: &NexusName,
    unit: &Unit,
    medium: Medium,
    cmd: Command,
    groups: impl FnOnce() -> Vec<PortGroup>,
) -> Step {
    // What changes the unit for every nexus answers whatever the medium.
    match cmd {
        Command::PersistentReserveIn { action, alloc } => {
            return Step::Answer(lu.reservations().read(action, alloc).into())
        }
        Command::Reserve => return Step::Answer(done(lu.reservations().reserve(me))),
        Command::Release => return Step::Answer(done(lu.reservations().release(me))),
        Command::PersistentReserveOut { .. } | Command::ModeSelect { .. } => {
            return Step::UnitWide(cmd)
        }
        _ => {}
    }
    let writes = matches!(
        cmd,
        Command::Write { .. }
            | Command::WriteSame { .. }
            | Command::Unmap { .. }
            | Command::CompareAndWrite { .. }
            | Command::WriteAndVerify { .. }
            | Command::OrWrite { .. }
            | Command::WriteUsingToken { .. }
    );
    if writes && unit.read_only {
        return Step::Answer(Outcome::Check(Sense::WRITE_PROTECTED));
    }
    let answer = match cmd {
        Command::TestUnitReady => Outcome::Good(Vec::new()),
        Command::Inquiry { vpd, alloc } => unit.inquiry(vpd, alloc).into(),
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
        } => unit
            .mode_sense(
                page,
                subpage,
                control,
                no_block_descriptors,
                ten,
                alloc,
                medium.write_cache,
            )
            .into(),
        Command::ReportOpcodes {
            options,
            opcode,
            action,
            timeouts,
            alloc,
        } => opcodes::report(options, opcode, action, timeouts, alloc, |op, sa| {
            offered(unit, medium, op, sa)
        })
        .into(),
        Command::ReceiveCopyResults {
            action,
            list_id,
            alloc,
        } => {
            xcopy::receive_copy_results(action, alloc, || lu.copies.get(me, list_id.into())).into()
        }
        Command::ReceiveRodTokenInformation { list_id, alloc } => {
            rod::receive_rod_token_information(lu.tokens.get(me, list_id), alloc).into()
        }
        Command::ReportTargetPortGroups { extended, alloc } => {
            Outcome::Good(alua::report_target_port_groups(&groups(), extended, alloc))
        }
        Command::Unmap { .. } | Command::GetLbaStatus { .. } if !unit.thin => {
            Outcome::Check(Sense::INVALID_OPCODE)
        }
        Command::Unsupported { .. } => Outcome::Check(Sense::INVALID_OPCODE),
        _ => return Step::Medium(cmd),
    };
    Step::Answer(answer)
}

fn done(r: Result<(), Refusal>) -> Outcome {
    match r {
        Ok(()) => Outcome::Good(Vec::new()),
        Err(r) => r.into(),
    }
}

/// Whether this unit carries out a command REPORT SUPPORTED OPERATION
/// CODES lists: UNMAP and GET LBA STATUS where the backend keeps holes,
/// ORWRITE where no other gateway writes the image, COMPARE AND WRITE
/// where it can be atomic all the same.
fn offered(unit: &Unit, medium: Medium, opcode: u8, action: Option<u16>) -> bool {
    match (opcode, action) {
        (0x42, _) | (0x9e, Some(0x12)) => unit.thin,
        (0x89, _) => medium.compare_and_write,
        (0x8b, _) => medium.atomic,
        _ => true,
    }
}

/// A PERSISTENT RESERVE OUT from `me` with parameter list `params`,
/// decided on a copy of `current`: the reservations to make current once
/// kept (when they changed and must outlive a restart), and what it does
/// to other nexuses. Anything else is INVALID COMMAND OPERATION CODE.
///
/// # Errors
///
/// The answer when it is refused; `current` stays as it was.
pub fn reserve_out(
    current: &Reservations,
    me: &NexusName,
    cmd: Command,
    params: &[u8],
) -> Result<(Reservations, Effects), Outcome> {
    let Command::PersistentReserveOut {
        action,
        scope,
        kind,
        ..
    } = cmd
    else {
        return Err(Outcome::Check(Sense::INVALID_OPCODE));
    };
    let mut next = current.clone();
    let fx = next.out(me, action, scope, kind, params)?;
    Ok((next, fx))
}
