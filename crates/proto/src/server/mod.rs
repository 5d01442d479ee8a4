//! The server side of the fixed newstyle handshake, as a state machine.
//!
//! Bytes from the client go in through [`ServerHandshake::handle_input`];
//! bytes for the client come out of [`ServerHandshake::take_output`]; what
//! the driver must do next comes back as a [`ServerEvent`]. It never touches
//! a socket, so every conversation is testable from byte vectors.
//!
//! Exports are looked up through a [`Catalog`] the driver provides. The
//! `base:` namespace (spec: "The `base:` metadata namespace") and braid's
//! `x-braid:` namespace are answered here.

use bytes::{Buf, BytesMut};

use crate::braid_ns::{ConnId, InstanceId, SessionToken};
use crate::option::{encode_error, encode_reply, GoData, Info, OptionHeader, ServerEntry};
use crate::request::Negotiated;
use crate::wire::{
    client_flags, handshake_flags, info, OptCode, RepCode, TransmissionFlags, INIT_MAGIC,
    OPTION_HEADER_LEN, OPTS_MAGIC,
};
use crate::ProtoError;

mod context;

/// The `base:allocation` context name.
pub const BASE_ALLOCATION: &str = "base:allocation";

/// What a server knows about one export, as the handshake reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    /// Canonical name.
    pub name: String,
    pub description: String,
    pub size: u64,
    /// Flags as offered to a client that negotiated structured replies;
    /// `SEND_DF` is dropped for clients that did not.
    pub flags: TransmissionFlags,
    pub min_block: u32,
    pub preferred_block: u32,
    pub max_payload: u32,
    /// The `x-braid:volume` identity, if the export has one.
    pub volume: Option<String>,
    /// Portals of other servers of this same export, listed as
    /// `x-braid:portal` after the server's own (the other gateways of one
    /// Ceph image).
    pub peer_portals: Vec<String>,
    /// The `x-braid:instance` to report for this export instead of the
    /// server's: what must restart for acknowledged, unflushed writes to be
    /// lost (a Ceph cluster, for a gateway that caches nothing).
    pub instance: Option<InstanceId>,
}

/// Why a catalog will not hand out an export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No such export; the message lists what exists.
    Unknown(String),
    /// It exists, but this client may not use it.
    Policy(String),
}

/// The driver's view of its exports, consulted during the handshake.
pub trait Catalog {
    /// The export a client asked for by name (`""` is the default export).
    ///
    /// # Errors
    ///
    /// A [`Refusal`] that is sent to the client as `ERR_UNKNOWN` or
    /// `ERR_POLICY`.
    fn lookup(&self, name: &str) -> Result<ExportInfo, Refusal>;
    /// Every export this client may see, for `NBD_OPT_LIST`.
    fn list(&self) -> Vec<ServerEntry>;
}

/// Whether the server insists on TLS (spec: "TLS support").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// NOTLS: `NBD_OPT_STARTTLS` is refused by policy.
    Off,
    /// FORCEDTLS: nothing but STARTTLS and ABORT before TLS is up.
    Required,
}

/// Settings that do not change during one connection's handshake.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// This connection's id, reported as `x-braid:conn=<id>`.
    pub conn_id: ConnId,
    /// Every portal of the target, as `addr:port`.
    pub portals: Vec<String>,
    /// The serving process's instance, reported as `x-braid:instance`.
    pub instance: Option<InstanceId>,
    pub tls: TlsMode,
    /// Option data larger than this is refused with `ERR_TOO_BIG`.
    pub max_option_len: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            conn_id: ConnId(0),
            portals: Vec::new(),
            instance: None,
            tls: TlsMode::Off,
            max_option_len: 64 * 1024,
        }
    }
}

/// Option data beyond this is not even read: the connection is closed, as
/// the spec allows for a client whose behaviour looks like an attack.
const DISCARD_LIMIT: u64 = 16 << 20;

/// A metadata context selected for the transmission phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelectedContext {
    pub id: u32,
    pub name: String,
    pub kind: ContextKind,
}

/// How BLOCK_STATUS answers for a selected context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextKind {
    /// `base:allocation`: holes and zeroes from the backend.
    Allocation,
    /// An `x-braid:` context: a single extent with status 0.
    Constant,
}

/// The handshake's result: what the transmission phase runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub export: ExportInfo,
    /// Flags as sent to this client.
    pub flags: TransmissionFlags,
    pub structured: bool,
    pub contexts: Vec<SelectedContext>,
    /// The client asked for `NBD_INFO_BLOCK_SIZE` with `NBD_OPT_GO`.
    pub block_size_acked: bool,
    /// The initiator session token the client presented
    /// (`x-braid:session`), which scopes who may fence this connection.
    pub braid_session: Option<SessionToken>,
}

impl Session {
    /// What request validation needs.
    pub fn negotiated(&self) -> Negotiated {
        Negotiated {
            size: self.export.size,
            flags: self.flags,
            min_block: self.export.min_block,
            max_payload: self.export.max_payload,
            structured: self.structured,
            block_status: !self.contexts.is_empty(),
        }
    }
}

/// What the driver must do after [`ServerHandshake::handle_input`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerEvent {
    /// Send the output, then read more.
    NeedInput,
    /// Send the output, then enter the transmission phase.
    Transmission(Box<Session>),
    /// Send the output, then close: the client ended the handshake.
    Closed,
    /// Send the output, upgrade the stream to TLS, then call
    /// [`ServerHandshake::tls_established`].
    StartTls,
    /// Close these connections and wait until every request they had
    /// received has completed or been dropped, then call
    /// [`ServerHandshake::fence_done`]. The driver must refuse (and fence
    /// nothing) unless every connection named is of `export` and was
    /// opened with `session`; a fence without a session is refused.
    Fence {
        ids: Vec<ConnId>,
        export: String,
        session: Option<SessionToken>,
    },
}

#[derive(Debug)]
enum State {
    ClientFlags,
    OptionHeader,
    OptionData(OptionHeader),
    Discard {
        code: OptCode,
        remaining: u64,
    },
    Fencing {
        names: Vec<String>,
        fence_name: String,
    },
    TlsPending,
    Finished,
}

/// One connection's handshake.
pub struct ServerHandshake {
    cfg: ServerConfig,
    state: State,
    out: Vec<u8>,
    no_zeroes: bool,
    tls_active: bool,
    structured: bool,
    /// Export named by the last SET_META_CONTEXT and what it selected.
    meta: Option<(String, Vec<SelectedContext>)>,
    /// The session token presented (`x-braid:session`), if any.
    session: Option<SessionToken>,
}

impl ServerHandshake {
    /// Starts a handshake; the greeting is already in the output.
    pub fn new(cfg: ServerConfig) -> Self {
        let mut out = Vec::with_capacity(18);
        out.extend_from_slice(&INIT_MAGIC.to_be_bytes());
        out.extend_from_slice(&OPTS_MAGIC.to_be_bytes());
        out.extend_from_slice(
            &(handshake_flags::FIXED_NEWSTYLE | handshake_flags::NO_ZEROES).to_be_bytes(),
        );
        Self {
            cfg,
            state: State::ClientFlags,
            out,
            no_zeroes: false,
            tls_active: false,
            structured: false,
            meta: None,
            session: None,
        }
    }

    /// Bytes to send to the client, oldest first.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.out)
    }

    /// Whether output is waiting to be sent.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Consumes as much input as it can and says what to do next.
    ///
    /// # Errors
    ///
    /// A [`ProtoError`] means the client broke the protocol (or asked for an
    /// export by `NBD_OPT_EXPORT_NAME` that cannot be given, where the spec
    /// allows no error reply): send any output, then close the connection.
    pub fn handle_input(
        &mut self,
        input: &mut BytesMut,
        catalog: &dyn Catalog,
    ) -> Result<ServerEvent, ProtoError> {
        loop {
            match &mut self.state {
                State::ClientFlags => {
                    if input.len() < 4 {
                        return Ok(ServerEvent::NeedInput);
                    }
                    let flags = input.get_u32();
                    if flags & !client_flags::KNOWN != 0 {
                        return Err(ProtoError::BadClientFlags(flags));
                    }
                    if flags & client_flags::FIXED_NEWSTYLE == 0 {
                        // Only fixed newstyle is served: without it no option
                        // could be refused without closing the connection.
                        return Err(ProtoError::NotFixedNewstyle);
                    }
                    self.no_zeroes = flags & client_flags::NO_ZEROES != 0;
                    self.state = State::OptionHeader;
                }
                State::OptionHeader => {
                    if input.len() < OPTION_HEADER_LEN {
                        return Ok(ServerEvent::NeedInput);
                    }
                    let header = OptionHeader::decode(
                        input[..OPTION_HEADER_LEN]
                            .try_into()
                            .expect("checked length"),
                    )?;
                    input.advance(OPTION_HEADER_LEN);
                    if header.length > self.cfg.max_option_len {
                        if u64::from(header.length) > DISCARD_LIMIT {
                            return Err(ProtoError::OptionTooLong {
                                code: header.code.to_u32(),
                                length: header.length,
                            });
                        }
                        self.state = State::Discard {
                            code: header.code,
                            remaining: u64::from(header.length),
                        };
                    } else {
                        self.state = State::OptionData(header);
                    }
                }
                State::Discard { code, remaining } => {
                    let n = (*remaining).min(input.len() as u64) as usize;
                    input.advance(n);
                    *remaining -= n as u64;
                    if *remaining > 0 {
                        return Ok(ServerEvent::NeedInput);
                    }
                    let code = *code;
                    encode_error(
                        &mut self.out,
                        code,
                        RepCode::ErrTooBig,
                        "option data too large",
                    );
                    self.state = State::OptionHeader;
                }
                State::OptionData(header) => {
                    let len = header.length as usize;
                    if input.len() < len {
                        return Ok(ServerEvent::NeedInput);
                    }
                    let header = *header;
                    let data = input.split_to(len);
                    self.state = State::OptionHeader;
                    if let Some(event) = self.option(header.code, &data, catalog)? {
                        return Ok(event);
                    }
                }
                State::Fencing { .. } | State::TlsPending | State::Finished => {
                    return Ok(ServerEvent::NeedInput);
                }
            }
        }
    }

    /// Call once the stream is TLS, after [`ServerEvent::StartTls`]. The
    /// spec forbids keeping any state negotiated before the upgrade.
    pub fn tls_established(&mut self) {
        self.tls_active = true;
        self.structured = false;
        self.meta = None;
        self.state = State::OptionHeader;
    }

    /// Call once the fence asked by [`ServerEvent::Fence`] has completed
    /// (`Ok`) or could not be done (`Err` with a message for the client).
    pub fn fence_done(&mut self, result: Result<(), String>) {
        let State::Fencing { names, fence_name } =
            std::mem::replace(&mut self.state, State::OptionHeader)
        else {
            return;
        };
        match result {
            Ok(()) => {
                for name in names.iter().chain(std::iter::once(&fence_name)) {
                    self.context_reply(OptCode::ListMetaContext, 0, name);
                }
                encode_reply(&mut self.out, OptCode::ListMetaContext, RepCode::Ack, &[]);
            }
            Err(message) => encode_error(
                &mut self.out,
                OptCode::ListMetaContext,
                RepCode::ErrPolicy,
                &message,
            ),
        }
    }

    fn option(
        &mut self,
        code: OptCode,
        data: &[u8],
        catalog: &dyn Catalog,
    ) -> Result<Option<ServerEvent>, ProtoError> {
        let tls_missing = self.cfg.tls == TlsMode::Required && !self.tls_active;
        if tls_missing && !matches!(code, OptCode::StartTls | OptCode::Abort) {
            if code == OptCode::ExportName {
                return Err(ProtoError::TlsRequired);
            }
            encode_error(
                &mut self.out,
                code,
                RepCode::ErrTlsReqd,
                "this server requires TLS: negotiate NBD_OPT_STARTTLS first",
            );
            return Ok(None);
        }
        match code {
            OptCode::ExportName => self.export_name(data, catalog).map(Some),
            OptCode::Abort => {
                encode_reply(&mut self.out, code, RepCode::Ack, &[]);
                self.state = State::Finished;
                Ok(Some(ServerEvent::Closed))
            }
            OptCode::List => {
                if !data.is_empty() {
                    self.invalid(code, "NBD_OPT_LIST takes no data");
                } else {
                    for entry in catalog.list() {
                        encode_reply(&mut self.out, code, RepCode::Server, &entry.encode());
                    }
                    encode_reply(&mut self.out, code, RepCode::Ack, &[]);
                }
                Ok(None)
            }
            OptCode::StartTls => Ok(self.start_tls(data)),
            OptCode::Info | OptCode::Go => self.info_or_go(code, data, catalog),
            OptCode::StructuredReply => {
                if data.is_empty() {
                    self.structured = true;
                    encode_reply(&mut self.out, code, RepCode::Ack, &[]);
                } else {
                    self.invalid(code, "NBD_OPT_STRUCTURED_REPLY takes no data");
                }
                Ok(None)
            }
            OptCode::ListMetaContext | OptCode::SetMetaContext => {
                Ok(self.meta_context(code, data, catalog))
            }
            OptCode::ExtendedHeaders | OptCode::Unknown(_) => {
                encode_error(
                    &mut self.out,
                    code,
                    RepCode::ErrUnsup,
                    "option not supported",
                );
                Ok(None)
            }
        }
    }

    fn invalid(&mut self, code: OptCode, message: &str) {
        encode_error(&mut self.out, code, RepCode::ErrInvalid, message);
    }

    fn start_tls(&mut self, data: &[u8]) -> Option<ServerEvent> {
        let code = OptCode::StartTls;
        if !data.is_empty() {
            self.invalid(code, "NBD_OPT_STARTTLS takes no data");
            return None;
        }
        if self.tls_active {
            self.invalid(code, "TLS is already active");
            return None;
        }
        if self.cfg.tls == TlsMode::Off {
            encode_error(
                &mut self.out,
                code,
                RepCode::ErrPolicy,
                "TLS is not configured on this server",
            );
            return None;
        }
        encode_reply(&mut self.out, code, RepCode::Ack, &[]);
        self.state = State::TlsPending;
        Some(ServerEvent::StartTls)
    }

    fn export_name(
        &mut self,
        data: &[u8],
        catalog: &dyn Catalog,
    ) -> Result<ServerEvent, ProtoError> {
        let name = crate::option::Reader::new(data, "export name").string(data.len())?;
        let export = catalog
            .lookup(&name)
            .map_err(|refusal| ProtoError::ExportRefused {
                name: name.clone(),
                why: match refusal {
                    Refusal::Unknown(m) | Refusal::Policy(m) => m,
                },
            })?;
        let flags = self.flags_for(&export);
        self.out.extend_from_slice(&export.size.to_be_bytes());
        self.out.extend_from_slice(&flags.0.to_be_bytes());
        if !self.no_zeroes {
            self.out.extend_from_slice(&[0u8; 124]);
        }
        Ok(self.finish(export, flags, &name, false))
    }

    fn info_or_go(
        &mut self,
        code: OptCode,
        data: &[u8],
        catalog: &dyn Catalog,
    ) -> Result<Option<ServerEvent>, ProtoError> {
        let go = match GoData::decode(data) {
            Ok(go) => go,
            Err(e) => {
                self.invalid(code, &format!("malformed option: {e}"));
                return Ok(None);
            }
        };
        let export = match catalog.lookup(&go.export) {
            Ok(export) => export,
            Err(Refusal::Unknown(message)) => {
                encode_error(&mut self.out, code, RepCode::ErrUnknown, &message);
                return Ok(None);
            }
            Err(Refusal::Policy(message)) => {
                encode_error(&mut self.out, code, RepCode::ErrPolicy, &message);
                return Ok(None);
            }
        };
        let flags = self.flags_for(&export);
        let mut infos = vec![
            Info::Export {
                size: export.size,
                flags,
            },
            // Always sent: a client that did not ask may ignore it, and one
            // that did learns the limits it promised to respect.
            Info::BlockSize {
                min: export.min_block,
                preferred: export.preferred_block,
                max: export.max_payload,
            },
        ];
        if go.requests.contains(&info::NAME) {
            infos.push(Info::Name(export.name.clone()));
        }
        if go.requests.contains(&info::DESCRIPTION) && !export.description.is_empty() {
            infos.push(Info::Description(export.description.clone()));
        }
        for i in infos {
            encode_reply(&mut self.out, code, RepCode::Info, &i.encode());
        }
        encode_reply(&mut self.out, code, RepCode::Ack, &[]);
        if code == OptCode::Info {
            return Ok(None);
        }
        let acked = go.requests.contains(&info::BLOCK_SIZE);
        Ok(Some(self.finish(export, flags, &go.export, acked)))
    }

    fn flags_for(&self, export: &ExportInfo) -> TransmissionFlags {
        let mut flags = export.flags;
        flags.0 |= TransmissionFlags::HAS_FLAGS;
        if !self.structured {
            flags.0 &= !TransmissionFlags::SEND_DF;
        }
        flags
    }

    fn finish(
        &mut self,
        export: ExportInfo,
        flags: TransmissionFlags,
        asked_name: &str,
        block_size_acked: bool,
    ) -> ServerEvent {
        // Contexts count only if selected for the export now being used
        // (spec: NBD_OPT_SET_META_CONTEXT).
        let contexts = match self.meta.take() {
            Some((name, contexts)) if self.structured && name == asked_name => contexts,
            _ => Vec::new(),
        };
        self.state = State::Finished;
        ServerEvent::Transmission(Box::new(Session {
            export,
            flags,
            structured: self.structured,
            contexts,
            block_size_acked,
            braid_session: self.session,
        }))
    }
}
