//! Which fence an iSCSI unit gets, and the fence by session
//! reinstatement.
//!
//! Before the writes of a failed path are sent again, nothing of its old
//! session may still land. What makes sure of that differs by target,
//! and braid uses only what was shown to hold, in the lab, against a
//! write held in the target's backing store (`tests/iscsi_fences.rs`,
//! `tests/iscsi_reservation_fence.rs`, `tests/iscsi_tasks.rs`):
//!
//! - braid's own target (INQUIRY vendor `BRAID`) completes a login that
//!   reinstates a session only once the old session's tasks have ended
//!   (RFC 7143 6.3.5): reinstatement is the fence;
//! - tgt (vendor `IET`, product `VIRTUAL-DISK`) closes the old
//!   connection on reinstatement but lets the tasks already in its
//!   backing store run on, and completes the login at once. Its iSCSI
//!   layer answers CLEAR TASK SET with "function not supported", while
//!   LOGICAL UNIT RESET walks every I_T nexus of the unit (the old
//!   session's stays listed while its commands run) and answers only once
//!   every command already in the backing store has completed: so the
//!   fence is reinstatement, then LOGICAL UNIT RESET from the reinstating
//!   session. The reset tells every session of the unit POWER ON, RESET
//!   (29h/00h): the volume's own sessions take that one as the fence's
//!   (`before_reset`), not as a restart;
//! - with `--persistent-reservations`, PREEMPT AND ABORT of the failed
//!   session's key ([`super::reserve`]); a key found already gone proves
//!   nothing (an earlier attempt's PREEMPT AND ABORT may still be waiting
//!   for the old tasks), and only braid's target has a barrier to fall
//!   back on (reinstatement, through the failed session's portal group);
//! - any other unit: no fence is known, so the failed path's writes are
//!   held and fail with EIO at the no-path timeout, and newer writes over
//!   them wait as long (the engine's unsettled ranges). LIO is among them
//!   until its reinstatement is shown to wait for running tasks: use
//!   `--persistent-reservations` there.

use std::time::Duration;

use braid_iscsi::initiator::cdb;
use braid_iscsi::initiator::login::{Isid, Kind};
use braid_iscsi::initiator::session::{Event, Session, TaskFunction, RESERVED_TAG};
use braid_iscsi::initiator::unit::Inquiry;
use braid_iscsi::initiator::LoggedIn;
use braid_iscsi::Digests;
use bytes::BytesMut;

use super::discover::exchange;
use super::open::SessionConfig;
use crate::conn::{self, ConnectError, Stream};
use crate::discover::PathSpec;

/// A fence's barrier answers only once the old session's tasks have
/// ended, which a slow disk takes seconds to do: its answer is awaited
/// this many times the connect timeout (as NBD's fence is), so that a
/// slow target is waited for rather than taken for a failed fence.
pub const PATIENCE: u32 = 6;

/// How a volume's failed paths are fenced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fence {
    /// A login with the failed session's ISID (braid's target).
    Reinstatement,
    /// Reinstatement, then LOGICAL UNIT RESET from that session (tgt).
    ReinstatementThenReset,
    /// PREEMPT AND ABORT of the failed session's key; a key found gone is
    /// barred by reinstatement where `reinstate_gone` (braid's target),
    /// else left unconfirmed.
    Reservation { reinstate_gone: bool },
    /// No fence known for the unit (its INQUIRY vendor and product):
    /// writes held, EIO at the no-path timeout.
    Held { unit: String },
    /// Fencing turned off (`--danger-no-fence`): writes re-sent blind.
    Off,
}

/// What a reservation fence still needs after its PREEMPT AND ABORTs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterPreempt {
    /// Every failed session's key was preempted in this attempt.
    Confirmed,
    /// Some were gone already: reinstate those sessions, the barrier.
    Reinstate,
    /// Some were gone already, and no barrier is known through this
    /// portal: not confirmed, the writes stay held.
    Held,
}

/// Targets whose fence braid knows, by their INQUIRY answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Known {
    Braid,
    Tgt,
}

fn known(inquiry: &Inquiry) -> Option<Known> {
    match (inquiry.vendor.as_str(), inquiry.product.as_str()) {
        ("BRAID", _) => Some(Known::Braid),
        // IET, the kernel target tgt grew out of, answered alike, but it
        // is long gone and never was checked here.
        ("IET", "VIRTUAL-DISK") => Some(Known::Tgt),
        _ => None,
    }
}

impl Fence {
    /// The fence for the unit that answered `inquiry`.
    pub fn choose(inquiry: &Inquiry, reservations: bool, no_fence: bool) -> Fence {
        let target = known(inquiry);
        if no_fence {
            Fence::Off
        } else if reservations {
            Fence::Reservation {
                reinstate_gone: target == Some(Known::Braid),
            }
        } else {
            match target {
                Some(Known::Braid) => Fence::Reinstatement,
                Some(Known::Tgt) => Fence::ReinstatementThenReset,
                None => Fence::Held {
                    unit: format!("{} {}", inquiry.vendor, inquiry.product),
                },
            }
        }
    }

    /// The fence's name in `braid status` and its JSON.
    pub fn name(&self) -> &'static str {
        match self {
            Fence::Reinstatement => "reinstatement",
            Fence::ReinstatementThenReset => "reinstatement+lu-reset",
            Fence::Reservation { .. } => "persistent-reservation",
            Fence::Held { .. } => "held",
            Fence::Off => "none",
        }
    }

    /// What proves a reservation fence once PREEMPT AND ABORT was answered
    /// GOOD for every key still registered, when `gone` keys of the failed
    /// sessions were found already gone. A gone key proves nothing: an
    /// earlier attempt's PREEMPT AND ABORT may have removed it and still
    /// be waiting for the tasks it aborts. Only a barrier the target is
    /// known to honour confirms those sessions' fence: reinstatement on
    /// braid's target, through the failed session's own portal group.
    pub fn after_preempt(&self, gone: usize, same_group: bool) -> AfterPreempt {
        match self {
            _ if gone == 0 => AfterPreempt::Confirmed,
            Fence::Reservation {
                reinstate_gone: true,
            } if same_group => AfterPreempt::Reinstate,
            _ => AfterPreempt::Held,
        }
    }

    /// Whether the fence is a login with the failed session's ISID, which
    /// only a portal of that session's portal group can take.
    pub fn reinstates(&self) -> bool {
        matches!(self, Fence::Reinstatement | Fence::ReinstatementThenReset)
    }
}

/// Ends the sessions named by `isids` (sessions of failed paths) by
/// logging in with each ISID through `spec`, then logging out. Where
/// `reset` is given (tgt), the last of those logins first sends LOGICAL
/// UNIT RESET, after calling `reset`, and the fence holds only once it is
/// answered FUNCTION COMPLETE. Each login and the reset are awaited
/// [`PATIENCE`] times `timeout`: braid's target completes the login, and
/// tgt answers the reset, only once the old tasks have ended.
///
/// # Errors
///
/// A login failed, or the reset was not answered FUNCTION COMPLETE: the
/// fence is not confirmed.
pub async fn reinstate(
    spec: &PathSpec,
    cfg: &SessionConfig,
    isids: &[Isid],
    timeout: Duration,
    reset: Option<&(dyn Fn() + Send + Sync)>,
) -> Result<(), ConnectError> {
    let endpoint = spec.portal.to_string();
    let patience = timeout * PATIENCE;
    for (i, isid) in isids.iter().enumerate() {
        let mut stream = conn::dial(&spec.portal, &spec.local, timeout).await?;
        let kind = Kind::Normal {
            target: cfg.target.clone(),
        };
        let login = cfg.login(*isid, kind, rand::random());
        let (logged_in, leftover) =
            super::login::login(&mut stream, login, &endpoint, patience).await?;
        let mut s = Session::new(&logged_in);
        let mut buf = leftover;
        if let (true, Some(before)) = (i + 1 == isids.len(), reset) {
            before();
            let lun = cdb::lun_field(cfg.lun);
            let itt = s.task_management(TaskFunction::LunReset, lun, RESERVED_TAG);
            let response = answer(&mut stream, &mut s, &mut buf, &logged_in, patience, itt)
                .await
                .map_err(|e| ConnectError::Other(format!("{endpoint}: LOGICAL UNIT RESET: {e}")))?;
            if response != 0 {
                return Err(ConnectError::Other(format!(
                    "{endpoint}: LOGICAL UNIT RESET answered {response:#04x}, not FUNCTION \
                     COMPLETE: the fence is not confirmed"
                )));
            }
        }
        let itt = s.logout();
        let _ = answer(&mut stream, &mut s, &mut buf, &logged_in, timeout, itt).await;
    }
    Ok(())
}

/// Sends what `s` has queued and waits up to `limit` for the answer to
/// task `itt`, a task management function's or a logout's: its response
/// code.
async fn answer(
    stream: &mut Box<dyn Stream>,
    s: &mut Session,
    buf: &mut BytesMut,
    logged_in: &LoggedIn,
    limit: Duration,
    itt: u32,
) -> Result<u8, String> {
    let p = logged_in.params;
    let digests = Digests {
        header: p.header_digest,
        data: p.data_digest,
    };
    let picked = exchange(stream, s, buf, digests, p.max_recv_data, |e| match e {
        Event::TaskManagement { itt: t, response } | Event::Logout { itt: t, response }
            if t == itt =>
        {
            Some(response)
        }
        _ => None,
    });
    tokio::time::timeout(limit, picked)
        .await
        .map_err(|_| format!("no answer in {limit:?}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inquiry(vendor: &str, product: &str) -> Inquiry {
        Inquiry {
            qualifier: 0,
            device_type: 0,
            tpgs: 0,
            vendor: vendor.into(),
            product: product.into(),
            revision: "0001".into(),
        }
    }

    #[test]
    fn each_unit_gets_the_fence_shown_to_hold_on_it() {
        let braid = inquiry("BRAID", "multipath volume");
        let tgt = inquiry("IET", "VIRTUAL-DISK");
        let lio = inquiry("LIO-ORG", "FILEIO");
        assert_eq!(Fence::choose(&braid, false, false), Fence::Reinstatement);
        assert_eq!(
            Fence::choose(&tgt, false, false),
            Fence::ReinstatementThenReset
        );
        assert_eq!(
            Fence::choose(&lio, false, false),
            Fence::Held {
                unit: "LIO-ORG FILEIO".into()
            }
        );
        assert_eq!(
            Fence::choose(&braid, true, false),
            Fence::Reservation {
                reinstate_gone: true
            }
        );
        assert_eq!(
            Fence::choose(&lio, true, false),
            Fence::Reservation {
                reinstate_gone: false
            }
        );
        assert_eq!(Fence::choose(&tgt, false, true), Fence::Off);
        assert!(Fence::ReinstatementThenReset.reinstates());
    }

    #[test]
    fn a_reservation_key_found_gone_never_confirms_a_fence_by_itself() {
        let braid = Fence::Reservation {
            reinstate_gone: true,
        };
        let other = Fence::Reservation {
            reinstate_gone: false,
        };
        assert_eq!(braid.after_preempt(0, false), AfterPreempt::Confirmed);
        assert_eq!(other.after_preempt(0, true), AfterPreempt::Confirmed);
        assert_eq!(braid.after_preempt(1, true), AfterPreempt::Reinstate);
        assert_eq!(braid.after_preempt(2, false), AfterPreempt::Held);
        assert_eq!(other.after_preempt(1, true), AfterPreempt::Held);
        assert!(!Fence::Reservation {
            reinstate_gone: true
        }
        .reinstates());
    }
}
