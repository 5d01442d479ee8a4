//! One iSCSI connection: login, then the full feature phase. One
//! connection per session (MaxConnections 1); commands run in CmdSN order
//! as they arrive; WRITE data may be interleaved between commands and is
//! gathered per task.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use braid_iscsi::login::{Session, SessionType, Step, TargetConfig, TargetLogin};
use braid_iscsi::negotiate::{self, Params};
use braid_iscsi::pdu::{Bhs, Framer, Opcode, Pdu};
use braid_iscsi::scsi::respond::{self, Unit};
use braid_iscsi::scsi::sense::status;
use braid_iscsi::scsi::{Command, Delivery, Key, Sense};
use braid_iscsi::transfer::{self, Numbers, WriteTransfer, NO_TAG};
use braid_iscsi::window::{Place, Window};
use braid_iscsi::{discovery, text, Digests};
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::lu::Nexus;
use super::unit::{self, Outcome};
use super::{Served, Shared};

/// Commands the target lets an initiator have outstanding.
const QUEUE_DEPTH: u32 = 64;

/// Bytes of WRITE data one connection may have waiting for their
/// Data-Out. Each waiting WRITE holds its whole buffer, so without a bound
/// an initiator that sends commands and never their data could pin
/// QUEUE_DEPTH x 8 MiB per connection; past it a WRITE is answered TASK
/// SET FULL and the initiator retries it later.
const MAX_PENDING_WRITE_BYTES: usize = 32 << 20;

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

/// A WRITE waiting for its data.
struct PendingWrite {
    cmd: Command,
    lun: u64,
    /// Bytes the CDB names, and bytes the initiator said it would send:
    /// when they differ, only the smaller moves and the response says by
    /// how much (overflow or underflow).
    cdb_bytes: u32,
    expected: u32,
    transfer: WriteTransfer,
    buf: Vec<u8>,
}

struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    framer: Framer,
    digests: Digests,
    stat_sn: u32,
    window: Window,
    out: Vec<u8>,
}

impl Conn {
    async fn next(&mut self, stop: &mut watch::Receiver<bool>) -> Result<Option<Pdu>, String> {
        loop {
            if let Some(p) = self.framer.next(&mut self.buf).map_err(|e| e.to_string())? {
                return Ok(Some(p));
            }
            let n = tokio::select! {
                r = self.stream.read_buf(&mut self.buf) => r.map_err(|e| e.to_string())?,
                _ = stop.wait_for(|s| *s) => return Ok(None),
            };
            if n == 0 {
                return Ok(None);
            }
        }
    }

    fn numbers(&mut self, with_status: bool) -> Numbers {
        let n = Numbers {
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.window.exp,
            max_cmd_sn: self.window.max(),
        };
        if with_status {
            self.stat_sn = self.stat_sn.wrapping_add(1);
        }
        n
    }

    fn queue(&mut self, pdu: &Pdu) {
        pdu.encode(self.digests, &mut self.out);
    }

    async fn flush(&mut self) -> Result<(), String> {
        if !self.out.is_empty() {
            self.stream
                .write_all(&self.out)
                .await
                .map_err(|e| e.to_string())?;
            self.out.clear();
        }
        Ok(())
    }

    /// A response header with the numbers every target PDU carries.
    fn header(&mut self, op: Opcode, itt: u32, with_status: bool) -> Bhs {
        let n = self.numbers(with_status);
        let mut b = Bhs::new(op);
        b.set_final(true);
        b.set_itt(itt);
        b.set_u32(24, n.stat_sn);
        b.set_u32(28, n.exp_cmd_sn);
        b.set_u32(32, n.max_cmd_sn);
        b
    }

    /// A SCSI Response; `have` and `expected` bytes give the residual
    /// (overflow when the command had more data than the initiator
    /// expected, underflow when less). Sent only when no Data-In carried
    /// the status, so ExpDataSN is always 0.
    fn scsi_response(
        &mut self,
        itt: u32,
        outcome_status: u8,
        sense: Bytes,
        have: u32,
        expected: u32,
    ) {
        let mut b = self.header(Opcode::ScsiResponse, itt, true);
        b.0[3] = outcome_status;
        if have > expected {
            b.0[1] |= 0x04;
            b.set_u32(44, have - expected);
        } else if have < expected {
            b.0[1] |= 0x02;
            b.set_u32(44, expected - have);
        }
        self.queue(&Pdu::new(b, sense));
    }

    /// GOOD with `data` for the initiator: in Data-In PDUs, the last
    /// carrying the status, or in a SCSI Response when nothing is sent.
    fn data_in(&mut self, itt: u32, data: Vec<u8>, expected: u32, params: &Params) {
        let have = data.len() as u32;
        if data.is_empty() || expected == 0 {
            self.scsi_response(itt, status::GOOD, Bytes::new(), have, expected);
            return;
        }
        let n = self.numbers(true);
        let data = Bytes::from(data);
        let peer_max = params.peer_max_recv_data;
        for d in transfer::data_in(itt, have, expected, peer_max, params.max_burst, n) {
            let slice = data.slice(d.offset as usize..(d.offset + d.len) as usize);
            self.queue(&Pdu::new(d.bhs, slice));
        }
    }

    /// CHECK CONDITION with `sense`.
    fn check(&mut self, itt: u32, sense: Sense) {
        let segment = Bytes::from(sense.iscsi_segment());
        self.scsi_response(itt, status::CHECK_CONDITION, segment, 0, 0);
    }
}

async fn run(stream: TcpStream, peer: SocketAddr, mut ctx: Ctx) -> Result<(), String> {
    // A client outside an export's allow-list does not see that target
    // at all: not in discovery, and a login naming it finds nothing.
    let visible: Vec<Arc<Served>> = ctx
        .shared
        .targets
        .iter()
        .filter(|t| crate::access::allowed(&t.export.allow, Some(peer.ip())))
        .cloned()
        .collect();
    let mut c = Conn {
        stream,
        buf: BytesMut::with_capacity(64 * 1024),
        framer: Framer::new(8192),
        digests: Digests::default(),
        stat_sn: 0,
        window: Window::new(0, QUEUE_DEPTH),
        out: Vec::new(),
    };
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
        chap: ctx.shared.chap.clone(),
        // A fresh random challenge for every connection (a v4 UUID: 122
        // random bits).
        chap_id: uuid::Uuid::new_v4().as_bytes()[0],
        chap_challenge: *uuid::Uuid::new_v4().as_bytes(),
    });
    let session = loop {
        let Some(pdu) = c.next(&mut ctx.stop).await? else {
            return Ok(());
        };
        match login.handle(&pdu) {
            Step::Continue(resp) => c.queue(&resp),
            Step::Complete(resp, session) => {
                c.queue(&resp);
                break session;
            }
            Step::Fail(resp, st, why) => {
                c.queue(&resp);
                c.flush().await?;
                return Err(format!("login refused ({}/{}): {why}", st.0, st.1));
            }
        }
        c.flush().await?;
    };
    c.flush().await?;
    full_feature(c, *session, visible, ctx).await
}

async fn full_feature(
    mut c: Conn,
    s: Session,
    visible: Vec<Arc<Served>>,
    mut ctx: Ctx,
) -> Result<(), String> {
    c.digests = Digests {
        header: s.params.header_digest,
        data: s.params.data_digest,
    };
    c.framer.set(c.digests, s.params.max_recv_data as usize);
    c.stat_sn = s.stat_sn;
    c.window = Window::new(s.exp_cmd_sn, QUEUE_DEPTH);
    let served = s
        .target
        .as_ref()
        .and_then(|name| visible.iter().find(|t| &t.name == name))
        .cloned();
    info!(
        initiator = %s.initiator,
        target = s.target.as_deref().unwrap_or("(discovery)"),
        "iSCSI login"
    );
    // A normal session is an I_T nexus of its target's unit.
    let lun = served.as_ref().map(|t| {
        let unit = unit::describe(&t.export, &t.name, ctx.tag);
        (t.clone(), unit, t.lu.join())
    });
    let mut writes: HashMap<u32, PendingWrite> = HashMap::new();
    while let Some(pdu) = c.next(&mut ctx.stop).await? {
        let b = pdu.bhs;
        if b.opcode() != Opcode::DataOut {
            // One connection, so commands arrive in CmdSN order; one
            // outside the window the target announced is ignored, as
            // RFC 7143 asks (a gap cannot fill on a single connection).
            let cmd_sn = b.u32_at(24);
            if b.immediate() {
                if !c.window.immediate_ok(cmd_sn) {
                    debug!(cmd_sn, "immediate command outside the window ignored");
                    continue;
                }
            } else if c.window.place(cmd_sn) == Place::Next {
                c.window.advance();
            } else {
                debug!(
                    cmd_sn,
                    exp = c.window.exp,
                    "command outside the window ignored"
                );
                continue;
            }
        }
        match b.opcode() {
            Opcode::NopOut => {
                if b.itt() != NO_TAG {
                    let mut r = c.header(Opcode::NopIn, b.itt(), true);
                    r.set_lun(b.lun());
                    r.set_u32(20, NO_TAG);
                    c.queue(&Pdu::new(r, pdu.data.clone()));
                }
            }
            Opcode::TextRequest => {
                let pairs = text::parse(&pdu.data).map_err(|e| e.to_string())?;
                let portals: Vec<(SocketAddr, u16)> =
                    ctx.shared.ports.iter().map(|p| (p.addr, p.tag)).collect();
                let listings: Vec<discovery::Listing> = visible
                    .iter()
                    .map(|t| discovery::Listing {
                        name: t.name.clone(),
                        portals: portals.clone(),
                    })
                    .collect();
                let mut answer = Vec::new();
                for (k, v) in &pairs {
                    if k == "SendTargets" {
                        let discovering = s.kind == SessionType::Discovery;
                        answer = discovery::answer(v, &listings, discovering, s.target.as_deref())
                            .unwrap_or_default();
                    }
                }
                let mut r = c.header(Opcode::TextResponse, b.itt(), true);
                r.set_u32(20, NO_TAG);
                c.queue(&Pdu::new(r, Bytes::from(answer)));
            }
            Opcode::LogoutRequest => {
                let r = c.header(Opcode::LogoutResponse, b.itt(), true);
                c.queue(&Pdu::new(r, Bytes::new()));
                c.flush().await?;
                debug!("logout");
                return Ok(());
            }
            Opcode::TaskMgmtRequest => {
                // Commands run to completion as they arrive, so only a
                // WRITE still waiting for data can be aborted.
                let function = b.0[1] & 0x7f;
                let response = match function {
                    // ABORT TASK
                    1 => {
                        if writes.remove(&b.u32_at(20)).is_some() {
                            0
                        } else {
                            1 // task does not exist (it already completed)
                        }
                    }
                    // ABORT TASK SET, CLEAR TASK SET, LOGICAL UNIT RESET, TARGET WARM RESET
                    2 | 3 | 5 | 6 => {
                        writes.clear();
                        0
                    }
                    _ => 5, // not supported
                };
                let mut r = c.header(Opcode::TaskMgmtResponse, b.itt(), true);
                r.0[2] = response;
                c.queue(&Pdu::new(r, Bytes::new()));
            }
            Opcode::ScsiCommand => {
                let Some(lun) = lun.as_ref() else {
                    reject(&mut c, &pdu, 0x04);
                    continue;
                };
                command(&mut c, &pdu, lun, &ctx, &s.params, &mut writes).await?;
            }
            Opcode::DataOut => {
                let itt = b.itt();
                let Some(w) = writes.get_mut(&itt) else {
                    reject(&mut c, &pdu, 0x09);
                    continue;
                };
                let at = match w.transfer.data_out(&b, pdu.data.len() as u32) {
                    Ok(at) => at,
                    Err(e) => {
                        // The task cannot complete as sent: it ends with
                        // DATA PHASE ERROR, and the connection carries on.
                        warn!("WRITE data out of turn: {e}");
                        writes.remove(&itt);
                        let sense = Sense::new(Key::AbortedCommand, 0x4b, 0x00);
                        c.check(itt, sense);
                        c.flush().await?;
                        continue;
                    }
                };
                w.buf[at as usize..at as usize + pdu.data.len()].copy_from_slice(&pdu.data);
                if w.transfer.complete() {
                    let w = writes.remove(&itt).expect("present");
                    let (served, unit, _) = lun.as_ref().expect("a write implies a unit");
                    finish_write(&mut c, itt, w, served, unit).await;
                } else {
                    for r2t in w.transfer.r2ts() {
                        let lun = w.lun;
                        let n = c.numbers(false);
                        c.queue(&Pdu::new(r2t.bhs(itt, lun, n), Bytes::new()));
                    }
                }
            }
            other => {
                warn!(?other, "unexpected PDU in the full feature phase");
                reject(&mut c, &pdu, 0x04);
            }
        }
        c.flush().await?;
    }
    Ok(())
}

/// A Reject carrying the offending header (reason 0x04: protocol error,
/// 0x09: invalid PDU field).
fn reject(c: &mut Conn, pdu: &Pdu, reason: u8) {
    let mut r = c.header(Opcode::Reject, NO_TAG, true);
    r.0[2] = reason;
    c.queue(&Pdu::new(r, Bytes::copy_from_slice(&pdu.bhs.0)));
}

async fn command(
    c: &mut Conn,
    pdu: &Pdu,
    (served, unit, nexus): &(Arc<Served>, Unit, Nexus),
    ctx: &Ctx,
    params: &Params,
    writes: &mut HashMap<u32, PendingWrite>,
) -> Result<(), String> {
    let b = pdu.bhs;
    let itt = b.itt();
    let expected = b.u32_at(20);
    let lun = b.lun() >> 48;
    let cmd = match Command::parse(&b.0[32..48]) {
        Ok(cmd) => cmd,
        Err(sense) => {
            c.check(itt, sense);
            return Ok(());
        }
    };
    if lun == 0 {
        // A unit attention pending for this nexus comes first (SAM-5
        // 5.14), then what the port's access state allows.
        match nexus.deliver(&cmd) {
            Delivery::Run => {}
            Delivery::Report(sense) => {
                c.check(itt, sense);
                return Ok(());
            }
            Delivery::AsSenseData(sense) => {
                let alloc = match cmd {
                    Command::RequestSense { alloc } => alloc,
                    _ => 0,
                };
                let data = respond::request_sense(Some(sense), alloc);
                c.data_in(itt, data, expected, params);
                return Ok(());
            }
        }
        if let Err(sense) = ctx.shared.ports.get(ctx.tag).state().check(&cmd) {
            c.check(itt, sense);
            return Ok(());
        }
    }
    if let Some(wanted) = cmd.data_out_len(unit::BLOCK) {
        // Checked before any data is taken: a WRITE's range and size, a
        // parameter list's size.
        let checked = match cmd {
            Command::Write { lba, blocks, .. } => unit::transfer_len(unit, lba, blocks),
            _ if wanted > 65_536 => Err(Sense::PARAMETER_LIST_LENGTH),
            _ => Ok(wanted as u32),
        };
        // What moves is the smaller of what the CDB names and what the
        // initiator expects to send.
        let moved = checked.and_then(|cdb_bytes| {
            let total = cdb_bytes.min(expected);
            match cmd {
                // A partial last block is taken from the wire but not
                // written; the residual tells the initiator.
                Command::Write { lba, fua, .. } => Ok((
                    Command::Write {
                        lba,
                        blocks: total / unit::BLOCK,
                        fua,
                    },
                    cdb_bytes,
                    total,
                )),
                _ if total == cdb_bytes => Ok((cmd, cdb_bytes, total)),
                _ => Err(Sense::PARAMETER_LIST_LENGTH),
            }
        });
        let (cmd, cdb_bytes, total) = match moved {
            Ok(m) => m,
            Err(sense) => {
                c.check(itt, sense);
                return Ok(());
            }
        };
        let pending: usize = writes.values().map(|w| w.buf.len()).sum();
        if pending + total as usize > MAX_PENDING_WRITE_BYTES {
            c.scsi_response(itt, status::TASK_SET_FULL, Bytes::new(), 0, 0);
            return Ok(());
        }
        // Immediate data past what moves is not used (the initiator sent
        // up to its expected length).
        let immediate = pdu.data.len().min(total as usize);
        let transfer = WriteTransfer::new(
            total,
            immediate as u32,
            params.initial_r2t,
            params.first_burst,
            params.max_burst,
            params.max_outstanding_r2t,
        )
        .map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; total as usize];
        buf[..immediate].copy_from_slice(&pdu.data[..immediate]);
        let w = PendingWrite {
            cmd,
            lun,
            cdb_bytes,
            expected,
            transfer,
            buf,
        };
        if w.transfer.complete() {
            finish_write(c, itt, w, served, unit).await;
            return Ok(());
        }
        let mut w = w;
        for r2t in w.transfer.r2ts() {
            let n = c.numbers(false);
            c.queue(&Pdu::new(r2t.bhs(itt, b.lun(), n), Bytes::new()));
        }
        writes.insert(itt, w);
        return Ok(());
    }
    let groups = || ctx.shared.ports.groups();
    match unit::execute(&served.export, unit, lun, cmd, None, groups).await {
        Outcome::Good(data) => c.data_in(itt, data, expected, params),
        Outcome::Check(sense) => c.check(itt, sense),
    }
    Ok(())
}

async fn finish_write(c: &mut Conn, itt: u32, w: PendingWrite, served: &Served, unit: &Unit) {
    let (have, expected) = (w.cdb_bytes, w.expected);
    let mut buf = w.buf;
    if let Command::Write { blocks, .. } = w.cmd {
        buf.truncate((blocks * unit::BLOCK) as usize);
    }
    match unit::execute(&served.export, unit, w.lun, w.cmd, Some(buf), Vec::new).await {
        Outcome::Good(_) => c.scsi_response(itt, status::GOOD, Bytes::new(), have, expected),
        Outcome::Check(sense) => c.check(itt, sense),
    }
}
