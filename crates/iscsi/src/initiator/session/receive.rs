//! The target's PDUs in: Data-In, SCSI Response, R2T, NOP-In, task
//! management and text responses, logout, asynchronous messages and
//! rejects, each checked against the task it answers and turned into
//! events (and, for an R2T, the Data-Out it asks for).

use bytes::Bytes;

use super::pdus::data_out;
use super::{
    err, AsyncEvent, Event, Kind, Outcome, Scsi, Session, SessionError, Task, TaskFunction,
    MAX_TEXT, RESERVED_TAG,
};
use crate::initiator::sense::SenseData;
use crate::pdu::{Bhs, Opcode, Pdu};
use crate::window::{le, lt};

impl Session {
    /// Handles one PDU from the target.
    ///
    /// # Errors
    ///
    /// [`SessionError`]: the target broke the protocol; end the
    /// connection.
    pub fn receive(&mut self, pdu: Pdu) -> Result<(), SessionError> {
        let op = pdu.bhs.opcode();
        if op.from_initiator() || matches!(op, Opcode::LoginResponse | Opcode::Other(_)) {
            return err(format!("a {op:?} PDU in full feature phase"));
        }
        self.numbers(&pdu.bhs);
        match op {
            Opcode::DataIn => self.data_in(pdu)?,
            Opcode::ScsiResponse => self.scsi_response(&pdu)?,
            Opcode::R2t => self.r2t(&pdu.bhs)?,
            Opcode::NopIn => self.nop_in(&pdu.bhs)?,
            Opcode::TaskMgmtResponse => self.tmf_response(&pdu.bhs)?,
            Opcode::TextResponse => self.text_response(pdu)?,
            Opcode::LogoutResponse => {
                let itt = self.status_pdu(&pdu.bhs, |k| matches!(k, Kind::Logout))?;
                self.tasks.remove(&itt);
                self.events.push_back(Event::Logout {
                    itt,
                    response: pdu.bhs.0[2],
                });
            }
            Opcode::AsyncMessage => self.async_message(&pdu),
            Opcode::Reject => self.reject(&pdu)?,
            _ => unreachable!("initiator opcodes refused above"),
        }
        self.flush_queue();
        Ok(())
    }

    /// ExpCmdSN and MaxCmdSN, which every target PDU carries. A MaxCmdSN
    /// below ExpCmdSN - 1 is invalid and ignored, and neither number ever
    /// moves back (PDUs can overtake each other on the way).
    fn numbers(&mut self, b: &Bhs) {
        let (exp, max) = (b.u32_at(28), b.u32_at(32));
        if lt(max, exp.wrapping_sub(1)) {
            return;
        }
        if lt(self.exp_cmd_sn, exp) {
            self.exp_cmd_sn = exp;
        }
        if lt(self.max_cmd_sn, max) {
            self.max_cmd_sn = max;
        }
    }

    /// A PDU carrying a status: its StatSN is acknowledged, and its ITT
    /// must name a task of the kind `want` accepts.
    fn status_pdu(&mut self, b: &Bhs, want: impl Fn(&Kind) -> bool) -> Result<u32, SessionError> {
        let sn = b.u32_at(24);
        if le(self.exp_stat_sn, sn) {
            self.exp_stat_sn = sn.wrapping_add(1);
        }
        let itt = b.itt();
        match self.tasks.get(&itt) {
            Some(t) if want(&t.kind) => Ok(itt),
            _ => err(format!(
                "a {:?} for task {itt:#x}, which is not one it can answer",
                b.opcode()
            )),
        }
    }

    fn scsi_task(&mut self, itt: u32, what: &str) -> Result<&mut Scsi, SessionError> {
        match self.tasks.get_mut(&itt).map(|t| &mut t.kind) {
            Some(Kind::Scsi(s)) if s.cmd_sn.is_some() => Ok(s),
            _ => err(format!(
                "{what} for task {itt:#x}, which has no command out"
            )),
        }
    }

    fn data_in(&mut self, pdu: Pdu) -> Result<(), SessionError> {
        let b = pdu.bhs;
        let itt = b.itt();
        let flags = b.0[1];
        let status = flags & 0x01 != 0;
        let s = self.scsi_task(itt, "Data-In")?;
        let (offset, len) = (b.u32_at(40), pdu.data.len() as u32);
        if b.u32_at(36) != s.data_sn {
            return err(format!(
                "Data-In DataSN {} where {} was next",
                b.u32_at(36),
                s.data_sn
            ));
        }
        // DataPDUInOrder and DataSequenceInOrder are Yes: contiguous.
        if offset != s.received {
            return err(format!(
                "Data-In at offset {offset} where {} was next",
                s.received
            ));
        }
        if u64::from(offset) + u64::from(len) > u64::from(s.cmd.read) {
            return err(format!(
                "Data-In of {len} bytes at {offset} runs past the {} the command reads",
                s.cmd.read
            ));
        }
        s.data_sn = s.data_sn.wrapping_add(1);
        s.received += len;
        let data_in = s.received;
        if len > 0 {
            self.events.push_back(Event::Data {
                itt,
                offset,
                data: pdu.data,
            });
        }
        if status {
            if flags & 0x80 == 0 {
                return err("Data-In with status but without the F bit");
            }
            self.status_pdu(&b, |k| matches!(k, Kind::Scsi(_)))?;
            self.tasks.remove(&itt);
            self.events.push_back(Event::Complete {
                itt,
                outcome: Outcome::Status {
                    status: b.0[3],
                    sense: None,
                    residual: residual(flags, b.u32_at(44)),
                    data_in,
                },
            });
        }
        Ok(())
    }

    fn scsi_response(&mut self, pdu: &Pdu) -> Result<(), SessionError> {
        let b = &pdu.bhs;
        let itt = self.status_pdu(b, |k| matches!(k, Kind::Scsi(s) if s.cmd_sn.is_some()))?;
        let Some(Task {
            kind: Kind::Scsi(s),
            ..
        }) = self.tasks.remove(&itt)
        else {
            unreachable!("checked by status_pdu")
        };
        let outcome = if b.0[2] != 0 {
            Outcome::TargetFailure { response: b.0[2] }
        } else {
            // The data segment: SenseLength, then sense data.
            let sense = match pdu.data.len() {
                0 => None,
                1 => return err("a one-byte SCSI Response data segment"),
                n => {
                    let want = usize::from(u16::from_be_bytes([pdu.data[0], pdu.data[1]]));
                    if 2 + want > n {
                        return err(format!("SenseLength {want} in a {n}-byte data segment"));
                    }
                    SenseData::parse(&pdu.data[2..2 + want])
                }
            };
            Outcome::Status {
                status: b.0[3],
                sense,
                residual: residual(b.0[1], b.u32_at(44)),
                data_in: s.received,
            }
        };
        self.events.push_back(Event::Complete { itt, outcome });
        Ok(())
    }

    fn r2t(&mut self, b: &Bhs) -> Result<(), SessionError> {
        let itt = b.itt();
        let max_pdu = self.params.peer_max_recv_data.max(512);
        let exp_stat_sn = self.exp_stat_sn;
        let s = self.scsi_task(itt, "R2T")?;
        let Some(data) = s.cmd.write.clone() else {
            return err(format!("R2T for task {itt:#x}, which writes nothing"));
        };
        let (ttt, offset, len) = (b.u32_at(20), b.u32_at(40), b.u32_at(44));
        if b.u32_at(36) != s.r2t_sn {
            return err(format!(
                "R2TSN {} where {} was next",
                b.u32_at(36),
                s.r2t_sn
            ));
        }
        if ttt == RESERVED_TAG || len == 0 || u64::from(offset) + u64::from(len) > data.len() as u64
        {
            return err(format!(
                "R2T for {len} bytes at {offset} of a {}-byte write (tag {ttt:#x})",
                data.len()
            ));
        }
        s.r2t_sn = s.r2t_sn.wrapping_add(1);
        let lun = s.cmd.lun;
        let pdus = data_out(
            itt,
            lun,
            ttt,
            &data,
            offset,
            offset + len,
            max_pdu,
            exp_stat_sn,
        );
        self.out.extend(pdus);
        Ok(())
    }

    fn nop_in(&mut self, b: &Bhs) -> Result<(), SessionError> {
        let itt = b.itt();
        if itt != RESERVED_TAG {
            self.status_pdu(b, |k| matches!(k, Kind::Nop))?;
            self.tasks.remove(&itt);
            self.events.push_back(Event::Pong { itt });
            return Ok(());
        }
        let ttt = b.u32_at(20);
        if ttt != RESERVED_TAG {
            // The target pings: answer with its tag (RFC 7143, "NOP-In").
            let mut r = Bhs::new(Opcode::NopOut);
            r.set_immediate(true);
            r.set_final(true);
            r.set_lun(b.lun());
            r.set_itt(RESERVED_TAG);
            r.set_u32(20, ttt);
            self.push(r, Bytes::new());
        }
        Ok(())
    }

    fn tmf_response(&mut self, b: &Bhs) -> Result<(), SessionError> {
        let itt = self.status_pdu(b, |k| matches!(k, Kind::Tmf { .. }))?;
        let Some(Task {
            lun,
            kind: Kind::Tmf {
                function,
                referenced,
            },
        }) = self.tasks.remove(&itt)
        else {
            unreachable!("checked by status_pdu")
        };
        let response = b.0[2];
        // Function complete, or (ABORT TASK) the task no longer exists:
        // commands the function covered get no answer of their own.
        if response == 0 || (response == 1 && function == TaskFunction::AbortTask) {
            let ended: Vec<u32> = self
                .tasks
                .iter()
                .filter(|(k, t)| match (&t.kind, function) {
                    (Kind::Scsi(s), TaskFunction::AbortTask) => {
                        **k == referenced && s.cmd_sn.is_some()
                    }
                    (Kind::Scsi(s), TaskFunction::TargetWarmReset) => s.cmd_sn.is_some(),
                    (Kind::Scsi(s), _) => t.lun == lun && s.cmd_sn.is_some(),
                    _ => false,
                })
                .map(|(k, _)| *k)
                .collect();
            for k in ended {
                self.tasks.remove(&k);
                self.events.push_back(Event::Complete {
                    itt: k,
                    outcome: Outcome::Aborted,
                });
            }
        }
        self.events
            .push_back(Event::TaskManagement { itt, response });
        Ok(())
    }

    fn text_response(&mut self, pdu: Pdu) -> Result<(), SessionError> {
        let b = pdu.bhs;
        let itt = self.status_pdu(&b, |k| matches!(k, Kind::Text(_)))?;
        let Some(Task {
            kind: Kind::Text(buf),
            ..
        }) = self.tasks.get_mut(&itt)
        else {
            unreachable!("checked by status_pdu")
        };
        if buf.len() + pdu.data.len() > MAX_TEXT {
            return err(format!("a text answer longer than {MAX_TEXT} bytes"));
        }
        buf.extend_from_slice(&pdu.data);
        let (fin, more) = (b.0[1] & 0x80 != 0, b.0[1] & 0x40 != 0);
        if fin && more {
            return err("a Text Response with both F and C set");
        }
        if fin {
            let data = Bytes::from(std::mem::take(buf));
            self.tasks.remove(&itt);
            self.events.push_back(Event::Text { itt, data });
        } else {
            // More follows when asked with an empty request and its tag.
            self.text_request(itt, b.u32_at(20), Bytes::new());
        }
        Ok(())
    }

    fn async_message(&mut self, pdu: &Pdu) {
        let b = &pdu.bhs;
        let sn = b.u32_at(24);
        if le(self.exp_stat_sn, sn) {
            self.exp_stat_sn = sn.wrapping_add(1);
        }
        let event = match b.0[36] {
            0 => {
                let d = &pdu.data;
                let sense = (d.len() >= 2)
                    .then(|| usize::from(u16::from_be_bytes([d[0], d[1]])))
                    .and_then(|n| d.get(2..2 + n))
                    .and_then(SenseData::parse);
                AsyncEvent::Scsi {
                    lun: b.lun(),
                    sense,
                }
            }
            1 => AsyncEvent::LogoutRequested {
                seconds: u16::from_be_bytes([b.0[42], b.0[43]]),
            },
            2 => AsyncEvent::Dropping { all: false },
            3 => AsyncEvent::Dropping { all: true },
            other => AsyncEvent::Other(other),
        };
        self.events.push_back(Event::Async(event));
    }

    fn reject(&mut self, pdu: &Pdu) -> Result<(), SessionError> {
        let b = &pdu.bhs;
        let sn = b.u32_at(24);
        if le(self.exp_stat_sn, sn) {
            self.exp_stat_sn = sn.wrapping_add(1);
        }
        let reason = b.0[2];
        let Some(header) = pdu.data.get(..crate::BHS_LEN) else {
            return err(format!(
                "Reject (reason {reason:#x}) without the rejected header"
            ));
        };
        let itt = u32::from_be_bytes(header[16..20].try_into().expect("four bytes"));
        let opcode = Opcode::from_byte(header[0]);
        // A rejected command, ping or request is over; a rejected Data-Out
        // or NOP-Out answer leaves its task waiting, and nothing braid
        // sends can be fixed by sending it again the same way.
        match (opcode, self.tasks.get(&itt).map(|t| &t.kind)) {
            (Opcode::ScsiCommand, Some(Kind::Scsi(_))) => {
                self.tasks.remove(&itt);
                self.events.push_back(Event::Complete {
                    itt,
                    outcome: Outcome::Rejected { reason },
                });
                Ok(())
            }
            _ => err(format!(
                "the target rejected a {opcode:?} PDU (reason {reason:#04x})"
            )),
        }
    }
}

/// Residual from a response's flags: O (0x04) overflow, U (0x02)
/// underflow.
fn residual(flags: u8, count: u32) -> i64 {
    if flags & 0x02 != 0 {
        i64::from(count)
    } else if flags & 0x04 != 0 {
        -i64::from(count)
    } else {
        0
    }
}
