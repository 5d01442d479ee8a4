//! A text exchange of the full feature phase (RFC 7143, "Text Request"
//! and "Text Response"), target side, without I/O: a request's text may
//! come over several PDUs (C bit), and an answer longer than the
//! initiator's MaxRecvDataSegmentLength goes back over several Text
//! Responses, each after the initiator asks for the next with the Target
//! Transfer Tag of the one before.
//!
//! What one request may hold is capped at [`text::MAX_TEXT`]; what an
//! answer holds is the caller's (a SendTargets answer lists what the
//! server serves).

use bytes::Bytes;

use crate::pdu::Bhs;
use crate::text::{self, TextError};

/// The reserved tag: no continuation.
pub const NO_TAG: u32 = 0xffff_ffff;

/// One Text Response to send: its data, F and C bits, and Target Transfer
/// Tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub data: Bytes,
    /// F: the answer ends with this PDU.
    pub last: bool,
    /// C: a key=value pair is cut at this PDU's end.
    pub cut: bool,
    pub ttt: u32,
}

impl Reply {
    /// Writes F, C and the Target Transfer Tag into a Text Response's
    /// header.
    pub fn mark(&self, bhs: &mut Bhs) {
        bhs.set_final(self.last);
        bhs.0[1] = (bhs.0[1] & !0x40) | if self.cut { 0x40 } else { 0 };
        bhs.set_u32(20, self.ttt);
    }
}

/// What a Text Request asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming {
    /// A whole request: answer it with [`TextExchange::answer`].
    Request(Vec<(String, String)>),
    /// Send this: the acknowledgement of continued text, or the next part
    /// of an answer.
    Reply(Reply),
}

/// Why a Text Request is refused (with a Reject, reason 0x09); the
/// exchange starts over.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refusal {
    #[error(
        "Text Request text past {} bytes (over continued PDUs)",
        text::MAX_TEXT
    )]
    TooLong,
    #[error("Text Request: {0}")]
    Text(#[from] TextError),
    #[error(
        "Text Request continues tag {ttt:#x} of task {itt:#x}, which this target did not give"
    )]
    UnknownTag { itt: u32, ttt: u32 },
}

#[derive(Debug)]
enum State {
    Idle,
    /// Gathering continued request text of task `itt`.
    Gathering {
        itt: u32,
        ttt: u32,
        text: Vec<u8>,
    },
    /// `rest` of an answer to task `itt` waits for the initiator to ask.
    Answering {
        itt: u32,
        ttt: u32,
        rest: Bytes,
    },
}

/// One connection's text exchanges.
#[derive(Debug)]
pub struct TextExchange {
    /// The initiator's MaxRecvDataSegmentLength: most data per response.
    max_send: usize,
    state: State,
    next_tag: u32,
}

impl TextExchange {
    pub fn new(max_send: usize) -> Self {
        Self {
            max_send: max_send.max(1),
            state: State::Idle,
            next_tag: 1,
        }
    }

    /// Takes one Text Request (its header and data).
    ///
    /// # Errors
    ///
    /// [`Refusal`]: answer with a Reject; the exchange starts over.
    pub fn receive(&mut self, bhs: &Bhs, data: &[u8]) -> Result<Incoming, Refusal> {
        let (itt, ttt) = (bhs.itt(), bhs.u32_at(20));
        let more = bhs.0[1] & 0x40 != 0;
        let state = std::mem::replace(&mut self.state, State::Idle);
        let mut gathered = match state {
            // The initiator asks for the next part of an answer.
            State::Answering {
                itt: i,
                ttt: t,
                rest,
            } if (i, t) == (itt, ttt) => {
                return Ok(Incoming::Reply(self.next_part(itt, rest)));
            }
            State::Gathering {
                itt: i,
                ttt: t,
                text,
            } if i == itt && (ttt == t || ttt == NO_TAG) => text,
            // A request with the reserved tag starts afresh, whatever was
            // under way (RFC 7143 lets the initiator reset a negotiation).
            _ if ttt == NO_TAG => Vec::new(),
            _ => return Err(Refusal::UnknownTag { itt, ttt }),
        };
        if gathered.len() + data.len() > text::MAX_TEXT {
            return Err(Refusal::TooLong);
        }
        gathered.extend_from_slice(data);
        if more {
            let ttt = self.tag();
            self.state = State::Gathering {
                itt,
                ttt,
                text: gathered,
            };
            return Ok(Incoming::Reply(Reply {
                data: Bytes::new(),
                last: false,
                cut: false,
                ttt,
            }));
        }
        Ok(Incoming::Request(text::parse(&gathered)?))
    }

    /// The first Text Response of the answer `text` to task `itt`; the
    /// rest waits for the initiator to ask.
    pub fn answer(&mut self, itt: u32, text: Vec<u8>) -> Reply {
        self.next_part(itt, Bytes::from(text))
    }

    /// As much of `rest` as the initiator takes in one PDU: whole pairs
    /// where they fit, else a pair cut (C bit).
    fn next_part(&mut self, itt: u32, mut rest: Bytes) -> Reply {
        if rest.len() <= self.max_send {
            self.state = State::Idle;
            return Reply {
                data: rest,
                last: true,
                cut: false,
                ttt: NO_TAG,
            };
        }
        let window = &rest[..self.max_send];
        let (len, cut) = match window.iter().rposition(|&b| b == 0) {
            Some(nul) => (nul + 1, false),
            None => (self.max_send, true),
        };
        let data = rest.split_to(len);
        let ttt = self.tag();
        self.state = State::Answering { itt, ttt, rest };
        Reply {
            data,
            last: false,
            cut,
            ttt,
        }
    }

    fn tag(&mut self) -> u32 {
        let t = self.next_tag;
        self.next_tag = match t.wrapping_add(1) {
            NO_TAG | 0 => 1,
            n => n,
        };
        t
    }
}

#[cfg(test)]
mod tests;
