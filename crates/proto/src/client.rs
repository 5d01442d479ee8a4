//! The client side of the fixed newstyle handshake, as a state machine.
//!
//! A [`ClientConfig`] says what to ask for; the machine turns it into a
//! sequence of options, sends one at a time (the spec forbids a second
//! option before the first one's final reply), and collects what the
//! server said. Like the server side it does no I/O.

use bytes::{Buf, BytesMut};

use crate::option::{
    encode_option, GoData, Info, MetaContext, MetaQuery, OptionReplyHeader, ServerEntry,
};
use crate::wire::{
    client_flags, handshake_flags, info, OptCode, RepCode, TransmissionFlags, DEFAULT_MAX_PAYLOAD,
    INIT_MAGIC, MAX_STRING_LEN, OPTION_REPLY_HEADER_LEN, OPTS_MAGIC,
};
use crate::ProtoError;

/// How the handshake ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// `NBD_OPT_GO` (falling back to `NBD_OPT_EXPORT_NAME`): transmission.
    Go,
    /// `NBD_OPT_INFO`, then `NBD_OPT_ABORT`: learn about the export only.
    Info,
    /// `NBD_OPT_ABORT` after the other options (listing, fencing).
    Abort,
}

/// What to negotiate.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub export: String,
    /// Ask for `NBD_OPT_STARTTLS` first; the driver upgrades on
    /// [`ClientEvent::StartTls`].
    pub tls: bool,
    /// Ask for `NBD_OPT_LIST`.
    pub list_exports: bool,
    /// Ask for structured replies (needed for any metadata context).
    pub structured: bool,
    /// `NBD_OPT_LIST_META_CONTEXT` queries (e.g. `x-braid:`), sent if any.
    pub list_queries: Vec<String>,
    /// `NBD_OPT_SET_META_CONTEXT` queries (e.g. `base:allocation`).
    pub set_contexts: Vec<String>,
    pub finish: Finish,
}

impl ClientConfig {
    /// Structured replies and transmission, nothing else.
    pub fn go(export: impl Into<String>) -> Self {
        Self {
            export: export.into(),
            tls: false,
            list_exports: false,
            structured: true,
            list_queries: Vec::new(),
            set_contexts: Vec::new(),
            finish: Finish::Go,
        }
    }
}

/// What the server said about the export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportDetails {
    pub size: u64,
    pub flags: TransmissionFlags,
    pub min_block: u32,
    pub preferred_block: u32,
    pub max_payload: u32,
    /// Canonical name, when the server sent one.
    pub name: Option<String>,
    pub description: Option<String>,
}

/// Everything learned during the handshake.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientOutcome {
    /// Present after a successful `NBD_OPT_GO`, `NBD_OPT_INFO` or
    /// `NBD_OPT_EXPORT_NAME`.
    pub export: Option<ExportDetails>,
    pub structured: bool,
    /// Contexts selected for transmission, with their ids.
    pub contexts: Vec<MetaContext>,
    /// Names returned by `NBD_OPT_LIST_META_CONTEXT`.
    pub listed: Vec<String>,
    /// Why `NBD_OPT_LIST_META_CONTEXT` failed, if it did.
    pub list_refused: Option<(RepCode, String)>,
    pub exports: Vec<ServerEntry>,
    /// The connection is now in the transmission phase.
    pub transmission: bool,
}

/// What the driver must do after [`ClientHandshake::handle_input`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// Send the output, then read more.
    NeedInput,
    /// Upgrade the stream to TLS, then call [`ClientHandshake::tls_established`].
    StartTls,
    /// Send the output; the handshake is over.
    Done(Box<ClientOutcome>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    StartTls,
    List,
    Structured,
    ListMeta,
    SetMeta,
    Info,
    Go,
    Abort,
}

#[derive(Debug)]
enum State {
    Greeting,
    Reply(Step),
    ExportName,
    TlsPending,
    Done,
}

/// Option replies beyond this size are a misbehaving server.
const MAX_REPLY_LEN: u32 = 64 * 1024;
const GREETING_LEN: usize = 18;

/// One connection's handshake, client side.
pub struct ClientHandshake {
    cfg: ClientConfig,
    steps: std::collections::VecDeque<Step>,
    state: State,
    out: Vec<u8>,
    no_zeroes: bool,
    outcome: ClientOutcome,
    export: Option<ExportDetails>,
    /// `NBD_INFO_EXPORT` arrived for the current INFO or GO.
    saw_export_info: bool,
}

impl ClientHandshake {
    pub fn new(cfg: ClientConfig) -> Self {
        let mut steps = std::collections::VecDeque::new();
        if cfg.tls {
            steps.push_back(Step::StartTls);
        }
        if cfg.list_exports {
            steps.push_back(Step::List);
        }
        if cfg.structured {
            steps.push_back(Step::Structured);
            if !cfg.list_queries.is_empty() {
                steps.push_back(Step::ListMeta);
            }
            if !cfg.set_contexts.is_empty() {
                steps.push_back(Step::SetMeta);
            }
        }
        match cfg.finish {
            Finish::Go => steps.push_back(Step::Go),
            Finish::Info => {
                steps.push_back(Step::Info);
                steps.push_back(Step::Abort);
            }
            Finish::Abort => steps.push_back(Step::Abort),
        }
        Self {
            cfg,
            steps,
            state: State::Greeting,
            out: Vec::new(),
            no_zeroes: false,
            outcome: ClientOutcome::default(),
            export: None,
            saw_export_info: false,
        }
    }

    /// Bytes to send to the server, oldest first.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// The server closed the connection. After `NBD_OPT_ABORT` the spec lets
    /// it do so without replying, so that is a clean end; anywhere else it
    /// is `None`.
    pub fn eof(&mut self) -> Option<ClientOutcome> {
        matches!(self.state, State::Reply(Step::Abort)).then(|| std::mem::take(&mut self.outcome))
    }

    /// Call after the TLS upgrade that [`ClientEvent::StartTls`] asked for.
    pub fn tls_established(&mut self) {
        if matches!(self.state, State::TlsPending) {
            self.next_step();
        }
    }

    /// Consumes as much input as it can and says what to do next.
    ///
    /// # Errors
    ///
    /// The server broke the protocol, or refused something the handshake
    /// cannot do without ([`ProtoError::Refused`] carries its message).
    pub fn handle_input(&mut self, input: &mut BytesMut) -> Result<ClientEvent, ProtoError> {
        loop {
            match self.state {
                State::Greeting => {
                    if input.len() < GREETING_LEN {
                        return Ok(ClientEvent::NeedInput);
                    }
                    let magic = input.get_u64();
                    if magic != INIT_MAGIC {
                        return Err(ProtoError::BadMagic {
                            what: "greeting",
                            found: magic,
                        });
                    }
                    let opts = input.get_u64();
                    if opts != OPTS_MAGIC {
                        // Oldstyle servers send the export size here.
                        return Err(ProtoError::NotFixedNewstyle);
                    }
                    let flags = input.get_u16();
                    if flags & handshake_flags::FIXED_NEWSTYLE == 0 {
                        return Err(ProtoError::NotFixedNewstyle);
                    }
                    let mut reply = client_flags::FIXED_NEWSTYLE;
                    if flags & handshake_flags::NO_ZEROES != 0 {
                        reply |= client_flags::NO_ZEROES;
                        self.no_zeroes = true;
                    }
                    self.out.extend_from_slice(&reply.to_be_bytes());
                    self.next_step();
                }
                State::Reply(step) => {
                    if input.len() < OPTION_REPLY_HEADER_LEN {
                        return Ok(ClientEvent::NeedInput);
                    }
                    let header = OptionReplyHeader::decode(
                        input[..OPTION_REPLY_HEADER_LEN]
                            .try_into()
                            .expect("checked"),
                    )?;
                    if header.length > MAX_REPLY_LEN {
                        return Err(ProtoError::ReplyTooLong {
                            length: header.length,
                        });
                    }
                    let total = OPTION_REPLY_HEADER_LEN + header.length as usize;
                    if input.len() < total {
                        return Ok(ClientEvent::NeedInput);
                    }
                    input.advance(OPTION_REPLY_HEADER_LEN);
                    let data = input.split_to(header.length as usize);
                    if header.option != Self::code(step) {
                        return Err(ProtoError::UnexpectedReply {
                            option: header.option.to_u32(),
                            reply: header.code.to_u32(),
                        });
                    }
                    self.reply(step, header.code, &data)?;
                }
                State::ExportName => {
                    let need = 10 + if self.no_zeroes { 0 } else { 124 };
                    if input.len() < need {
                        return Ok(ClientEvent::NeedInput);
                    }
                    let size = input.get_u64();
                    let flags = TransmissionFlags(input.get_u16());
                    input.advance(need - 10);
                    self.outcome.export = Some(ExportDetails {
                        size,
                        flags,
                        min_block: 1,
                        preferred_block: 4096,
                        max_payload: DEFAULT_MAX_PAYLOAD,
                        name: None,
                        description: None,
                    });
                    self.outcome.transmission = true;
                    self.state = State::Done;
                }
                State::TlsPending => return Ok(ClientEvent::StartTls),
                State::Done => {
                    return Ok(ClientEvent::Done(Box::new(std::mem::take(
                        &mut self.outcome,
                    ))));
                }
            }
        }
    }

    fn code(step: Step) -> OptCode {
        match step {
            Step::StartTls => OptCode::StartTls,
            Step::List => OptCode::List,
            Step::Structured => OptCode::StructuredReply,
            Step::ListMeta => OptCode::ListMetaContext,
            Step::SetMeta => OptCode::SetMetaContext,
            Step::Info => OptCode::Info,
            Step::Go => OptCode::Go,
            Step::Abort => OptCode::Abort,
        }
    }

    fn next_step(&mut self) {
        let Some(step) = self.steps.pop_front() else {
            self.state = State::Done;
            return;
        };
        let data = match step {
            Step::StartTls | Step::List | Step::Structured | Step::Abort => Vec::new(),
            Step::ListMeta => MetaQuery {
                export: self.cfg.export.clone(),
                queries: self.cfg.list_queries.clone(),
            }
            .encode(),
            Step::SetMeta => MetaQuery {
                export: self.cfg.export.clone(),
                queries: self.cfg.set_contexts.clone(),
            }
            .encode(),
            Step::Info | Step::Go => GoData {
                export: self.cfg.export.clone(),
                requests: vec![info::BLOCK_SIZE, info::NAME, info::DESCRIPTION],
            }
            .encode(),
        };
        encode_option(&mut self.out, Self::code(step), &data);
        self.state = State::Reply(step);
    }

    fn reply(&mut self, step: Step, code: RepCode, data: &[u8]) -> Result<(), ProtoError> {
        let refused = |message: &[u8]| ProtoError::Refused {
            option: Self::code(step).to_u32(),
            reply: code.name(),
            message: String::from_utf8_lossy(&message[..message.len().min(MAX_STRING_LEN)])
                .into_owned(),
        };
        let unexpected = || ProtoError::UnexpectedReply {
            option: Self::code(step).to_u32(),
            reply: code.to_u32(),
        };
        match (step, code) {
            (Step::StartTls, RepCode::Ack) => {
                self.state = State::TlsPending;
                return Ok(());
            }
            (Step::List, RepCode::Server) => {
                self.outcome.exports.push(ServerEntry::decode(data)?);
                return Ok(());
            }
            (Step::Structured, RepCode::Ack) => self.outcome.structured = true,
            (Step::Structured, RepCode::ErrUnsup) => {
                // No structured replies: contexts cannot be used either.
                self.steps
                    .retain(|s| !matches!(s, Step::ListMeta | Step::SetMeta));
            }
            (Step::ListMeta | Step::SetMeta, RepCode::MetaContext) => {
                let ctx = MetaContext::decode(data)?;
                if step == Step::ListMeta {
                    self.outcome.listed.push(ctx.name);
                } else {
                    self.outcome.contexts.push(ctx);
                }
                return Ok(());
            }
            (Step::ListMeta, c) if c.is_error() => {
                self.outcome.listed.clear();
                self.outcome.list_refused = Some((c, String::from_utf8_lossy(data).into_owned()));
            }
            (Step::SetMeta, c) if c.is_error() => self.outcome.contexts.clear(),
            (Step::Info | Step::Go, RepCode::Info) => {
                self.info(Info::decode(data)?);
                return Ok(());
            }
            (Step::Info | Step::Go, RepCode::Ack) => {
                let export = self
                    .export
                    .take()
                    .filter(|_| self.saw_export_info)
                    .ok_or(ProtoError::MissingExportInfo)?;
                self.outcome.export = Some(export);
                if step == Step::Go {
                    self.outcome.transmission = true;
                    self.state = State::Done;
                    return Ok(());
                }
            }
            (Step::Go, RepCode::ErrUnsup) => {
                // A server older than NBD_OPT_GO (spec: fall back).
                let name = self.cfg.export.clone();
                encode_option(&mut self.out, OptCode::ExportName, name.as_bytes());
                self.state = State::ExportName;
                return Ok(());
            }
            (Step::Abort, _) => {}
            (Step::List | Step::ListMeta | Step::SetMeta, RepCode::Ack) => {}
            (_, c) if c.is_error() => return Err(refused(data)),
            _ => return Err(unexpected()),
        }
        self.next_step();
        Ok(())
    }

    fn info(&mut self, info: Info) {
        let export = self.export.get_or_insert(ExportDetails {
            size: 0,
            flags: TransmissionFlags(0),
            min_block: 1,
            preferred_block: 4096,
            max_payload: DEFAULT_MAX_PAYLOAD,
            name: None,
            description: None,
        });
        match info {
            Info::Export { size, flags } => {
                self.saw_export_info = true;
                export.size = size;
                export.flags = flags;
            }
            Info::Name(n) => export.name = Some(n),
            Info::Description(d) => export.description = Some(d),
            Info::BlockSize {
                min,
                preferred,
                max,
            } => {
                export.min_block = min;
                export.preferred_block = preferred;
                export.max_payload = max;
            }
            Info::Unknown(_) => {}
        }
    }
}
