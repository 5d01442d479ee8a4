//! Text Requests of the full feature phase: SendTargets, answered over as
//! many Text Responses as the initiator's MaxRecvDataSegmentLength needs
//! (open-iscsi takes 32 KiB in discovery, and a server with many exports
//! on many portals says more), each further one sent when the initiator
//! asks for it.

use std::net::SocketAddr;
use std::sync::Arc;

use braid_iscsi::discovery;
use braid_iscsi::login::{Session, SessionType};
use braid_iscsi::pdu::{Bhs, Opcode, Pdu};
use braid_iscsi::text_exchange::{Incoming, TextExchange};
use tracing::warn;

use super::answer;
use super::out::{self, Outbox, Sn};
use super::{Served, Shared};

/// Answers one Text Request: the next Text Response of its exchange, or a
/// Reject (reason 0x09) of a request the exchange refuses.
pub(crate) fn respond(
    texts: &mut TextExchange,
    pdu: &Pdu,
    s: &Session,
    visible: &[Arc<Served>],
    shared: &Shared,
    outbox: &Outbox,
) {
    let b = pdu.bhs;
    let part = match texts.receive(&b, &pdu.data) {
        Ok(Incoming::Reply(part)) => part,
        Ok(Incoming::Request(pairs)) => {
            let answer = send_targets(&pairs, s, visible, shared);
            texts.answer(b.itt(), answer)
        }
        Err(e) => {
            warn!("{e}: rejected");
            outbox.send(out::Batch::of(vec![answer::reject(pdu, 0x09)]));
            return;
        }
    };
    let mut r = Bhs::new(Opcode::TextResponse);
    r.set_itt(b.itt());
    r.set_lun(b.lun());
    part.mark(&mut r);
    outbox.pdu(r, part.data, Sn::Takes);
}

/// The answer to the request's SendTargets key (nothing without one).
fn send_targets(
    pairs: &[(String, String)],
    s: &Session,
    visible: &[Arc<Served>],
    shared: &Shared,
) -> Vec<u8> {
    let Some((_, value)) = pairs.iter().find(|(k, _)| k == "SendTargets") else {
        return Vec::new();
    };
    let portals: Vec<(SocketAddr, u16)> = shared.ports.iter().map(|p| (p.addr, p.tag)).collect();
    // Every live gateway's portals too, for an export that several
    // serve (a Ceph image): one discovery finds every path.
    let listings: Vec<discovery::Listing> = visible
        .iter()
        .map(|t| {
            let mut all = portals.clone();
            if let Some(peers) = &t.export.peers {
                all.extend(peers.iscsi_portals());
            }
            discovery::Listing {
                name: t.name.clone(),
                portals: all,
            }
        })
        .collect();
    let discovering = s.kind == SessionType::Discovery;
    discovery::answer(value, &listings, discovering, s.target.as_deref()).unwrap_or_default()
}
