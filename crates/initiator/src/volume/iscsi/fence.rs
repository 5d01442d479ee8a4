//! One attempt at fencing failed iSCSI sessions, as the unit's [`Fence`]
//! says, and the portal groups such a fence may go through.

use std::sync::Arc;

use braid_proto::braid_ns::ConnId;

use super::path::{fenced, isid_of};
use super::{session, Expect};
use crate::discover::PathSpec;
use crate::iscsi::fence::{reinstate, AfterPreempt, Fence};
use crate::volume::core::Shared;
use crate::volume::transport::Unproven;

/// One attempt at an iSCSI fence through `spec`, as the unit's
/// [`Fence`] says.
pub(super) async fn attempt(
    shared: &Arc<Shared>,
    x: &Expect,
    spec: &PathSpec,
    conns: &[ConnId],
    same_group: bool,
) -> Result<(), Unproven> {
    let timeout = shared.settings.connect_timeout;
    let isids: Vec<_> = conns.iter().map(|c| isid_of(*c)).collect();
    let cfg = &x.session;
    match &x.fence {
        Fence::Reinstatement => reinstate(spec, cfg, &isids, timeout, None).await?,
        Fence::ReinstatementThenReset => {
            let expect = || expect_own_reset(shared);
            reinstate(spec, cfg, &isids, timeout, Some(&expect)).await?;
        }
        Fence::Reservation { reinstate_gone } => {
            let gone = crate::iscsi::reserve::fence(spec, cfg, &isids, timeout).await?;
            match x.fence.after_preempt(gone.len(), same_group) {
                AfterPreempt::Confirmed => {}
                AfterPreempt::Reinstate => reinstate(spec, cfg, &gone, timeout, None).await?,
                AfterPreempt::Held => {
                    return Err(Unproven::Held(format!(
                        "{}: fence: the reservation keys of {} failed session(s) were already \
                         gone (an earlier PREEMPT AND ABORT may have gone unanswered), which \
                         proves nothing about their writes: they stay held{}",
                        spec.portal,
                        gone.len(),
                        if *reinstate_gone {
                            " until a portal of the failed session's group answers (the \
                             target's session reinstatement is the barrier), or the no-path \
                             timeout"
                        } else {
                            ", and fail with EIO at the no-path timeout"
                        }
                    )));
                }
            }
            fenced(x, conns);
        }
        Fence::Held { .. } | Fence::Off => {
            return Err(Unproven::Held("no fence is known for this target".into()))
        }
    }
    Ok(())
}

/// Notes that every live session of the volume is owed the unit
/// attention of the LOGICAL UNIT RESET its fence is about to send.
fn expect_own_reset(shared: &Shared) {
    let core = shared.lock();
    let live = core.paths.iter().flat_map(|p| &p.conns).flatten();
    for c in live.filter_map(|l| session(l.as_ref())) {
        c.owe_reset();
    }
}

/// Whether path `via`'s portal is in path `failed`'s iSCSI portal group
/// (a path whose tag is unknown is in no group but its own): a session
/// is reinstated only by a login to a portal of its own group (RFC 7143:
/// a session is its ISID and the group's tag; braid's target and LIO keep
/// sessions per group), so a fence by reinstatement goes through portals
/// with the failed path's tag, which may be its own portal alone: then
/// its writes wait until that portal answers again. A persistent
/// reservation fence, and NBD's, go through any path.
pub(super) fn same_group(tags: &[Option<u16>], failed: usize, via: usize) -> bool {
    let tag = |i: usize| tags.get(i).copied().flatten();
    via == failed || tag(via).is_some_and(|t| Some(t) == tag(failed))
}

#[cfg(test)]
mod tests {
    use super::same_group;

    #[test]
    fn a_session_is_fenced_only_through_its_own_portal_group() {
        // braid's target: a group per portal; only the failed portal.
        let per_portal = [Some(1), Some(2)];
        assert!(same_group(&per_portal, 0, 0));
        assert!(!same_group(&per_portal, 0, 1));
        // tgt, LIO's default: one group for every portal; any of them.
        let one_group = [Some(1), Some(1), Some(1)];
        assert!((0..3).all(|via| same_group(&one_group, 2, via)));
        // A tag never learnt: its own portal only.
        let unknown = [None, None];
        assert!(same_group(&unknown, 1, 1));
        assert!(!same_group(&unknown, 1, 0));
    }
}
