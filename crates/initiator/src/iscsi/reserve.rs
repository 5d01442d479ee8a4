//! Fencing by persistent reservations, for users who opt in
//! (`--persistent-reservations`): every session of the volume registers a
//! key of its own and the unit is reserved "write exclusive, all
//! registrants", so a path that fails is fenced by PREEMPT AND ABORT from
//! a fresh session: the target aborts the failed session's tasks and
//! refuses its writes from then on, whichever port group it came through.
//! Session reinstatement reaches only sessions the target ties to the
//! ISID across its portals, which not every target does (LIO scopes
//! sessions to a portal group).
//!
//! A fence holds only where the target answered GOOD to a PREEMPT AND
//! ABORT sent in the same attempt: that answer comes once the preempted
//! tasks have ended. A key that is no longer registered proves nothing,
//! as an earlier attempt's PREEMPT AND ABORT that went unanswered may
//! have removed it while the tasks it aborts still run; [`fence`] says
//! which keys it found gone, and the caller finds another barrier or
//! leaves the fence unconfirmed. Every key is read, however many are
//! registered (READ KEYS is asked again with room for all).
//!
//! At open ([`check_preempt`], [`remove_stale`]): a target without
//! PREEMPT AND ABORT is refused, and keys an earlier volume of this
//! initiator left behind (a process that died) are removed, told apart
//! by READ FULL STATUS from other hosts' keys, which are never touched.

use std::time::Duration;

use braid_iscsi::initiator::cdb::{self, ReserveOut};
use braid_iscsi::initiator::login::Isid;
use braid_iscsi::initiator::reservation::{self, Registration};
use braid_iscsi::initiator::sense::{key as sense_key, SenseData};
use braid_iscsi::initiator::session::{Command, Outcome};
use braid_iscsi::scsi::sense::status;
use bytes::Bytes;

use super::conn::Conn;
use super::fence::PATIENCE;
use super::open::{call_past_attentions, SessionConfig};
use crate::conn::ConnectError;
use crate::discover::PathSpec;

/// The reservation key of the session with `isid`: "br" and the ISID, so
/// the key names the session and a fence can be derived from the engine's
/// connection id alone.
pub fn key(isid: Isid) -> u64 {
    let mut b = [0u8; 8];
    b[..2].copy_from_slice(b"br");
    b[2..].copy_from_slice(&isid.0);
    u64::from_be_bytes(b)
}

/// Why a PERSISTENT RESERVE command did not succeed.
#[derive(Debug)]
enum Refused {
    Conflict,
    Sense(SenseData),
    Other(String),
}

impl Refused {
    /// ILLEGAL REQUEST, INVALID COMMAND OPERATION CODE or INVALID FIELD
    /// IN CDB: the target does not have the command or service action.
    fn unsupported(&self) -> bool {
        matches!(self, Refused::Sense(s) if s.key == sense_key::ILLEGAL_REQUEST
            && matches!(s.asc, 0x20 | 0x24))
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Conflict => f.write_str("RESERVATION CONFLICT"),
            Refused::Sense(s) => write!(f, "{s}"),
            Refused::Other(s) => f.write_str(s),
        }
    }
}

/// Runs `cdb` (with `data` out, `read` bytes in) past unit attentions
/// (a reservation change raises them on the other sessions); the
/// attentions are not acted on here: the volume's sessions hear their
/// own.
async fn run(
    conn: &Conn,
    cdb: [u8; 16],
    data: Option<Vec<u8>>,
    read: u32,
    timeout: Duration,
) -> Result<Bytes, Refused> {
    let cmd = Command {
        lun: conn.lun(),
        cdb,
        read,
        write: data.map(Bytes::from),
    };
    let (a, _) = call_past_attentions(conn, cmd, timeout)
        .await
        .map_err(Refused::Other)?;
    match a.outcome {
        Outcome::Status {
            status: status::GOOD,
            ..
        } => Ok(a.data),
        Outcome::Status {
            status: status::RESERVATION_CONFLICT,
            ..
        } => Err(Refused::Conflict),
        Outcome::Status {
            status: status::CHECK_CONDITION,
            sense: Some(s),
            ..
        } => Err(Refused::Sense(s)),
        o => Err(Refused::Other(format!("{o:?}"))),
    }
}

async fn out(
    conn: &Conn,
    action: ReserveOut,
    key: u64,
    action_key: u64,
    timeout: Duration,
) -> Result<(), Refused> {
    let (c, p) = cdb::persistent_reserve_out(action, key, action_key);
    run(conn, c, Some(p), 0, timeout).await.map(drop)
}

/// Registers the session (whatever key it had) and reserves the unit for
/// every registrant.
///
/// # Errors
///
/// The target does not support persistent reservations, or another
/// initiator holds a reservation of its own: both named.
pub async fn join(conn: &Conn, timeout: Duration) -> Result<(), String> {
    let k = key(conn.logged_in.isid);
    out(conn, ReserveOut::RegisterAndIgnore, 0, k, timeout)
        .await
        .map_err(|e| {
            format!(
                "PERSISTENT RESERVE OUT (REGISTER) failed: {e}; the target may not support \
                 persistent reservations (leave out --persistent-reservations)"
            )
        })?;
    if let Err(e) = out(conn, ReserveOut::Reserve, k, 0, timeout).await {
        // Not left registered on a unit it may not use.
        let _ = leave(conn, timeout).await;
        return Err(format!(
            "PERSISTENT RESERVE OUT (RESERVE, write exclusive for all registrants) failed: {e}; \
             another initiator holds a reservation on the unit"
        ));
    }
    Ok(())
}

/// Withdraws the session's registration (the reservation ends with the
/// last one).
///
/// # Errors
///
/// The command failed.
pub async fn leave(conn: &Conn, timeout: Duration) -> Result<(), String> {
    out(
        conn,
        ReserveOut::Register,
        key(conn.logged_in.isid),
        0,
        timeout,
    )
    .await
    .map_err(|e| e.to_string())
}

/// PERSISTENT RESERVE IN `action`, whole: asked again with room for the
/// whole list when the first answer says it holds more.
async fn read_in(conn: &Conn, action: u8, timeout: Duration) -> Result<Bytes, Refused> {
    let mut room: u16 = 8 + 8 * 64;
    loop {
        let d = run(
            conn,
            cdb::persistent_reserve_in(action, room),
            None,
            u32::from(room),
            timeout,
        )
        .await?;
        match reservation::needed(&d) {
            Some(n) if n > usize::from(room) && room < u16::MAX => {
                room = u16::try_from(n).unwrap_or(u16::MAX);
            }
            _ => return Ok(d),
        }
    }
}

/// Every key registered for the unit (PERSISTENT RESERVE IN, READ KEYS).
///
/// # Errors
///
/// The command failed, or its answer cannot be read whole (more keys
/// than one answer can hold, 8190).
pub async fn keys(conn: &Conn, timeout: Duration) -> Result<Vec<u64>, String> {
    let d = read_in(conn, 0, timeout)
        .await
        .map_err(|e| format!("READ KEYS: {e}"))?;
    reservation::keys(&d).map_err(|e| e.to_string())
}

/// Every registration, with the initiator that made it (READ FULL
/// STATUS); `None` where the target does not have it (tgt).
///
/// # Errors
///
/// The command failed otherwise, or its answer cannot be read.
pub async fn registrations(
    conn: &Conn,
    timeout: Duration,
) -> Result<Option<Vec<Registration>>, String> {
    match read_in(conn, 3, timeout).await {
        Ok(d) => reservation::full_status(&d)
            .map(Some)
            .map_err(|e| e.to_string()),
        Err(e) if e.unsupported() => Ok(None),
        Err(e) => Err(format!("READ FULL STATUS: {e}")),
    }
}

/// Preempts (and aborts) every key of `stale` still registered, from
/// `conn`'s registered session, each PREEMPT AND ABORT awaited `answer`.
/// Returns the keys of `stale` found already gone, which it cannot
/// vouch for.
///
/// # Errors
///
/// A command failed or went unanswered: what it preempted is not known.
pub async fn preempt(
    conn: &Conn,
    stale: &[u64],
    timeout: Duration,
    answer: Duration,
) -> Result<Vec<u64>, String> {
    let mine = key(conn.logged_in.isid);
    let registered = keys(conn, timeout).await?;
    let mut gone = Vec::new();
    for k in stale {
        if *k == mine {
            continue;
        }
        if !registered.contains(k) {
            gone.push(*k);
            continue;
        }
        out(conn, ReserveOut::PreemptAndAbort, mine, *k, answer)
            .await
            .map_err(|e| {
                let what = format!("PREEMPT AND ABORT of key {k:#018x}: {e}");
                if e.unsupported() {
                    format!(
                        "{what}: the target does not implement PREEMPT AND ABORT, so this \
                         fence can never be confirmed (leave out --persistent-reservations)"
                    )
                } else {
                    what
                }
            })?;
    }
    Ok(gone)
}

/// Fences the sessions named by `isids` through `spec`: a fresh session
/// joins, preempts and aborts each of their keys still registered
/// (waiting [`PATIENCE`] times `timeout` for each answer), then leaves.
/// Once this returns, none of their commands can still write, except
/// those of the sessions it returns: their keys were already gone, and
/// whoever removed them may not have waited for their tasks.
///
/// # Errors
///
/// The session could not be opened, or a command failed or went
/// unanswered: the fence is not confirmed.
pub async fn fence(
    spec: &PathSpec,
    cfg: &SessionConfig,
    isids: &[Isid],
    timeout: Duration,
) -> Result<Vec<Isid>, ConnectError> {
    let o = super::open::open(spec, cfg, cfg.next_isid(), timeout).await?;
    let conn = &o.conn;
    let failed = |e: String| ConnectError::Other(format!("{}: fence: {e}", spec.portal));
    let stale: Vec<u64> = isids.iter().map(|i| key(*i)).collect();
    let r = async {
        join(conn, timeout).await?;
        let gone = preempt(conn, &stale, timeout, timeout * PATIENCE).await;
        let left = leave(conn, timeout).await;
        let gone = gone?;
        left?;
        Ok(gone)
    }
    .await;
    conn.logout(timeout).await;
    let gone = r.map_err(failed)?;
    Ok(isids
        .iter()
        .copied()
        .filter(|i| gone.contains(&key(*i)))
        .collect())
}

/// Whether the target has PREEMPT AND ABORT, asked of `conn`'s session
/// before it registers: a PREEMPT AND ABORT from an unregistered I_T
/// nexus is refused with RESERVATION CONFLICT by a target that has it
/// (SPC-5 5.14.11.1), and changes nothing; one that lacks it says
/// ILLEGAL REQUEST.
///
/// # Errors
///
/// The target lacks it: the answer, for the caller's message.
pub async fn check_preempt(conn: &Conn, timeout: Duration) -> Result<(), String> {
    let k = key(conn.logged_in.isid);
    match out(conn, ReserveOut::PreemptAndAbort, k, k, timeout).await {
        Err(e) if e.unsupported() => Err(e.to_string()),
        _ => Ok(()),
    }
}

/// Removes the keys an earlier volume of `initiator` left registered:
/// braid's keys ("br" and the ISID of the session that registered them)
/// that READ FULL STATUS says this initiator name registered, from that
/// very ISID. Another host's keys, and keys made by anything else, stay.
/// Returns how many it removed, `None` where the target cannot say who
/// registered a key (then none is removed).
///
/// Another braid process of this host on the same unit with
/// `--persistent-reservations` at the same time cannot be told from one
/// that died: its keys go too, and its next fence preempts nothing.
///
/// # Errors
///
/// A command failed.
pub async fn remove_stale(
    conn: &Conn,
    initiator: &str,
    timeout: Duration,
) -> Result<Option<usize>, String> {
    let Some(regs) = registrations(conn, timeout).await? else {
        return Ok(None);
    };
    let initiator = initiator.to_lowercase();
    let mine = key(conn.logged_in.isid);
    let stale: Vec<u64> = regs
        .iter()
        .filter(|r| r.initiator.as_deref() == Some(initiator.as_str()))
        .filter(|r| r.isid.is_some_and(|i| key(Isid(i)) == r.key) && r.key != mine)
        .map(|r| r.key)
        .collect();
    if stale.is_empty() {
        return Ok(Some(0));
    }
    join(conn, timeout).await?;
    let gone = preempt(conn, &stale, timeout, timeout * PATIENCE).await;
    let left = leave(conn, timeout).await;
    let gone = gone?;
    left?;
    Ok(Some(stale.len() - gone.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_names_its_session() {
        let k = key(Isid([0x80, 1, 2, 3, 4, 5]));
        assert_eq!(k.to_be_bytes(), [b'b', b'r', 0x80, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn only_a_missing_command_or_service_action_counts_as_unsupported() {
        let sense = |key, asc| Refused::Sense(SenseData { key, asc, ascq: 0 });
        assert!(sense(sense_key::ILLEGAL_REQUEST, 0x24).unsupported());
        assert!(sense(sense_key::ILLEGAL_REQUEST, 0x20).unsupported());
        assert!(!sense(sense_key::ILLEGAL_REQUEST, 0x26).unsupported());
        assert!(!sense(sense_key::UNIT_ATTENTION, 0x24).unsupported());
        assert!(!Refused::Conflict.unsupported());
    }
}
