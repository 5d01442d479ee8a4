//! Fencing by persistent reservations, for users who opt in
//! (`--persistent-reservations`): every session of the volume registers a
//! key of its own and the unit is reserved "write exclusive, all
//! registrants", so a path that fails is fenced by PREEMPT AND ABORT from
//! a fresh session: the target aborts the failed session's tasks and
//! refuses its writes from then on, whichever port group it came through.
//! Session reinstatement (the default fence) reaches only sessions the
//! target ties to the ISID across its portals, which not every target
//! does (LIO scopes sessions to a portal group).

use std::time::Duration;

use braid_iscsi::initiator::cdb::{self, ReserveOut};
use braid_iscsi::initiator::login::Isid;
use braid_iscsi::initiator::session::{Command, Outcome};
use braid_iscsi::scsi::sense::status;
use bytes::Bytes;

use super::conn::Conn;
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
) -> Result<Bytes, String> {
    let cmd = Command {
        lun: conn.lun(),
        cdb,
        read,
        write: data.map(Bytes::from),
    };
    let (a, _) = call_past_attentions(conn, cmd, timeout).await?;
    match a.outcome {
        Outcome::Status {
            status: status::GOOD,
            ..
        } => Ok(a.data),
        Outcome::Status {
            status: status::RESERVATION_CONFLICT,
            ..
        } => Err("RESERVATION CONFLICT".into()),
        Outcome::Status {
            status: status::CHECK_CONDITION,
            sense: Some(s),
            ..
        } => Err(s.to_string()),
        o => Err(format!("{o:?}")),
    }
}

async fn out(
    conn: &Conn,
    action: ReserveOut,
    key: u64,
    action_key: u64,
    timeout: Duration,
) -> Result<(), String> {
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
}

/// The keys registered for the unit (PERSISTENT RESERVE IN, READ KEYS).
///
/// # Errors
///
/// The command failed or its answer is short.
pub async fn keys(conn: &Conn, timeout: Duration) -> Result<Vec<u64>, String> {
    let len = 8 + 8 * 64;
    let d = run(
        conn,
        cdb::persistent_reserve_in(0, len),
        None,
        u32::from(len),
        timeout,
    )
    .await?;
    if d.len() < 8 {
        return Err(format!("READ KEYS answered {} bytes", d.len()));
    }
    let listed = u32::from_be_bytes([d[4], d[5], d[6], d[7]]) as usize;
    Ok(d[8..]
        .chunks_exact(8)
        .take(listed / 8)
        .map(|k| u64::from_be_bytes(k.try_into().expect("8 bytes")))
        .collect())
}

/// Preempts (and aborts) every key of `stale` still registered, from
/// `conn`'s registered session.
///
/// # Errors
///
/// A command failed.
pub async fn preempt(conn: &Conn, stale: &[u64], timeout: Duration) -> Result<(), String> {
    let mine = key(conn.logged_in.isid);
    let registered = keys(conn, timeout).await?;
    for k in stale {
        if *k != mine && registered.contains(k) {
            out(conn, ReserveOut::PreemptAndAbort, mine, *k, timeout).await?;
        }
    }
    Ok(())
}

/// Fences the sessions named by `isids` through `spec`: a fresh session
/// joins, preempts and aborts each of their keys still registered, then
/// leaves. Once this returns, none of their commands can still write.
///
/// # Errors
///
/// The session could not be opened, or a command failed: the fence is not
/// confirmed.
pub async fn fence(
    spec: &PathSpec,
    cfg: &SessionConfig,
    isids: &[Isid],
    timeout: Duration,
) -> Result<(), ConnectError> {
    let o = super::open::open(spec, cfg, cfg.next_isid(), timeout).await?;
    let conn = &o.conn;
    let failed = |e: String| ConnectError::Other(format!("{}: fence: {e}", spec.portal));
    let stale: Vec<u64> = isids.iter().map(|i| key(*i)).collect();
    let r = async {
        join(conn, timeout).await?;
        preempt(conn, &stale, timeout).await?;
        leave(conn, timeout).await
    }
    .await;
    conn.logout(timeout).await;
    r.map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_names_its_session() {
        let k = key(Isid([0x80, 1, 2, 3, 4, 5]));
        assert_eq!(k.to_be_bytes(), [b'b', b'r', 0x80, 1, 2, 3, 4, 5]);
    }
}
