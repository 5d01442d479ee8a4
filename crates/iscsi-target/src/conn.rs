//! One iSCSI connection: login, then the full feature phase. One
//! connection per session (MaxConnections 1). The reader takes PDUs in
//! order and keeps the command window; SCSI commands run as tasks of
//! their own ([`super::command`]); everything sent goes through one
//! writer ([`super::out`]).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use braid_iscsi::login::{Session, Step, TargetConfig, TargetLogin};
use braid_iscsi::negotiate::{self, Params};
use braid_iscsi::pdu::{Bhs, Framer, Opcode, Pdu};
use braid_iscsi::text_exchange::TextExchange;
use braid_iscsi::transfer::NO_TAG;
use braid_iscsi::window::{Immediate, Place, Window};
use braid_iscsi::Digests;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::answer;
use super::command::{Commands, Lun};
use super::member::Member;
use super::out::{self, lock, Batch, Out, Outbox, Slot, Sn};
use super::sessions::{Key, Registration};
use super::timers::{Liveness, Tick};
use super::{textreq, tmf, unit, Served, Shared};

/// Commands the target lets an initiator have running at once, unless
/// the limits' `max_requests` is lower.
const QUEUE_DEPTH: u32 = 64;

/// How long a session has to log out once the server stops (the Async
/// Message's Parameter3) before its connection is closed anyway.
const LOGOUT_GRACE_SECS: u16 = 2;

pub(crate) struct Ctx {
    pub shared: Arc<Shared>,
    /// The portal group (and target port) the connection came in on.
    pub tag: u16,
    pub stop: watch::Receiver<bool>,
}

pub(crate) async fn serve(stream: TcpStream, peer: SocketAddr, ctx: Ctx) {
    let span = tracing::info_span!("iscsi", %peer);
    let _ = tracing::Instrument::instrument(run(stream, peer, ctx), span.clone())
        .await
        .map_err(|e| span.in_scope(|| info!("iSCSI connection closed: {e}")));
}

/// Reads into `buf` until `framer` has a whole PDU; `None` at the end of
/// the stream.
async fn next_pdu(
    stream: &mut (impl AsyncReadExt + Unpin),
    buf: &mut BytesMut,
    framer: &Framer,
) -> Result<Option<Pdu>, String> {
    loop {
        if let Some(p) = framer.next(buf).map_err(|e| e.to_string())? {
            return Ok(Some(p));
        }
        if stream.read_buf(buf).await.map_err(|e| e.to_string())? == 0 {
            return Ok(None);
        }
    }
}

async fn run(mut stream: TcpStream, peer: SocketAddr, mut ctx: Ctx) -> Result<(), String> {
    // A client outside an export's allow-list does not see that target
    // at all: not in discovery, and a login naming it finds nothing.
    let visible: Vec<Arc<Served>> = ctx
        .shared
        .targets
        .iter()
        .filter(|t| crate::access::allowed(&t.export.allow, Some(peer.ip())))
        .cloned()
        .collect();
    let ours = Params {
        max_recv_data: 262_144,
        max_burst: 1 << 20,
        first_burst: 65_536,
        initial_r2t: false,
        immediate_data: true,
        max_outstanding_r2t: 1,
        ..Params::default()
    };
    let mut login = TargetLogin::new(TargetConfig {
        targets: visible.iter().map(|t| t.name.clone()).collect(),
        params: ours,
        digests: negotiate::Digests {
            none: true,
            crc32c: true,
        },
        portal_group_tag: ctx.tag,
        access: ctx.shared.access.clone(),
        // A fresh random challenge for every connection (a v4 UUID: 122
        // random bits).
        chap_id: uuid::Uuid::new_v4().as_bytes()[0],
        chap_challenge: *uuid::Uuid::new_v4().as_bytes(),
    });
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut framer = Framer::new(8192);
    let mut out = Vec::new();
    // A client that connects and never logs in would hold the connection
    // (and its place under the limits) for ever.
    let login_by = tokio::time::Instant::now() + ctx.shared.limits.handshake_timeout;
    let session = loop {
        let pdu = tokio::select! {
            p = next_pdu(&mut stream, &mut buf, &framer) => p?,
            _ = ctx.stop.wait_for(|s| *s) => None,
            () = tokio::time::sleep_until(login_by) => {
                return Err(format!(
                    "no login within {:?} (--handshake-timeout)",
                    ctx.shared.limits.handshake_timeout
                ));
            }
        };
        let Some(pdu) = pdu else { return Ok(()) };
        let (resp, done) = match login.handle(&pdu) {
            Step::Continue(resp) => (resp, None),
            Step::Complete(resp, session) => (resp, Some(session)),
            Step::Fail(resp, st, why) => {
                out.clear();
                resp.encode(Digests::default(), &mut out);
                let _ = stream.write_all(&out).await;
                return Err(format!("login refused ({}/{}): {why}", st.0, st.1));
            }
        };
        if let Some(session) = done {
            break (resp, *session);
        }
        out.clear();
        resp.encode(Digests::default(), &mut out);
        stream.write_all(&out).await.map_err(|e| e.to_string())?;
    };
    let (last, s) = session;
    // What this initiator's grant does not reach it never sees, in
    // discovery or beyond.
    let visible: Vec<Arc<Served>> = visible
        .into_iter()
        .filter(|t| ctx.shared.access.sees(&s.initiator, &t.name))
        .collect();
    let served = s
        .target
        .as_ref()
        .and_then(|name| visible.iter().find(|t| &t.name == name))
        .cloned();
    // In the registry a gateway's fence reaches, under its export, before
    // the login completes.
    let member = match &served {
        Some(t) => {
            let portal = stream
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default();
            let m = Member::enter(&ctx.shared.connections, peer, portal, &t.export.name);
            // After the export is recorded: a gateway that switches to a
            // new RADOS client either cuts this session by its export or
            // is seen here.
            if t.export
                .peers
                .as_ref()
                .is_some_and(|p| !p.admits(m.conn.id))
            {
                return Err("login closed: the gateway is reconnecting to its cluster \
                     (it lost its right to write); the initiator logs in again"
                    .into());
            }
            Some(m)
        }
        None => None,
    };
    // A login that reinstates a session completes only once the old one
    // has ended, every task with it.
    let registration = match &served {
        Some(t) => Some(
            ctx.shared
                .sessions
                .enter(Key {
                    initiator: s.initiator.clone(),
                    isid: s.isid,
                    target: t.name.clone(),
                    tag: ctx.tag,
                })
                .await,
        ),
        None => None,
    };
    out.clear();
    last.encode(Digests::default(), &mut out);
    stream.write_all(&out).await.map_err(|e| e.to_string())?;
    info!(
        initiator = %s.initiator,
        target = s.target.as_deref().unwrap_or("(discovery)"),
        "iSCSI login"
    );
    framer.set(digests(&s.params), s.params.max_recv_data as usize);
    let joined = Joined {
        served,
        registration,
        member,
    };
    full_feature(stream, buf, framer, s, joined, visible, ctx).await
}

/// What a normal session joined at login: its target, its place among
/// the target's sessions (reinstatement) and in the connection registry
/// (fences); all `None` for a discovery session.
struct Joined {
    served: Option<Arc<Served>>,
    registration: Option<Registration>,
    member: Option<Member>,
}

fn digests(p: &Params) -> Digests {
    Digests {
        header: p.header_digest,
        data: p.data_digest,
    }
}

#[allow(clippy::too_many_arguments)]
async fn full_feature(
    stream: TcpStream,
    mut buf: BytesMut,
    framer: Framer,
    s: Session,
    joined: Joined,
    visible: Vec<Arc<Served>>,
    mut ctx: Ctx,
) -> Result<(), String> {
    let Joined {
        served,
        registration,
        mut member,
    } = joined;
    let limits = &ctx.shared.limits;
    let depth = QUEUE_DEPTH.min(u32::try_from(limits.max_requests).unwrap_or(u32::MAX));
    let window = Arc::new(Mutex::new(Window::new(s.exp_cmd_sn, depth.max(1))));
    let idle_timeout = limits.idle_timeout;
    let (mut rd, wr) = stream.into_split();
    let (outbox, mut writer) = out::start(
        wr,
        digests(&s.params),
        s.stat_sn,
        window.clone(),
        ctx.shared.limits.send_timeout,
    );
    // A normal session is an I_T nexus of its target's unit.
    let mut cmds = served.map(|t| {
        let lun = Lun {
            described: unit::Described::of(&t.export, &t.name, ctx.tag, ctx.shared.instance),
            nexus: t.lu.join(braid_iscsi::scsi::NexusName::new(
                &s.initiator,
                s.isid,
                ctx.tag,
            )),
            hold: ctx.shared.hold_for(&s.initiator),
            lost: Arc::new(tokio::sync::Notify::new()),
            conn: member.as_ref().map(|m| m.conn.clone()),
            shared: ctx.shared.clone(),
            tag: ctx.tag,
            served: t,
        };
        Commands::new(Arc::new(lun), outbox.clone(), s.params)
    });
    let owner = cmds.as_ref().map(|c| c.owner.clone());
    let lost = cmds.as_ref().map(|c| c.lun.lost.clone());
    let mut replaced = registration.as_ref().map(|r| r.stop.clone());
    // Once the server stops, the initiator is asked to log out (so it
    // moves its I/O elsewhere at once) and given a moment to.
    let mut leaving: Option<tokio::time::Instant> = None;
    let mut texts = TextExchange::new(s.params.peer_max_recv_data as usize);
    // When the last PDU came: a session with nothing in flight that sends
    // none for the idle timeout is closed, as an idle NBD connection is
    // (initiators' NOP-Out pings keep a live one open).
    let mut last = tokio::time::Instant::now();
    let mut alive = Liveness::new(&ctx.shared.timers, std::time::Instant::now());
    // Set when the initiator is taken for gone: what is queued for it is
    // dropped, not waited on (it may never read again).
    let mut cut = false;
    // Set when the registry cut the connection (a fence, or a gateway
    // that lost its right to write): nothing more is answered.
    let mut fenced = false;
    let result = loop {
        // While the writer is behind, no more PDUs are taken: what they
        // would answer could only wait in memory (see `out.rs`).
        let room = outbox.has_room();
        let next = if room {
            framer.next(&mut buf)
        } else {
            Ok(None)
        };
        let pdu = match next {
            Ok(Some(p)) => p,
            Err(e) => break Err(e.to_string()),
            Ok(None) => {
                // While commands run, look again a timeout later.
                let idle = idle_timeout.map(|t| {
                    let quiet = cmds.as_mut().is_none_or(|c| c.idle());
                    let at = if quiet {
                        last + t
                    } else {
                        tokio::time::Instant::now() + t
                    };
                    (at, quiet, t)
                });
                tokio::select! {
                    r = rd.read_buf(&mut buf), if room => match r {
                        Ok(0) => break Ok(()),
                        Ok(_) => continue,
                        Err(e) => break Err(e.to_string()),
                    },
                    () = outbox.room(), if !room => continue,
                    // The writer ends first only when the socket failed or
                    // the initiator took nothing for --send-timeout:
                    // nothing more can be answered.
                    w = &mut writer => {
                        cut = true;
                        break Err(match w {
                            Ok(Err(e)) => format!("sending: {e}"),
                            _ => "the connection's writer stopped".into(),
                        });
                    }
                    () = super::member::cut_off(member.as_mut()) => {
                        (cut, fenced) = (true, true);
                        break Err(
                            "closed unanswered: a fence named this session, or the gateway \
                             lost its right to write"
                                .into(),
                        );
                    }
                    () = notified(lost.as_deref()) => {
                        break Err("the storage is lost to this server: closing".into());
                    }
                    () = notified(owner.as_deref()) => {
                        if let Some(c) = cmds.as_mut() {
                            c.sweep();
                        }
                        continue;
                    }
                    _ = ctx.stop.wait_for(|s| *s), if leaving.is_none() => {
                        if cmds.is_none() {
                            break Ok(());
                        }
                        outbox.pdu(logout_request(), Bytes::new(), Sn::Takes);
                        let grace = std::time::Duration::from_secs(LOGOUT_GRACE_SECS.into());
                        leaving = Some(tokio::time::Instant::now() + grace);
                        continue;
                    }
                    () = until(idle.map(|i| i.0)) => {
                        if let Some((_, true, t)) = idle {
                            info!("idle for {t:?} (--idle-timeout): closing");
                            break Ok(());
                        }
                        continue;
                    }
                    // Not while the reader is held back: the data may be
                    // waiting, unread, in the socket.
                    () = until(cmds.as_ref().and_then(|c| c.data_out_due()).map(at)), if room => {
                        let now = std::time::Instant::now();
                        if let Some((itt, waited)) =
                            cmds.as_ref().and_then(|c| c.data_out_overdue(now))
                        {
                            cut = true;
                            break Err(format!(
                                "no Data-Out for task {itt:#x} in {waited:?} \
                                 (--iscsi-dataout-timeout): closing the connection"
                            ));
                        }
                        continue;
                    }
                    () = until(alive.next(outbox.taking()).map(at)) => {
                        match alive.tick(std::time::Instant::now(), outbox.taking()) {
                            Tick::Wait => {}
                            Tick::Ping(tag) => {
                                debug!(tag, "NOP-In ping");
                                outbox.pdu(ping(tag), Bytes::new(), Sn::Shows);
                            }
                            Tick::Dead(waited) => {
                                cut = true;
                                break Err(format!(
                                    "no answer to a NOP-In ping in {waited:?}, and nothing \
                                     taken from the socket meanwhile (--iscsi-nopin-timeout): \
                                     closing the connection and its session"
                                ));
                            }
                        }
                        continue;
                    }
                    () = until(leaving) => {
                        info!("no logout after the server stopped: closing");
                        break Ok(());
                    }
                    () = stopped(replaced.as_mut()) => {
                        info!("session reinstated by a new login: closing this one");
                        break Ok(());
                    }
                }
            }
        };
        last = tokio::time::Instant::now();
        alive.heard(std::time::Instant::now(), outbox.taking());
        match handle(
            &pdu,
            &s,
            &window,
            &outbox,
            cmds.as_mut(),
            &mut texts,
            &visible,
            &ctx,
        )
        .await
        {
            Ok(true) => {}
            Ok(false) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    if fenced {
        // Whatever its tasks still finish is not answered.
        writer.abort();
    }
    if let Some(c) = cmds.as_mut() {
        c.shutdown().await;
    }
    drop(cmds);
    drop(outbox);
    if cut {
        writer.abort();
    } else {
        let _ = writer.await;
    }
    drop(registration);
    // Every task has ended: a drain of this session may now return.
    drop(member);
    result
}

/// An Async Message asking the initiator to log out within
/// [`LOGOUT_GRACE_SECS`] (RFC 7143 11.9.1, AsyncEvent 1).
fn logout_request() -> Bhs {
    let mut b = Bhs::new(Opcode::AsyncMessage);
    b.set_final(true);
    b.set_itt(NO_TAG);
    b.0[36] = 1;
    b.0[42..44].copy_from_slice(&LOGOUT_GRACE_SECS.to_be_bytes());
    b
}

/// A NOP-In ping asking for an answer (RFC 7143 11.19: a Target
/// Transfer Tag other than 0xffffffff, Initiator Task Tag 0xffffffff).
fn ping(tag: u32) -> Bhs {
    let mut b = Bhs::new(Opcode::NopIn);
    b.set_final(true);
    b.set_itt(NO_TAG);
    b.set_u32(20, tag);
    b
}

fn at(t: std::time::Instant) -> tokio::time::Instant {
    tokio::time::Instant::from_std(t)
}

async fn until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn notified(n: Option<&tokio::sync::Notify>) {
    match n {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

async fn stopped(r: Option<&mut watch::Receiver<bool>>) {
    match r {
        Some(r) => {
            let _ = r.wait_for(|s| *s).await;
        }
        None => std::future::pending().await,
    }
}

/// One PDU of the full feature phase; `false` when the connection is to
/// end (a logout).
#[allow(clippy::too_many_arguments)]
async fn handle(
    pdu: &Pdu,
    s: &Session,
    window: &out::SharedWindow,
    outbox: &Outbox,
    cmds: Option<&mut Commands>,
    texts: &mut TextExchange,
    visible: &[Arc<Served>],
    ctx: &Ctx,
) -> Result<bool, String> {
    let b = pdu.bhs;
    if b.opcode() == Opcode::DataOut {
        match cmds {
            Some(c) if c.awaits_data(b.itt()) => c.data_out(pdu),
            _ => outbox.send(Batch::of(vec![answer::reject(pdu, 0x09)])),
        }
        return Ok(true);
    }
    // One connection, so commands arrive in CmdSN order; one outside the
    // window the target announced is ignored, as RFC 7143 asks (a gap
    // cannot fill on a single connection).
    let cmd_sn = b.u32_at(24);
    let slot = {
        let mut w = lock(window);
        if b.immediate() && b.opcode() == Opcode::ScsiCommand {
            match w.take_immediate(cmd_sn) {
                Immediate::Take => Slot::immediate(window),
                Immediate::Reject => {
                    drop(w);
                    debug!(cmd_sn, "immediate command past the bound rejected");
                    outbox.send(Batch::of(vec![answer::reject(pdu, 0x06)]));
                    return Ok(true);
                }
                Immediate::Ignore => {
                    debug!(cmd_sn, "immediate command outside the window ignored");
                    return Ok(true);
                }
            }
        } else if b.immediate() {
            if !w.immediate_ok(cmd_sn) {
                debug!(cmd_sn, "immediate command outside the window ignored");
                return Ok(true);
            }
            Slot::none()
        } else if w.place(cmd_sn) == Place::Next {
            w.take();
            drop(w);
            Slot::taken(window)
        } else {
            debug!(cmd_sn, exp = w.exp, "command outside the window ignored");
            return Ok(true);
        }
    };
    let reply = |op: Opcode| {
        let mut r = Bhs::new(op);
        r.set_final(true);
        r.set_itt(b.itt());
        r
    };
    match b.opcode() {
        Opcode::NopOut => {
            if b.itt() != NO_TAG {
                let mut r = reply(Opcode::NopIn);
                r.set_lun(b.lun());
                r.set_u32(20, NO_TAG);
                let data = answer::echo(&pdu.data, s.params.peer_max_recv_data);
                outbox.send(Batch::of(vec![Out::new(r, data, Sn::Takes)]).with_slot(slot));
            } else {
                debug!(tag = b.u32_at(20), "NOP-In ping answered");
            }
        }
        Opcode::TextRequest => textreq::respond(texts, pdu, s, visible, &ctx.shared, outbox),
        Opcode::LogoutRequest => {
            // Commands already taken finish and are answered first.
            if let Some(c) = cmds {
                c.drain().await;
                c.lun.logging_out().await;
            }
            outbox.pdu(reply(Opcode::LogoutResponse), Bytes::new(), Sn::Takes);
            debug!("logout");
            return Ok(false);
        }
        Opcode::TaskMgmtRequest => {
            let Some(c) = cmds else {
                outbox.send(Batch::of(vec![answer::reject(pdu, 0x04)]));
                return Ok(true);
            };
            let (lun, outbox, req) = (c.lun.clone(), outbox.clone(), pdu.clone());
            let exp = lock(window).exp;
            c.spawn(async move {
                let code = tmf::perform(&lun, &req.bhs, exp).await;
                let r = Out::new(tmf::response(&req, code), Bytes::new(), Sn::Takes);
                outbox.send(Batch::of(vec![r]).with_slot(slot));
            });
        }
        Opcode::ScsiCommand => match cmds {
            Some(c) => c.command(pdu, slot),
            None => outbox.send(Batch::of(vec![answer::reject(pdu, 0x04)])),
        },
        other => {
            warn!(?other, "unexpected PDU in the full feature phase");
            outbox.send(Batch::of(vec![answer::reject(pdu, 0x04)]));
        }
    }
    Ok(true)
}
