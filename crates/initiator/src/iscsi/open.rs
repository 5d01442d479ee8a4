//! Opening one iSCSI path: dial, log in with a fresh ISID, and ask the
//! unit what it is: which unit (VPD 0x83, else VPD 0x80), how large, and
//! in which ALUA state this port stands. A unit attention met on the way
//! is cleared and noted (a reset means the target may have lost what its
//! cache held).

use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use braid_iscsi::chap::Credentials;
use braid_iscsi::initiator::cdb;
use braid_iscsi::initiator::login::{Isid, Kind, LoginConfig};
use braid_iscsi::initiator::sense::{Attention, Verdict};
use braid_iscsi::initiator::session::{Command, Outcome};
use braid_iscsi::initiator::unit::{self, AccessState, Capacity, Identity, Inquiry};
use braid_iscsi::negotiate::Params;
use braid_iscsi::scsi::sense::status;
use bytes::Bytes;

use super::conn::{Answer, Conn, UnitIo};
use crate::conn::{self, ConnectError};
use crate::discover::PathSpec;

/// What every session of a volume logs in with.
#[derive(Debug)]
pub struct SessionConfig {
    pub initiator: String,
    pub target: String,
    pub lun: u16,
    pub chap: Option<Credentials>,
    pub params: Params,
    /// The random part of every ISID this volume uses; each session takes
    /// the next qualifier, so no two share one.
    pub isid_random: u32,
    pub next_qualifier: AtomicU16,
}

impl SessionConfig {
    /// A fresh ISID: each session gets its own, so that logging in never
    /// replaces another live session of this volume, and a failed
    /// session can be ended by logging in with its ISID again.
    pub fn next_isid(&self) -> Isid {
        let q = self.next_qualifier.fetch_add(1, Ordering::Relaxed);
        Isid::random(self.isid_random, q)
    }

    pub fn login(&self, isid: Isid, kind: Kind, chap_random: [u8; 17]) -> LoginConfig {
        let mut challenge = [0u8; 16];
        challenge.copy_from_slice(&chap_random[1..]);
        LoginConfig {
            initiator: self.initiator.clone(),
            kind,
            isid,
            tsih: 0,
            cid: 0,
            cmd_sn: 1,
            chap: self.chap.clone(),
            chap_id: chap_random[0],
            chap_challenge: challenge,
            params: self.params,
        }
    }
}

/// A session open on one path, with what the unit said through it.
#[derive(Debug)]
pub struct Opened {
    pub conn: Conn,
    pub identity: Option<Identity>,
    pub inquiry: Inquiry,
    /// `None` where the port would not say (standby ports need not).
    pub capacity: Option<Capacity>,
    pub relative_port: Option<u16>,
    pub port_group: Option<u16>,
    pub access: AccessState,
    /// A unit attention for a reset came while opening.
    pub reset_seen: bool,
    /// The target's process, from braid's vendor VPD page 0xC0, where
    /// the target has it: a restart is then known by name, not guessed
    /// from a reset every new session may be told of.
    pub instance: Option<u128>,
}

/// Attempts at TEST UNIT READY while the unit reports attentions or is
/// becoming ready.
const READY_TRIES: u32 = 20;

/// Dials `spec`, logs in as `isid` and reads the unit.
///
/// # Errors
///
/// The dial, the login or a command failed, or the unit is not a disk.
pub async fn open(
    spec: &PathSpec,
    cfg: &SessionConfig,
    isid: Isid,
    timeout: Duration,
) -> Result<Opened, ConnectError> {
    let endpoint = spec.portal.to_string();
    let mut stream = conn::dial(&spec.portal, &spec.local, timeout).await?;
    let kind = Kind::Normal {
        target: cfg.target.clone(),
    };
    let login = cfg.login(isid, kind, rand::random());
    let (logged_in, leftover) = super::login::login(&mut stream, login, &endpoint, timeout).await?;
    let unit = UnitIo {
        lun: cdb::lun_field(cfg.lun),
        block_size: 512,
    };
    let conn = Conn::start(stream, leftover, logged_in, unit);
    let other = |why: String| ConnectError::Other(format!("{endpoint}: {why}"));
    let call = |c: [u8; 16], read: u32| {
        conn.call(
            Command {
                lun: unit.lun,
                cdb: c,
                read,
                write: None,
            },
            timeout,
        )
    };
    // INQUIRY is answered whatever attentions are pending or the port's
    // state (SPC-5), so the unit is known before anything else.
    let inquiry = Inquiry::parse(
        &good(call(cdb::inquiry(None, 96), 96).await.map_err(&other)?)
            .map_err(|e| other(format!("INQUIRY: {e}")))?,
    )
    .map_err(|e| other(e.to_string()))?;
    if !inquiry.is_disk() {
        return Err(other(format!(
            "LUN {} of {} is not a disk (peripheral qualifier {}, device type {:#x})",
            cfg.lun, cfg.target, inquiry.qualifier, inquiry.device_type
        )));
    }
    let mut reset_seen = false;
    let mut access = AccessState::ActiveOptimized;
    for attempt in 0.. {
        let a = call(cdb::test_unit_ready(), 0).await.map_err(&other)?;
        match &a.outcome {
            Outcome::Status {
                status: status::GOOD,
                ..
            } => break,
            Outcome::Status {
                status: status::CHECK_CONDITION,
                sense: Some(s),
                ..
            } if attempt < READY_TRIES => match s.verdict() {
                Verdict::Attention(Attention::Reset) => reset_seen = true,
                Verdict::Attention(_) => {}
                Verdict::Retry => tokio::time::sleep(Duration::from_millis(100)).await,
                Verdict::Standby => {
                    access = AccessState::Standby;
                    break;
                }
                Verdict::Unavailable => {
                    access = AccessState::Unavailable;
                    break;
                }
                Verdict::Transitioning => {
                    access = AccessState::Transitioning;
                    break;
                }
                Verdict::Success => break,
                Verdict::Error => return Err(other(format!("TEST UNIT READY: {s}"))),
            },
            o => return Err(other(format!("TEST UNIT READY: {o:?}"))),
        }
    }
    let designators = match call(cdb::inquiry(Some(0x83), 1024), 1024)
        .await
        .map_err(&other)?
    {
        a if is_good(&a) => unit::designators(&a.data).map_err(|e| other(e.to_string()))?,
        _ => Default::default(),
    };
    let identity = match designators.identity {
        Some(id) => Some(id),
        None => match call(cdb::inquiry(Some(0x80), 255), 255)
            .await
            .map_err(&other)?
        {
            a if is_good(&a) => unit::serial(&a.data)
                .ok()
                .and_then(|s| unit::fallback_identity(&inquiry, &s)),
            _ => None,
        },
    };
    let instance = match call(cdb::inquiry(Some(0x00), 255), 255)
        .await
        .map_err(&other)?
    {
        a if is_good(&a) && a.data.get(4..).is_some_and(|pages| pages.contains(&0xc0)) => {
            match call(cdb::inquiry(Some(0xc0), 255), 255)
                .await
                .map_err(&other)?
            {
                a if is_good(&a) => braid_iscsi::scsi::decode_instance_page(&a.data),
                _ => None,
            }
        }
        _ => None,
    };
    let capacity = match call(cdb::read_capacity16(32), 32).await.map_err(&other)? {
        a if is_good(&a) => Some(unit::capacity16(&a.data).map_err(|e| other(e.to_string()))?),
        _ if access != AccessState::ActiveOptimized => None,
        a => return Err(other(format!("READ CAPACITY (16): {:?}", a.outcome))),
    };
    if let Some(c) = capacity {
        conn.set_block_size(c.block_size);
    }
    if inquiry.tpgs != 0 {
        let p = port_state(
            &conn,
            unit.lun,
            designators.relative_port,
            designators.port_group,
            timeout,
        )
        .await
        .map_err(&other)?;
        reset_seen |= p.attentions.contains(&Attention::Reset);
        access = p.access.unwrap_or(access);
    }
    Ok(Opened {
        conn,
        identity,
        inquiry,
        capacity,
        relative_port: designators.relative_port,
        port_group: designators.port_group,
        access,
        reset_seen,
        instance,
    })
}

/// Sends `cmd` until it is answered by something other than a unit
/// attention: a target reports a pending attention in place of the next
/// command's answer (SPC-5), so the command is sent again, up to one try
/// per kind of attention a target may have queued. Returns the answer
/// (the last attention's, past the tries) and the attentions met, which
/// the caller must act on: one may say that the unit was reset.
///
/// # Errors
///
/// The connection ended or the command timed out.
pub async fn call_past_attentions(
    conn: &Conn,
    cmd: Command,
    timeout: Duration,
) -> Result<(Answer, Vec<Attention>), String> {
    const TRIES: usize = 4;
    let mut attentions = Vec::new();
    loop {
        let a = conn.call(cmd.clone(), timeout).await?;
        let attention = match &a.outcome {
            Outcome::Status {
                status: status::CHECK_CONDITION,
                sense: Some(s),
                ..
            } => match s.verdict() {
                Verdict::Attention(at) => Some(at),
                _ => None,
            },
            _ => None,
        };
        match attention {
            Some(at) if attentions.len() < TRIES => attentions.push(at),
            _ => return Ok((a, attentions)),
        }
    }
}

/// This port's ALUA state from REPORT TARGET PORT GROUPS: the group that
/// lists its relative port (or, failing that, has its group id). `None`
/// when the target does not say. Sent past unit attentions
/// ([`call_past_attentions`]), which are returned.
///
/// # Errors
///
/// The connection ended or the answer cannot be read.
pub async fn port_state(
    conn: &Conn,
    lun: u64,
    port: Option<u16>,
    group: Option<u16>,
    timeout: Duration,
) -> Result<PortState, String> {
    let len = 4096;
    let cmd = Command {
        lun,
        cdb: cdb::report_target_port_groups(len),
        read: len,
        write: None,
    };
    let (a, attentions) = call_past_attentions(conn, cmd, timeout).await?;
    if !is_good(&a) {
        return Ok(PortState {
            access: None,
            attentions,
        });
    }
    let groups = unit::port_groups(&a.data).map_err(|e| e.to_string())?;
    let mine = groups
        .iter()
        .find(|g| port.is_some_and(|p| g.ports.contains(&p)))
        .or_else(|| groups.iter().find(|g| Some(g.id) == group));
    Ok(PortState {
        access: mine.map(|g| g.state),
        attentions,
    })
}

/// What [`port_state`] learned.
#[derive(Debug, Default)]
pub struct PortState {
    /// The port's state, when the target said.
    pub access: Option<AccessState>,
    /// Unit attentions met on the way.
    pub attentions: Vec<Attention>,
}

fn is_good(a: &Answer) -> bool {
    matches!(
        a.outcome,
        Outcome::Status {
            status: status::GOOD,
            ..
        }
    )
}

/// The data of a command that must succeed.
fn good(a: Answer) -> Result<Bytes, String> {
    if is_good(&a) {
        Ok(a.data)
    } else {
        Err(format!("{:?}", a.outcome))
    }
}
