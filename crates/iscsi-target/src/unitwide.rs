//! Commands that change the unit for every nexus and must be kept before
//! they are answered: PERSISTENT RESERVE OUT and MODE SELECT (PERSISTENT
//! RESERVE IN, RESERVE and RELEASE are answered by
//! [`braid_scsi::dispatch::decide`]).
//!
//! A PERSISTENT RESERVE OUT is decided on a copy of the reservations,
//! saved (when the initiator asked for them to outlive a restart) and only
//! then made current, so an answer never promises what a restart would
//! forget. PREEMPT AND ABORT answers once every task of the preempted
//! nexuses has ended: a write one of them had queued can no longer land,
//! which is what a cluster relies on when it fences a node.

use std::io::{self, Write};
use std::path::Path;

use braid_scsi::dispatch::{reserve_out, Outcome};
use braid_scsi::reserve::Effects;
use braid_scsi::respond::{mode_select, Unit};
use braid_scsi::{Command, Key, Reservations, Sense};
use tracing::{info, warn};

use super::lu::Nexus;
use super::task::abort_all;
use super::Served;

const MODE_PARAMETERS_CHANGED: Sense = Sense::new(Key::UnitAttention, 0x2a, 0x01);
const INTERNAL_TARGET_FAILURE: Sense = Sense::new(Key::HardwareError, 0x44, 0x00);

/// Carries out `cmd` (PERSISTENT RESERVE OUT or MODE SELECT, as
/// [`braid_scsi::dispatch::decide`] hands them over) for `nexus` on
/// `served`'s unit, described as `unit`.
pub(crate) async fn execute(
    served: &Served,
    unit: &Unit,
    nexus: &Nexus,
    cmd: Command,
    data: Option<Vec<u8>>,
) -> Outcome {
    let lu = &served.lu;
    match cmd {
        Command::PersistentReserveOut { action, .. } => {
            let params = data.unwrap_or_default();
            let fx = {
                let mut current = lu.reservations();
                let (next, fx) = match reserve_out(&current, &nexus.name, cmd, &params) {
                    Ok(decided) => decided,
                    Err(answer) => return answer,
                };
                if fx.changed {
                    if let Some(path) = &lu.saved {
                        if let Err(e) = keep(path, &next) {
                            warn!("reservations not saved in {}: {e}", path.display());
                            return Outcome::Check(Sense::new(Key::HardwareError, 0x53, 0x00));
                        }
                    }
                }
                *current = next;
                fx
            };
            carry_out(served, action, fx).await;
            Outcome::Good(Vec::new())
        }
        Command::ModeSelect { ten, .. } => {
            let params = data.unwrap_or_default();
            let wce = match mode_select(unit, &params, ten, lu.write_cache.on()) {
                Ok(wce) => wce,
                Err(s) => return Outcome::Check(s),
            };
            match lu.write_cache.set(wce).await {
                Ok(false) => Outcome::Good(Vec::new()),
                Ok(true) => {
                    info!(
                        write_cache = wce,
                        target = %served.name,
                        "iSCSI MODE SELECT changed the write cache"
                    );
                    lu.raise(MODE_PARAMETERS_CHANGED, Some(nexus.id));
                    Outcome::Good(Vec::new())
                }
                Err(e) => {
                    warn!("the write cache setting was not kept, so not changed: {e}");
                    Outcome::Check(INTERNAL_TARGET_FAILURE)
                }
            }
        }
        _ => Outcome::Check(Sense::INVALID_OPCODE),
    }
}

/// What a PERSISTENT RESERVE OUT does to other nexuses: their tasks
/// aborted (PREEMPT AND ABORT) and the unit attentions they are owed.
async fn carry_out(served: &Served, action: u8, fx: Effects) {
    let lu = &served.lu;
    if !fx.abort.is_empty() {
        let ids: Vec<u64> = fx.abort.iter().flat_map(|n| lu.ids_of(n)).collect();
        info!(
            preempted = fx.abort.len(),
            sessions = ids.len(),
            "PREEMPT AND ABORT: ending the preempted nexuses' tasks"
        );
        abort_all(&lu.tasks.select(|n, _| ids.contains(&n))).await;
    }
    lu.tell(fx.tell);
    if action == 3 {
        info!("persistent reservations cleared");
    }
}

/// Saves `r` in `path` (written beside it, synced, then renamed over it),
/// or removes the file when nothing needs to outlive a restart.
fn keep(path: &Path, r: &Reservations) -> io::Result<()> {
    let empty = r.is_empty() || !r.persistent();
    if empty {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("new");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(r.save().as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}
