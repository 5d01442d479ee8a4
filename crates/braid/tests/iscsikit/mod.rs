//! A small iSCSI initiator for tests, on `braid-iscsi`'s framing: log in
//! to a normal session and run SCSI commands with exact bytes, one at a
//! time or several in flight, with the status, sense and data of each
//! handed back to the test. Deliberately plain (immediate data, then
//! Data-Out as R2Ts ask), so that a test controls what the target sees;
//! interop with real initiators is libiscsi's part.

#![allow(dead_code)]

pub mod commands;
pub mod inproc;
pub mod vpd;

#[allow(unused_imports)] // not every test binary sends these
pub use commands::*;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use braid_iscsi::pdu::{Bhs, Framer, Opcode, Pdu};
use braid_iscsi::{text, Digests};
use bytes::{Bytes, BytesMut};

/// What a command came back with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u8,
    /// Sense key, ASC and ASCQ of a CHECK CONDITION.
    pub sense: Option<(u8, u8, u8)>,
    /// The fixed sense data's INFORMATION field, when VALID is set (the
    /// offset of the first byte that differed, for a MISCOMPARE).
    pub information: Option<u32>,
    pub data: Vec<u8>,
}

impl Reply {
    pub fn good(&self) -> bool {
        self.status == 0
    }
}

pub const GOOD: u8 = 0x00;
/// UNIT ATTENTION, POWER ON, RESET, OR BUS DEVICE RESET OCCURRED.
pub const POWER_ON: (u8, u8, u8) = (0x6, 0x29, 0x00);
pub const CHECK_CONDITION: u8 = 0x02;
pub const RESERVATION_CONFLICT: u8 = 0x18;

/// A command sent and not yet answered.
struct Task {
    data_out: Vec<u8>,
    data_in: Vec<u8>,
    /// Bytes of Data-In received.
    received: usize,
}

pub struct Initiator {
    stream: TcpStream,
    framer: Framer,
    buf: BytesMut,
    cmd_sn: u32,
    exp_stat_sn: u32,
    itt: u32,
    /// The target's MaxRecvDataSegmentLength.
    max_send: usize,
    tasks: HashMap<u32, Task>,
    done: HashMap<u32, Reply>,
    /// PDUs that answer no command (Async Messages, NOP-Ins, task
    /// management responses), in arrival order.
    pub other: Vec<Pdu>,
    /// R2Ts received.
    pub r2ts: usize,
    /// The CmdSN each task was sent with.
    issued: HashMap<u32, u32>,
    /// InitialR2T as negotiated, and FirstBurstLength.
    initial_r2t: bool,
    first_burst: usize,
    /// The LUN commands go to (0 unless a test sets it: tgt's disks start
    /// at 1).
    pub lun: u16,
    /// Digests as negotiated.
    digests: Digests,
    /// Send SCSI commands immediate (I bit set, CmdSN not advanced).
    pub immediate: bool,
}

/// Who logs in, and how.
pub struct LoginAs<'a> {
    pub initiator: &'a str,
    pub isid: [u8; 6],
    /// Offer InitialR2T=No (unsolicited Data-Out up to FirstBurstLength).
    pub unsolicited: bool,
    /// MaxRecvDataSegmentLength declared to the target.
    pub max_recv: u32,
}

/// `initiator`'s session `isid` (the last byte of the ISID; the rest is
/// the default's), without unsolicited data.
pub fn who(initiator: &str, isid: u8) -> LoginAs<'_> {
    LoginAs {
        initiator,
        isid: [0x80, 0, 0, 0x42, 0, isid],
        unsolicited: false,
        max_recv: 1 << 20,
    }
}

pub const DEFAULT_INITIATOR: LoginAs<'static> = LoginAs {
    initiator: "iqn.2026-11.org.braid-storage:test-initiator",
    isid: [0x80, 0, 0, 0x42, 0, 1],
    unsolicited: false,
    max_recv: 1 << 20,
};

impl Initiator {
    /// Logs in to `target` at `addr`, straight into the operational stage.
    pub fn login(addr: std::net::SocketAddr, target: &str) -> Initiator {
        Self::login_as(addr, target, &DEFAULT_INITIATOR)
    }

    /// Logs in as `who`, and takes the power on unit attention a port new
    /// to the target is owed with a TEST UNIT READY, as initiators do
    /// first.
    pub fn login_as(addr: std::net::SocketAddr, target: &str, who: &LoginAs) -> Initiator {
        let mut i = Self::login_raw_as(addr, target, who);
        let r = i.exec(&[0, 0, 0, 0, 0, 0], &[], 0);
        assert!(
            r.good() || r.sense == Some(POWER_ON),
            "TEST UNIT READY after login: {r:?}"
        );
        i
    }

    /// Logs in as `who`, sending nothing else: unit attentions the target
    /// owes the new nexus are still pending.
    pub fn login_raw_as(addr: std::net::SocketAddr, target: &str, who: &LoginAs) -> Initiator {
        let stream = TcpStream::connect(addr).expect("connect to the iSCSI portal");
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut i = Initiator {
            stream,
            framer: Framer::new(1 << 20),
            buf: BytesMut::new(),
            cmd_sn: 1,
            exp_stat_sn: 0,
            itt: 1,
            max_send: 8192,
            tasks: HashMap::new(),
            done: HashMap::new(),
            other: Vec::new(),
            r2ts: 0,
            issued: HashMap::new(),
            initial_r2t: true,
            first_burst: 65536,
            lun: 0,
            digests: Digests::default(),
            immediate: false,
        };
        let mut b = Bhs::new(Opcode::LoginRequest);
        b.set_immediate(true);
        b.0[1] = 0x80 | (1 << 2) | 3; // T, operational -> full feature
        b.0[8..14].copy_from_slice(&who.isid);
        b.set_itt(0);
        b.set_u32(24, i.cmd_sn);
        let max_recv = who.max_recv.to_string();
        let keys = text::encode(&[
            ("InitiatorName", who.initiator),
            ("SessionType", "Normal"),
            ("TargetName", target),
            ("HeaderDigest", "CRC32C,None"),
            ("DataDigest", "CRC32C,None"),
            ("MaxRecvDataSegmentLength", &max_recv),
            ("InitialR2T", if who.unsolicited { "No" } else { "Yes" }),
            ("ImmediateData", "Yes"),
        ]);
        i.send(&Pdu::new(b, Bytes::from(keys)), Digests::default());
        let resp = i.recv();
        assert_eq!(resp.bhs.opcode(), Opcode::LoginResponse);
        assert_eq!((resp.bhs.0[36], resp.bhs.0[37]), (0, 0), "login status");
        assert_eq!(resp.bhs.0[1] & 0x83, 0x83, "moved to full feature");
        let answers = text::parse(&resp.data).expect("login answer text");
        let get = |k: &str| {
            answers
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no {k} in {answers:?}"))
        };
        // braid's target takes CRC32C; tgt has no digests.
        i.digests = Digests {
            header: get("HeaderDigest") == "CRC32C",
            data: get("DataDigest") == "CRC32C",
        };
        // Not declared (tgt): RFC 7143's default, 8192.
        if let Some((_, v)) = answers
            .iter()
            .find(|(k, _)| k == "MaxRecvDataSegmentLength")
        {
            i.max_send = v.parse().expect("a number");
        }
        i.initial_r2t = get("InitialR2T") == "Yes";
        if let Some((_, v)) = answers.iter().find(|(k, _)| k == "FirstBurstLength") {
            i.first_burst = v.parse().expect("a number");
        }
        i.exp_stat_sn = resp.bhs.u32_at(24).wrapping_add(1);
        i.framer.set(i.digests, 1 << 20);
        i
    }

    fn send(&mut self, pdu: &Pdu, digests: Digests) {
        let mut out = Vec::new();
        pdu.encode(digests, &mut out);
        self.stream.write_all(&out).expect("send a PDU");
    }

    fn recv(&mut self) -> Pdu {
        loop {
            if let Some(p) = self.framer.next(&mut self.buf).expect("a well-formed PDU") {
                return p;
            }
            let mut chunk = [0u8; 65536];
            let n = self.stream.read(&mut chunk).expect("read from the target");
            assert!(n > 0, "the target closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The next PDU from the target, whatever it is.
    pub fn next_pdu(&mut self) -> Pdu {
        self.recv()
    }

    /// Whether the target has closed the connection (waits up to
    /// `limit` for it to).
    pub fn closed_within(&mut self, limit: Duration) -> bool {
        self.stream.set_read_timeout(Some(limit)).expect("timeout");
        let mut chunk = [0u8; 4096];
        let closed = loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => break true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(_) => break false,
            }
        };
        self.stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        closed
    }

    /// Whether the target sent nothing for `limit` (what it sent is kept
    /// for the next wait).
    pub fn silent_for(&mut self, limit: Duration) -> bool {
        self.stream.set_read_timeout(Some(limit)).expect("timeout");
        let mut chunk = [0u8; 4096];
        let silent = match self.stream.read(&mut chunk) {
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                false
            }
            Err(_) => true,
        };
        self.stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        silent
    }

    /// What the target sent before it closed the connection (waits up to
    /// `limit` for it to close; `None` if it did not).
    pub fn last_words(&mut self, limit: Duration) -> Option<Vec<Pdu>> {
        if !self.closed_within(limit) {
            return None;
        }
        let mut said = Vec::new();
        while let Ok(Some(p)) = self.framer.next(&mut self.buf) {
            said.push(p);
        }
        Some(said)
    }

    /// Sends a SCSI command: `cdb`, `data_out` for the target (immediate
    /// data, then Data-Out as asked) and room for `expect_in` bytes back.
    /// Returns its task tag without waiting for the answer.
    pub fn send_command(&mut self, cdb: &[u8], data_out: &[u8], expect_in: u32) -> u32 {
        self.send_command_with(cdb, data_out, expect_in, data_out.len())
    }

    /// As [`Self::send_command`], but with only `immediate` bytes of the
    /// data in the command PDU (0: all of it waits for R2Ts).
    pub fn send_command_with(
        &mut self,
        cdb: &[u8],
        data_out: &[u8],
        expect_in: u32,
        immediate: usize,
    ) -> u32 {
        let itt = self.itt;
        self.itt = self.itt.wrapping_add(1);
        let mut b = Bhs::new(Opcode::ScsiCommand);
        let (read, write) = (expect_in > 0, !data_out.is_empty());
        b.0[1] = 0x80 | if read { 0x40 } else { 0 } | if write { 0x20 } else { 0 } | 1;
        b.set_itt(itt);
        b.set_immediate(self.immediate);
        b.set_lun(u64::from(self.lun) << 48);
        let expected = if write {
            data_out.len() as u32
        } else {
            expect_in
        };
        b.set_u32(20, expected);
        b.set_u32(24, self.cmd_sn);
        b.set_u32(28, self.exp_stat_sn);
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        b.0[32..48].copy_from_slice(&c);
        if !self.immediate {
            self.cmd_sn = self.cmd_sn.wrapping_add(1);
        }
        let first = data_out
            .len()
            .min(self.max_send)
            .min(self.first_burst)
            .min(immediate);
        self.send(
            &Pdu::new(b, Bytes::copy_from_slice(&data_out[..first])),
            self.digests,
        );
        let sent_sn = if self.immediate {
            self.cmd_sn
        } else {
            self.cmd_sn.wrapping_sub(1)
        };
        self.issued.insert(itt, sent_sn);
        if !self.initial_r2t && data_out.len() > first {
            // Unsolicited Data-Out, up to FirstBurstLength.
            let end = data_out.len().min(self.first_burst);
            let (mut at, mut data_sn) = (first, 0);
            while at < end {
                let n = (end - at).min(self.max_send);
                let mut d = Bhs::new(Opcode::DataOut);
                d.set_final(at + n == end);
                d.set_itt(itt);
                d.set_u32(20, 0xffff_ffff);
                d.set_u32(28, self.exp_stat_sn);
                d.set_u32(36, data_sn);
                d.set_u32(40, at as u32);
                let chunk = Bytes::copy_from_slice(&data_out[at..at + n]);
                self.send(&Pdu::new(d, chunk), self.digests);
                at += n;
                data_sn += 1;
            }
        }
        self.tasks.insert(
            itt,
            Task {
                data_out: data_out.to_vec(),
                data_in: vec![0; expect_in as usize],
                received: 0,
            },
        );
        itt
    }

    /// Handles one PDU from the target: R2Ts answered, data gathered, a
    /// finished task's reply kept.
    fn pump(&mut self) {
        let p = self.recv();
        let itt = p.bhs.itt();
        match p.bhs.opcode() {
            Opcode::R2t => {
                self.r2ts += 1;
                let (ttt, offset, len) = (p.bhs.u32_at(20), p.bhs.u32_at(40), p.bhs.u32_at(44));
                let data = self.tasks[&itt].data_out.clone();
                let mut sent = 0;
                let mut data_sn = 0;
                while sent < len {
                    let n = (len - sent).min(self.max_send as u32);
                    let mut d = Bhs::new(Opcode::DataOut);
                    d.set_final(sent + n == len);
                    d.set_itt(itt);
                    d.set_u32(20, ttt);
                    d.set_u32(28, self.exp_stat_sn);
                    d.set_u32(36, data_sn);
                    d.set_u32(40, offset + sent);
                    let at = (offset + sent) as usize;
                    let chunk = Bytes::copy_from_slice(&data[at..at + n as usize]);
                    self.send(&Pdu::new(d, chunk), self.digests);
                    sent += n;
                    data_sn += 1;
                }
            }
            Opcode::DataIn => {
                let t = self.tasks.get_mut(&itt).expect("Data-In for a task sent");
                let at = p.bhs.u32_at(40) as usize;
                t.data_in[at..at + p.data.len()].copy_from_slice(&p.data);
                t.received += p.data.len();
                if p.bhs.0[1] & 0x01 != 0 {
                    self.exp_stat_sn = p.bhs.u32_at(24).wrapping_add(1);
                    let mut t = self.tasks.remove(&itt).expect("present");
                    t.data_in.truncate(t.received);
                    let reply = Reply {
                        status: p.bhs.0[3],
                        sense: None,
                        information: None,
                        data: t.data_in,
                    };
                    self.done.insert(itt, reply);
                }
            }
            Opcode::ScsiResponse => {
                self.exp_stat_sn = p.bhs.u32_at(24).wrapping_add(1);
                let mut t = self.tasks.remove(&itt).expect("a response to a task sent");
                let sense =
                    (p.data.len() >= 2 + 14).then(|| (p.data[4] & 0x0f, p.data[14], p.data[15]));
                // After the 2-byte SenseLength: byte 0's VALID bit, bytes 3..7.
                let information = (p.data.len() >= 2 + 7 && p.data[2] & 0x80 != 0)
                    .then(|| u32::from_be_bytes(p.data[5..9].try_into().expect("4 bytes")));
                t.data_in.truncate(t.received);
                self.done.insert(
                    itt,
                    Reply {
                        status: p.bhs.0[3],
                        sense,
                        information,
                        data: t.data_in,
                    },
                );
            }
            op => {
                // Every target PDU but an unsolicited NOP-In and an R2T
                // carries a fresh StatSN.
                let unsolicited = op == Opcode::NopIn && itt == 0xffff_ffff;
                if !unsolicited {
                    self.exp_stat_sn = p.bhs.u32_at(24).wrapping_add(1);
                }
                let ttt = p.bhs.u32_at(20);
                if unsolicited && ttt != 0xffff_ffff {
                    // The target pings: answer with its tag, as
                    // initiators do (RFC 7143 11.18).
                    let mut b = Bhs::new(Opcode::NopOut);
                    b.set_immediate(true);
                    b.set_final(true);
                    b.set_itt(0xffff_ffff);
                    b.set_u32(20, ttt);
                    b.set_u32(24, self.cmd_sn);
                    b.set_u32(28, self.exp_stat_sn);
                    self.send(&Pdu::new(b, Bytes::new()), self.digests);
                }
                self.other.push(p);
            }
        }
    }

    /// Waits for the reply to task `itt`.
    pub fn wait(&mut self, itt: u32) -> Reply {
        loop {
            if let Some(r) = self.done.remove(&itt) {
                return r;
            }
            self.pump();
        }
    }

    /// Whether task `itt` has been answered (without waiting).
    pub fn answered(&self, itt: u32) -> bool {
        self.done.contains_key(&itt)
    }

    /// Runs one command and waits for its reply.
    pub fn exec(&mut self, cdb: &[u8], data_out: &[u8], expect_in: u32) -> Reply {
        let itt = self.send_command(cdb, data_out, expect_in);
        self.wait(itt)
    }

    /// A NOP-Out ping, answered: every PDU sent before it has been read
    /// and taken by the target (one connection keeps order).
    pub fn ping(&mut self) {
        let itt = self.itt;
        self.ping_unread(&Bytes::new()).expect("send a PDU");
        self.other_reply(Opcode::NopIn, itt);
    }

    /// Sends a NOP-Out ping carrying `data` and reads nothing: the error
    /// once the target stops taking them (a write blocked past the
    /// socket's write timeout).
    pub fn ping_unread(&mut self, data: &Bytes) -> std::io::Result<()> {
        let itt = self.itt;
        self.itt = self.itt.wrapping_add(1);
        let mut b = Bhs::new(Opcode::NopOut);
        b.set_immediate(true);
        b.set_final(true);
        b.set_itt(itt);
        b.set_u32(20, 0xffff_ffff);
        b.set_u32(24, self.cmd_sn);
        b.set_u32(28, self.exp_stat_sn);
        let mut out = Vec::new();
        Pdu::new(b, data.clone()).encode(self.digests, &mut out);
        self.stream.write_all(&out)
    }

    /// The connection, to set its timeouts.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Takes in what the target sends until it has sent nothing for
    /// `quiet` (R2Ts answered, replies kept), bounded by `limit`.
    pub fn settle(&mut self, quiet: Duration, limit: Duration) {
        let end = std::time::Instant::now() + limit;
        while std::time::Instant::now() < end {
            while self.pdu_buffered() {
                self.pump();
            }
            self.stream.set_read_timeout(Some(quiet)).expect("timeout");
            let mut chunk = [0u8; 65536];
            let n = self.stream.read(&mut chunk).unwrap_or(0);
            self.stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .expect("timeout");
            if n == 0 {
                return;
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Whether a whole PDU waits in the buffer.
    fn pdu_buffered(&self) -> bool {
        let mut copy = self.buf.clone();
        matches!(self.framer.next(&mut copy), Ok(Some(_)))
    }

    /// Logs out (closing the session); returns the response code.
    pub fn logout(&mut self) -> u8 {
        let itt = self.itt;
        self.itt = self.itt.wrapping_add(1);
        let mut b = Bhs::new(Opcode::LogoutRequest);
        b.set_immediate(true);
        b.0[1] = 0x80; // reason 0: close the session
        b.set_itt(itt);
        b.set_u32(24, self.cmd_sn);
        b.set_u32(28, self.exp_stat_sn);
        self.send(&Pdu::new(b, Bytes::new()), self.digests);
        self.other_reply(Opcode::LogoutResponse, itt).bhs.0[2]
    }

    /// Waits for a PDU of `op` answering `itt` among those that answer no
    /// command.
    fn other_reply(&mut self, op: Opcode, itt: u32) -> Pdu {
        loop {
            if let Some(at) = self
                .other
                .iter()
                .position(|p| p.bhs.opcode() == op && p.bhs.itt() == itt)
            {
                return self.other.remove(at);
            }
            self.pump();
        }
    }

    /// Waits for an Async Message and returns it.
    pub fn async_message(&mut self) -> Pdu {
        self.other_reply(Opcode::AsyncMessage, 0xffff_ffff)
    }

    /// A task management request (`function` as RFC 7143 numbers them)
    /// naming task `referenced` (0xffffffff for none); returns the
    /// response code.
    pub fn task_management(&mut self, function: u8, referenced: u32) -> u8 {
        let ref_cmd_sn = self.issued.get(&referenced).copied().unwrap_or(0);
        let itt = self.itt;
        self.itt = self.itt.wrapping_add(1);
        let mut b = Bhs::new(Opcode::TaskMgmtRequest);
        b.set_immediate(true);
        b.0[1] = 0x80 | function;
        b.set_itt(itt);
        b.set_u32(20, referenced);
        b.set_u32(24, self.cmd_sn);
        b.set_u32(28, self.exp_stat_sn);
        b.set_u32(32, ref_cmd_sn);
        self.send(&Pdu::new(b, Bytes::new()), self.digests);
        self.other_reply(Opcode::TaskMgmtResponse, itt).bhs.0[2]
    }
}
