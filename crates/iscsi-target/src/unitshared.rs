//! Reservations that every server of an export shares (the gateways of a
//! Ceph image, `braid_store::shared`), instead of a file of this host's.
//!
//! A PERSISTENT RESERVE OUT reads the shared state, is decided on it
//! (`braid_scsi::reserve`), and stores the result only if no other server
//! changed the state in between (else it is decided again on the new
//! one). Then every other server is told what the change does to its
//! nexuses (tasks to end, unit attentions) and reads the state again; the
//! command is answered once each has done so, or was fenced. RESERVE (6)
//! and RELEASE (6) go the same way, and so does the end of a RESERVE
//! (6) with its nexus or a reset of the unit; a reset is told even when
//! it changed no reservation, and every other server ends its tasks and
//! raises its unit attention. PERSISTENT RESERVE IN reads
//! the state before it answers.
//!
//! Every other command is checked against this server's copy, which is
//! the stored state as of the last change this server made or was told
//! of: a change is answered only after every live server has its copy
//! (or can no longer write), so a command that arrives after GOOD meets
//! the new state on every server; one that runs alongside the change
//! meets either, as on one server. A server reads the state again, at
//! start and whenever its watch of the state was registered again.

use std::sync::Arc;

use braid_scsi::dispatch::{reserve_out, Outcome};
use braid_scsi::reserve::Effects;
use braid_scsi::{Command, Key, NexusName, Refusal, Reservations, Sense};
use braid_store::shared::SharedState;
use tracing::warn;

use super::lu::{parse, read, LogicalUnit, Nexus};
use super::task::abort_all;

const INTERNAL_TARGET_FAILURE: Sense = Sense::new(Key::HardwareError, 0x44, 0x00);
const ABORTED_COMMAND: Sense = Sense::new(Key::AbortedCommand, 0x00, 0x00);

/// Most times a PERSISTENT RESERVE OUT is decided again because another
/// server changed the state first.
const MOST_DECISIONS: usize = 16;

/// Has `lu` act on the changes other servers announce, then reads the
/// state: in this order, so that no change falls between the two.
///
/// # Errors
///
/// The state could not be read.
pub(crate) async fn start(lu: &Arc<LogicalUnit>) -> std::io::Result<()> {
    let Some(shared) = lu.shared.clone() else {
        return Ok(());
    };
    let unit = Arc::downgrade(lu);
    shared.subscribe(Arc::new(move |text| {
        let lu = unit.upgrade();
        Box::pin(async move {
            match lu {
                Some(lu) => changed_elsewhere(&lu, &text).await,
                None => Ok(()),
            }
        })
    }));
    let _one = lu.deciding.lock().await;
    let r = blocking(move || read(shared.as_ref()))
        .await
        .map_err(|e| std::io::Error::other(format!("the shared reservations: {e}")))?;
    *lu.reservations() = r;
    Ok(())
}

/// Another server changed the state (`text`: what that does here; empty
/// when this server may have missed changes): read it again, then end
/// the tasks and raise the unit attentions named.
async fn changed_elsewhere(lu: &LogicalUnit, text: &[u8]) -> Result<(), String> {
    let text = std::str::from_utf8(text).map_err(|e| format!("not text: {e}"))?;
    let fx = Effects::from_text(text)?;
    let Some(shared) = lu.shared.clone() else {
        return Ok(());
    };
    {
        let _one = lu.deciding.lock().await;
        let r = blocking(move || read(shared.as_ref())).await?;
        *lu.reservations() = r;
    }
    if fx.reset {
        tracing::info!("the unit was reset through another gateway: ending every task here");
        abort_all(&lu.tasks.select(|_, _| true)).await;
        lu.reset();
    }
    lu.carry_out(fx).await;
    Ok(())
}

/// Before a command answered from the reservations (PERSISTENT RESERVE
/// IN): the unit's copy read again. Nothing to do for a unit of its own.
///
/// # Errors
///
/// The answer when the state could not be read.
pub(crate) async fn fresh(lu: &LogicalUnit) -> Result<(), Outcome> {
    let Some(shared) = lu.shared.clone() else {
        return Ok(());
    };
    let _one = lu.deciding.lock().await;
    let r = blocking(move || read(shared.as_ref()))
        .await
        .map_err(failed)?;
    *lu.reservations() = r;
    Ok(())
}

/// Decides a PERSISTENT RESERVE OUT from `nexus` on the shared state,
/// stores the result, and tells every other server: see the module's
/// comment. Returns what the change does to this server's nexuses.
///
/// # Errors
///
/// The answer when it is refused or could not be kept.
pub(crate) async fn decide_and_store(
    lu: &LogicalUnit,
    shared: &Arc<dyn SharedState>,
    nexus: &Nexus,
    cmd: Command,
    params: &[u8],
) -> Result<Effects, Outcome> {
    change(lu, shared, |current| {
        reserve_out(current, &nexus.name, cmd, params)
    })
    .await
}

/// RESERVE (6)/(10) or RELEASE (6)/(10) from `name` on the shared state,
/// as [`decide_and_store`] does.
pub(crate) async fn reserve_or_release(
    lu: &LogicalUnit,
    shared: &Arc<dyn SharedState>,
    name: &NexusName,
    cmd: Command,
) -> Outcome {
    let decided = change(lu, shared, |current| {
        legacy(current, |next| match cmd {
            Command::Reserve => next.reserve(name),
            _ => next.release(name),
        })
    })
    .await;
    match decided {
        Ok(_) => Outcome::Good(Vec::new()),
        Err(answer) => answer,
    }
}

/// `name`'s nexus ended: a RESERVE (6) it held ends on every server too.
/// `None`: the unit was reset through this server, which is the image's
/// unit whatever server a nexus reaches it through: every other server
/// also ends every task and tells every nexus (BUS DEVICE RESET FUNCTION
/// OCCURRED) before this returns, even when no reservation changed.
/// Nothing to do for a unit of its own.
pub(crate) async fn nexus_lost(lu: &LogicalUnit, name: Option<&NexusName>) {
    let Some(shared) = lu.shared.clone() else {
        return;
    };
    let ended = change(lu, &shared, |current| {
        let (next, fx) = legacy(current, |next| {
            next.nexus_lost(name);
            Ok(())
        })?;
        let reset = name.is_none();
        Ok((next, Effects { reset, ..fx }))
    })
    .await;
    if ended.is_err() {
        warn!(
            "a RESERVE (6) that ended here may still be held in the shared reservations, and \
             a reset may not have reached the other gateways' sessions"
        );
    }
}

/// `current` changed by `f` (a RESERVE (6) taken or given up), which
/// tells no nexus anything.
fn legacy(
    current: &Reservations,
    f: impl FnOnce(&mut Reservations) -> Result<(), Refusal>,
) -> Result<(Reservations, Effects), Outcome> {
    let mut next = current.clone();
    f(&mut next)?;
    let changed = next != *current;
    let fx = Effects {
        changed,
        ..Effects::default()
    };
    Ok((next, fx))
}

/// Decides with `decide` on the shared state as it is, stores the result
/// if it changed and no other server changed the state first (else
/// decides again), then tells every other server (also of a reset, which
/// changes nothing stored).
async fn change(
    lu: &LogicalUnit,
    shared: &Arc<dyn SharedState>,
    decide: impl Fn(&Reservations) -> Result<(Reservations, Effects), Outcome>,
) -> Result<Effects, Outcome> {
    for _ in 0..MOST_DECISIONS {
        let fx = {
            let _one = lu.deciding.lock().await;
            let s = shared.clone();
            let seen = blocking(move || s.load()).await.map_err(failed)?;
            let current = parse(&seen).map_err(failed)?;
            match decide(&current) {
                Ok((next, fx)) if fx.changed => {
                    let (s, new) = (shared.clone(), next.to_shared().into_bytes());
                    if !blocking(move || s.replace(&seen, &new))
                        .await
                        .map_err(failed)?
                    {
                        continue;
                    }
                    *lu.reservations() = next;
                    fx
                }
                // A reset changes no reservation, yet every server must
                // act on it.
                Ok((_, fx)) if fx.reset => {
                    *lu.reservations() = current;
                    fx
                }
                decided => {
                    *lu.reservations() = current;
                    return decided.map(|(_, fx)| fx);
                }
            }
        };
        // Other servers may read the state while they are told (each
        // takes its own copy under `deciding`), so the lock is let go.
        shared
            .announce(fx.to_text().into_bytes())
            .await
            .map_err(failed)?;
        return Ok(fx);
    }
    warn!("reservations decided {MOST_DECISIONS} times while other gateways changed them; answered ABORTED COMMAND");
    Err(Outcome::Check(ABORTED_COMMAND))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("reservations task: {e}"))?
}

fn failed(e: String) -> Outcome {
    warn!("shared reservations: {e}");
    Outcome::Check(INTERNAL_TARGET_FAILURE)
}
