//! Commands that change the unit for every nexus and must be kept before
//! they are answered: PERSISTENT RESERVE OUT and MODE SELECT (PERSISTENT
//! RESERVE IN, RESERVE and RELEASE are answered by
//! [`braid_scsi::dispatch::decide`]).
//!
//! A PERSISTENT RESERVE OUT is decided on a copy of the reservations,
//! saved (when the initiator asked for them to outlive a restart) on a
//! blocking thread and only then made current, so an answer never
//! promises what a restart would forget, and a slow disk holds that
//! answer alone. PREEMPT AND ABORT answers once every task of the preempted
//! nexuses has ended: a write one of them had queued can no longer land,
//! which is what a cluster relies on when it fences a node.

use std::io;
use std::path::Path;

use braid_scsi::dispatch::{reserve_out, Outcome};
use braid_scsi::reserve::Effects;
use braid_scsi::respond::{mode_select, Unit};
use braid_scsi::{Command, Key, Reservations, Sense};
use tracing::{info, warn};

use super::lu::{LogicalUnit, Nexus};
use super::slowsave::SlowSave;
use super::Served;

const MODE_PARAMETERS_CHANGED: Sense = Sense::new(Key::UnitAttention, 0x2a, 0x01);
const INTERNAL_TARGET_FAILURE: Sense = Sense::new(Key::HardwareError, 0x44, 0x00);
const ABORTED_COMMAND: Sense = Sense::new(Key::AbortedCommand, 0x00, 0x00);

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
            let decided = match &lu.shared {
                Some(s) => super::unitshared::decide_and_store(lu, s, nexus, cmd, &params).await,
                None => decide_and_keep(served, nexus, cmd, &params).await,
            };
            match decided {
                Ok(fx) => {
                    lu.carry_out(fx).await;
                    if action == 3 {
                        info!("persistent reservations cleared");
                    }
                    Outcome::Good(Vec::new())
                }
                Err(answer) => answer,
            }
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

/// Most times a PERSISTENT RESERVE OUT is decided again because a
/// RESERVE, RELEASE or a nexus's end changed the reservations while its
/// save ran.
const MOST_DECISIONS: usize = 8;

/// Decides a PERSISTENT RESERVE OUT on the reservations as they are,
/// keeps the result durably and only then makes it current, so that GOOD
/// (which the caller answers after this returns) never promises what a
/// restart would forget. The save runs on a blocking thread: an fsync on
/// a slow disk holds this command's answer and nothing else the runtime
/// serves.
///
/// PERSISTENT RESERVE OUTs of the unit run one at a time, so while one
/// saves, only the RESERVE (6) holder can change (RESERVE, RELEASE, a
/// nexus's end), which is never saved. When it has, the command is
/// decided again on what is there now (and the file made to match), as
/// if it had arrived after.
async fn decide_and_keep(
    served: &Served,
    nexus: &Nexus,
    cmd: Command,
    params: &[u8],
) -> Result<Effects, Outcome> {
    let lu = &served.lu;
    let _one = lu.deciding.lock().await;
    // What the file holds: the current reservations', as every change
    // made current was saved first.
    let mut on_disk = kept(&lu.reservations());
    for _ in 0..MOST_DECISIONS {
        let (seen, decided) = {
            let current = lu.reservations();
            let decided = reserve_out(&current, &nexus.name, cmd, params);
            (current.clone(), decided)
        };
        let wanted = match &decided {
            Ok((next, fx)) if fx.changed => kept(next),
            _ => kept(&seen),
        };
        if wanted != on_disk {
            save(lu, wanted.clone()).await?;
            on_disk = wanted;
        }
        let mut current = lu.reservations();
        if *current != seen {
            continue;
        }
        let (next, fx) = decided?;
        *current = next;
        return Ok(fx);
    }
    // Changed under every decision: leave the file as the reservations
    // are, and let the initiator send it again.
    let now = kept(&lu.reservations());
    if now != on_disk {
        save(lu, now).await?;
    }
    warn!("PERSISTENT RESERVE OUT decided {MOST_DECISIONS} times while the reservations changed; answered ABORTED COMMAND");
    Err(Outcome::Check(ABORTED_COMMAND))
}

/// What the reservations' file must hold for `r`: its text, or no file
/// when nothing needs to outlive a restart.
fn kept(r: &Reservations) -> Option<String> {
    (!r.is_empty() && r.persistent()).then(|| r.save())
}

/// Writes `text` (or removes the file) on a blocking thread; the answer
/// to the initiator when that failed.
async fn save(lu: &LogicalUnit, text: Option<String>) -> Result<(), Outcome> {
    let Some(path) = lu.saved.clone() else {
        return Ok(());
    };
    let slow = lu.slow_save.clone();
    let shown = path.clone();
    let done = tokio::task::spawn_blocking(move || keep(&path, text.as_deref(), &slow))
        .await
        .map_err(io::Error::other)
        .and_then(|r| r);
    done.map_err(|e| {
        warn!("reservations not saved in {}: {e}", shown.display());
        Outcome::Check(Sense::new(Key::HardwareError, 0x53, 0x00))
    })
}

/// Saves `text` in `path` (written beside it, synced, then renamed over
/// it, and the directory synced), or removes the file for `None`.
fn keep(path: &Path, text: Option<&str>, slow: &SlowSave) -> io::Result<()> {
    let Some(text) = text else {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    };
    super::durable::replace(path, text.as_bytes(), || slow.pass())
}
