//! The initiator's side of an iSCSI login (RFC 7143, "Login and Full
//! Feature Phase Negotiation"), without I/O: Login Request PDUs out, Login
//! Response PDUs in, and at the end what the session runs with.
//!
//! The login always starts in the security stage, so a target that
//! requires CHAP is met where it expects it: with credentials, braid
//! offers `AuthMethod=CHAP` (and `None` as well unless it wants the
//! target proven too), answers the target's challenge, and for mutual
//! CHAP sends its own challenge and checks the answer before anything
//! moves on. The operational stage offers this side's keys, answers any
//! the target offers, and checks every answer against the RFC's result
//! functions: a target that answers outside them ends the login.

use bytes::Bytes;

use crate::chap::{self, Credentials};
use crate::login::{Status, FULL_FEATURE, OPERATIONAL, SECURITY};
use crate::negotiate::{self, Params};
use crate::pdu::{Bhs, Opcode, Pdu};
use crate::text;

/// An initiator session identifier (RFC 7143, "ISID"). Together with the
/// initiator's name it names the session to the target: a login with the
/// ISID of a session the target still holds replaces it (session
/// reinstatement), so every path of a volume needs its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Isid(pub [u8; 6]);

impl Isid {
    /// An ISID of the "random" format (type 0b10): 22 random bits drawn by
    /// the caller and a 16-bit qualifier (braid uses the path's number).
    pub fn random(random: u32, qualifier: u16) -> Self {
        let r = random.to_be_bytes();
        let q = qualifier.to_be_bytes();
        Self([0x80 | (r[1] & 0x3f), r[2], r[3], r[0], q[0], q[1]])
    }
}

impl std::fmt::Display for Isid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// What kind of session the login opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// SendTargets only.
    Discovery,
    /// I/O to the named target.
    Normal { target: String },
}

/// What the initiator asks for.
#[derive(Clone, Debug)]
pub struct LoginConfig {
    pub initiator: String,
    pub kind: Kind,
    pub isid: Isid,
    /// 0 opens a new session (or reinstates the one with this ISID).
    pub tsih: u16,
    pub cid: u16,
    /// The CmdSN the first command will carry.
    pub cmd_sn: u32,
    /// Credentials braid proves itself with; `mutual` is the name and
    /// secret the target must prove itself with.
    pub chap: Option<Credentials>,
    /// The identifier and challenge of this side's mutual CHAP (the
    /// caller draws them: no randomness here).
    pub chap_id: u8,
    pub chap_challenge: [u8; 16],
    /// This side's preferences and limits. Digests are offered as
    /// preferred (`CRC32C,None` when wanted, else `None`).
    pub params: Params,
}

/// What a completed login settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedIn {
    pub isid: Isid,
    pub tsih: u16,
    pub params: Params,
    /// The portal group the connection landed in, when the target said.
    pub portal_group_tag: Option<u16>,
    pub target_alias: Option<String>,
    /// The CmdSN of the first command, the StatSN expected next, and the
    /// target's window as the last response stated it.
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub max_cmd_sn: u32,
    pub exp_cmd_sn: u32,
}

/// What to do after a Login Response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send this request and read the next response.
    Send(Pdu),
    /// The connection is in full feature phase.
    Done(Box<LoggedIn>),
    /// The target sends the initiator elsewhere (status class 1): log in
    /// at `address` (`host[:port][,tag]`) instead.
    Redirect { address: String, permanent: bool },
}

/// Why a login failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LoginError {
    #[error("the target refused the login: {} (status {:#04x}/{:#04x})", describe(*.0), .0.0, .0.1)]
    Refused(Status),
    #[error("CHAP: {0}")]
    Auth(String),
    #[error("the target broke the login protocol: {0}")]
    Protocol(String),
}

/// The target's words for a status class and detail (RFC 7143, "Status-
/// Class and Status-Detail"), with what to check.
pub fn describe(s: Status) -> &'static str {
    match (s.0, s.1) {
        (2, 0x01) => "authentication failed (check the CHAP user and secret)",
        (2, 0x02) => "this initiator is not allowed to use the target (check its ACL)",
        (2, 0x03) => "no such target (check the IQN)",
        (2, 0x04) => "the target was removed",
        (2, 0x05) => "unsupported iSCSI version",
        (2, 0x06) => "too many connections",
        (2, 0x07) => "a required key is missing",
        (2, 0x08) => "the connection cannot join this session",
        (2, 0x09) => "session type not supported",
        (2, 0x0a) => "no such session",
        (2, 0x0b) => "invalid request during login",
        (2, _) => "initiator error",
        (3, 0x01) => "the target is busy (service unavailable); try again later",
        (3, 0x02) => "the target is out of resources",
        (3, _) => "target error",
        _ => "unknown status",
    }
}

/// Where CHAP stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Auth {
    /// AuthMethod offered, not answered yet.
    Offered,
    /// CHAP agreed; CHAP_A sent.
    AlgorithmSent,
    /// The response (and this side's own challenge) sent.
    Answered,
    /// Nothing left to prove, either way.
    Done,
}

/// The ITT every PDU of a login carries.
const LOGIN_ITT: u32 = 0;

/// One connection's login, initiator side.
#[derive(Debug)]
pub struct InitiatorLogin {
    cfg: LoginConfig,
    stage: u8,
    auth: Auth,
    exp_stat_sn: u32,
    /// Text of a response continued over several PDUs (C bit).
    pending: Vec<u8>,
    params: Params,
    /// Operational keys this side offered and has not had answered
    /// (those never answered keep the RFC's defaults).
    offered: Vec<(String, String)>,
    tsih: u16,
    portal_group_tag: Option<u16>,
    target_alias: Option<String>,
}

impl InitiatorLogin {
    pub fn new(cfg: LoginConfig) -> Self {
        let params = Params {
            max_recv_data: cfg.params.max_recv_data,
            ..Params::default()
        };
        Self {
            tsih: cfg.tsih,
            cfg,
            stage: SECURITY,
            auth: Auth::Offered,
            exp_stat_sn: 0,
            pending: Vec::new(),
            params,
            offered: Vec::new(),
            portal_group_tag: None,
            target_alias: None,
        }
    }

    /// The first Login Request.
    pub fn start(&mut self) -> Pdu {
        let mut keys: Vec<(String, String)> = vec![
            ("InitiatorName".into(), self.cfg.initiator.clone()),
            (
                "SessionType".into(),
                match self.cfg.kind {
                    Kind::Discovery => "Discovery",
                    Kind::Normal { .. } => "Normal",
                }
                .into(),
            ),
        ];
        if let Kind::Normal { target } = &self.cfg.kind {
            keys.push(("TargetName".into(), target.clone()));
        }
        let method = match &self.cfg.chap {
            None => "None",
            Some(c) if c.mutual.is_some() => "CHAP",
            Some(_) => "CHAP,None",
        };
        keys.push(("AuthMethod".into(), method.into()));
        self.request(true, OPERATIONAL, &keys)
    }

    /// Handles one Login Response.
    ///
    /// # Errors
    ///
    /// [`LoginError`]: the login is over and the connection must close.
    pub fn handle(&mut self, resp: &Pdu) -> Result<Step, LoginError> {
        let b = &resp.bhs.0;
        if resp.bhs.opcode() != Opcode::LoginResponse {
            return Err(proto(format!("a {:?} PDU during login", resp.bhs.opcode())));
        }
        if resp.bhs.itt() != LOGIN_ITT {
            return Err(proto("a Login Response for another task".into()));
        }
        self.exp_stat_sn = resp.bhs.u32_at(24).wrapping_add(1);
        let status = Status(b[36], b[37]);
        if status.0 == 1 {
            let pairs = text::parse(&resp.data).map_err(|e| proto(e.to_string()))?;
            let address = get(&pairs, "TargetAddress")
                .ok_or_else(|| proto("a redirect without TargetAddress".into()))?;
            return Ok(Step::Redirect {
                address: address.to_owned(),
                permanent: status.1 == 0x02,
            });
        }
        if status != Status::SUCCESS {
            return Err(LoginError::Refused(status));
        }
        if b[3] != 0 {
            return Err(proto(format!("version {} is not 0", b[3])));
        }
        let transit = b[1] & 0x80 != 0;
        let more = b[1] & 0x40 != 0;
        let csg = (b[1] >> 2) & 3;
        let nsg = b[1] & 3;
        if csg != self.stage {
            return Err(proto(format!(
                "answered for stage {csg} while the login is in stage {}",
                self.stage
            )));
        }
        self.pending.extend_from_slice(&resp.data);
        if self.pending.len() > 64 * 1024 {
            return Err(proto("more than 64 KiB of login text".into()));
        }
        if more {
            if transit {
                return Err(proto("T and C both set".into()));
            }
            // The rest of the text follows when asked with an empty request.
            let next = self.next_stage();
            return Ok(Step::Send(self.request(false, next, &[])));
        }
        let pairs =
            text::parse(&std::mem::take(&mut self.pending)).map_err(|e| proto(e.to_string()))?;
        self.login_keys(&pairs)?;
        let mut reply = if self.stage == SECURITY {
            self.chap(&pairs)?
        } else {
            self.operational(&pairs)?
        };
        if transit {
            let done = self.move_on(nsg)?;
            if done {
                self.tsih = u16::from_be_bytes([b[14], b[15]]);
                if self.tsih == 0 {
                    return Err(proto("the session was given TSIH 0".into()));
                }
                return Ok(Step::Done(Box::new(self.logged_in(resp))));
            }
            // Into the operational stage: this side's offer goes first.
            reply.extend(self.offer());
        }
        let next = self.next_stage();
        let want_transit = self.ready_to_move();
        Ok(Step::Send(self.request(want_transit, next, &reply)))
    }

    /// Keys of the login itself that may come in any response.
    fn login_keys(&mut self, pairs: &[(String, String)]) -> Result<(), LoginError> {
        for (k, v) in pairs {
            match k.as_str() {
                "TargetPortalGroupTag" => {
                    let tag = v
                        .parse()
                        .map_err(|_| proto(format!("TargetPortalGroupTag {v:?}")))?;
                    self.portal_group_tag = Some(tag);
                }
                "TargetAlias" => self.target_alias = Some(v.clone()),
                _ => {}
            }
        }
        Ok(())
    }

    /// The security stage's keys: the method chosen, then CHAP's steps.
    fn chap(&mut self, pairs: &[(String, String)]) -> Result<Vec<(String, String)>, LoginError> {
        let mut reply = Vec::new();
        match self.auth {
            Auth::Offered => {
                let Some(method) = get(pairs, "AuthMethod") else {
                    // Some targets settle nothing and let the stage pass.
                    return self.no_auth();
                };
                match (method, &self.cfg.chap) {
                    ("None", _) => return self.no_auth(),
                    ("CHAP", Some(_)) => {
                        reply.push(("CHAP_A".into(), "5".into()));
                        self.auth = Auth::AlgorithmSent;
                    }
                    ("CHAP", None) => {
                        return Err(LoginError::Auth(
                            "the target requires CHAP; give the user and secret (in the URI or \
                             with --chap-secret-file)"
                                .into(),
                        ))
                    }
                    (other, _) => {
                        return Err(proto(format!("AuthMethod {other:?} was not offered")));
                    }
                }
            }
            Auth::AlgorithmSent => {
                let creds = self.cfg.chap.clone().expect("CHAP agreed with credentials");
                if get(pairs, "CHAP_A") != Some("5") {
                    return Err(LoginError::Auth(
                        "the target does not speak CHAP with MD5 (CHAP_A=5)".into(),
                    ));
                }
                let id: u8 = get(pairs, "CHAP_I")
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| LoginError::Auth("no valid CHAP_I from the target".into()))?;
                let challenge = get(pairs, "CHAP_C")
                    .and_then(chap::from_hex)
                    .ok_or_else(|| LoginError::Auth("no valid CHAP_C from the target".into()))?;
                if creds.mutual.is_some() && challenge == self.cfg.chap_challenge {
                    // Answering our own challenge for the target would let
                    // it reflect the answer back at us.
                    return Err(LoginError::Auth(
                        "the target's challenge repeats this side's".into(),
                    ));
                }
                let r = chap::response(id, &creds.secret, &challenge);
                reply.push(("CHAP_N".into(), creds.user.clone()));
                reply.push(("CHAP_R".into(), chap::to_hex(&r)));
                if creds.mutual.is_some() {
                    reply.push(("CHAP_I".into(), self.cfg.chap_id.to_string()));
                    reply.push(("CHAP_C".into(), chap::to_hex(&self.cfg.chap_challenge)));
                }
                self.auth = Auth::Answered;
            }
            Auth::Answered => {
                let creds = self.cfg.chap.clone().expect("CHAP agreed with credentials");
                if let Some((name, secret)) = &creds.mutual {
                    let (Some(n), Some(r)) = (get(pairs, "CHAP_N"), get(pairs, "CHAP_R")) else {
                        return Err(LoginError::Auth(
                            "the target did not answer this side's challenge (mutual CHAP)".into(),
                        ));
                    };
                    let want = chap::response(self.cfg.chap_id, secret, &self.cfg.chap_challenge);
                    let got = chap::from_hex(r).unwrap_or_default();
                    if n != name || !chap::same(&got, &want) {
                        return Err(LoginError::Auth(format!(
                            "the target answered as {n:?} with a response that does not prove \
                             the secret expected of {name:?} (mutual CHAP)"
                        )));
                    }
                }
                self.auth = Auth::Done;
            }
            Auth::Done => {}
        }
        Ok(reply)
    }

    fn no_auth(&mut self) -> Result<Vec<(String, String)>, LoginError> {
        if self.cfg.chap.as_ref().is_some_and(|c| c.mutual.is_some()) {
            return Err(LoginError::Auth(
                "mutual CHAP was asked for, but the target would not authenticate".into(),
            ));
        }
        self.auth = Auth::Done;
        Ok(Vec::new())
    }

    /// Operational keys: answers to this side's offer, and this side's
    /// answers to keys the target offered.
    fn operational(
        &mut self,
        pairs: &[(String, String)],
    ) -> Result<Vec<(String, String)>, LoginError> {
        let mut theirs = Vec::new();
        for (k, v) in pairs {
            if negotiate::is_login_key(k) {
                continue;
            }
            if k == "MaxRecvDataSegmentLength" {
                let n: u32 = v
                    .parse()
                    .ok()
                    .filter(|n| (512..1 << 24).contains(n))
                    .ok_or_else(|| proto(format!("MaxRecvDataSegmentLength {v:?}")))?;
                self.params.peer_max_recv_data = n;
                continue;
            }
            match self.offered.iter().position(|(o, _)| o == k) {
                Some(at) => {
                    let (_, ours) = self.offered.remove(at);
                    settle(&mut self.params, k, &ours, v)?;
                }
                None => theirs.push((k.clone(), v.clone())),
            }
        }
        let ours = self.cfg.params;
        let digests = negotiate::Digests {
            none: true,
            crc32c: ours.header_digest || ours.data_digest,
        };
        Ok(negotiate::respond_into(
            &theirs,
            &ours,
            digests,
            &mut self.params,
        ))
    }

    /// This side's operational offer.
    fn offer(&mut self) -> Vec<(String, String)> {
        let p = &self.cfg.params;
        let digest = |on: bool| if on { "CRC32C,None" } else { "None" };
        let yes = |on: bool| if on { "Yes" } else { "No" };
        let mut keys: Vec<(String, String)> = vec![
            ("HeaderDigest".into(), digest(p.header_digest).into()),
            ("DataDigest".into(), digest(p.data_digest).into()),
        ];
        if let Kind::Normal { .. } = self.cfg.kind {
            keys.extend([
                ("InitialR2T".into(), yes(p.initial_r2t).into()),
                ("ImmediateData".into(), yes(p.immediate_data).into()),
                ("MaxBurstLength".into(), p.max_burst.to_string()),
                ("FirstBurstLength".into(), p.first_burst.to_string()),
                (
                    "MaxOutstandingR2T".into(),
                    p.max_outstanding_r2t.to_string(),
                ),
                ("MaxConnections".into(), "1".into()),
                ("DataPDUInOrder".into(), "Yes".into()),
                ("DataSequenceInOrder".into(), "Yes".into()),
                ("ErrorRecoveryLevel".into(), "0".into()),
                ("DefaultTime2Wait".into(), p.default_time2wait.to_string()),
                (
                    "DefaultTime2Retain".into(),
                    p.default_time2retain.to_string(),
                ),
            ]);
        }
        self.offered = keys.clone();
        keys.push((
            "MaxRecvDataSegmentLength".into(),
            p.max_recv_data.to_string(),
        ));
        keys
    }

    /// The target agreed to move to `nsg`; whether the login is complete.
    fn move_on(&mut self, nsg: u8) -> Result<bool, LoginError> {
        match (self.stage, nsg) {
            (SECURITY, OPERATIONAL) if self.auth == Auth::Done => {
                self.stage = OPERATIONAL;
                Ok(false)
            }
            (SECURITY, _) => Err(proto("moved on before authentication was done".into())),
            (OPERATIONAL, FULL_FEATURE) => Ok(true),
            (s, n) => Err(proto(format!("no way from stage {s} to stage {n}"))),
        }
    }

    fn ready_to_move(&self) -> bool {
        match self.stage {
            SECURITY => matches!(self.auth, Auth::Answered | Auth::Done),
            _ => true,
        }
    }

    fn next_stage(&self) -> u8 {
        if self.stage == SECURITY {
            OPERATIONAL
        } else {
            FULL_FEATURE
        }
    }

    fn request(&self, transit: bool, nsg: u8, keys: &[(String, String)]) -> Pdu {
        let mut bhs = Bhs::new(Opcode::LoginRequest);
        bhs.set_immediate(true);
        bhs.0[1] = (u8::from(transit) << 7) | (self.stage << 2) | if transit { nsg } else { 0 };
        bhs.0[2] = 0; // version-max
        bhs.0[3] = 0; // version-min
        bhs.0[8..14].copy_from_slice(&self.cfg.isid.0);
        bhs.0[14..16].copy_from_slice(&self.cfg.tsih.to_be_bytes());
        bhs.set_itt(LOGIN_ITT);
        bhs.0[20..22].copy_from_slice(&self.cfg.cid.to_be_bytes());
        bhs.set_u32(24, self.cfg.cmd_sn);
        bhs.set_u32(28, self.exp_stat_sn);
        Pdu::new(bhs, Bytes::from(text::encode(keys)))
    }

    fn logged_in(&self, resp: &Pdu) -> LoggedIn {
        let mut params = self.params;
        // Unanswered offers keep the RFC's defaults (set in `params`).
        params.max_recv_data = self.cfg.params.max_recv_data;
        params.first_burst = params.first_burst.min(params.max_burst);
        LoggedIn {
            isid: self.cfg.isid,
            tsih: self.tsih,
            params,
            portal_group_tag: self.portal_group_tag,
            target_alias: self.target_alias.clone(),
            cmd_sn: self.cfg.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
            exp_cmd_sn: resp.bhs.u32_at(28),
            max_cmd_sn: resp.bhs.u32_at(32),
        }
    }
}

/// Applies the target's answer `theirs` to a key this side offered as
/// `ours`, checking it is a result the RFC allows.
fn settle(p: &mut Params, key: &str, ours: &str, theirs: &str) -> Result<(), LoginError> {
    let bad = || proto(format!("{key}={theirs} answers an offer of {ours}"));
    if matches!(theirs, "Reject" | "Irrelevant" | "NotUnderstood") {
        // The key keeps its default.
        return Ok(());
    }
    let number = |v: &str| v.parse::<u32>().map_err(|_| bad());
    let boolean = |v: &str| match v {
        "Yes" => Ok(true),
        "No" => Ok(false),
        _ => Err(bad()),
    };
    match key {
        "HeaderDigest" | "DataDigest" => {
            if !ours.split(',').any(|o| o == theirs) {
                return Err(bad());
            }
            let on = theirs == "CRC32C";
            if key == "HeaderDigest" {
                p.header_digest = on;
            } else {
                p.data_digest = on;
            }
        }
        "MaxBurstLength" | "FirstBurstLength" | "MaxOutstandingR2T" | "MaxConnections"
        | "ErrorRecoveryLevel" | "DefaultTime2Retain" => {
            let (mine, got) = (number(ours)?, number(theirs)?);
            if got > mine
                || (got == 0 && key != "ErrorRecoveryLevel" && key != "DefaultTime2Retain")
            {
                return Err(bad());
            }
            match key {
                "MaxBurstLength" => p.max_burst = got,
                "FirstBurstLength" => p.first_burst = got,
                "MaxOutstandingR2T" => p.max_outstanding_r2t = got,
                "MaxConnections" => p.max_connections = got,
                "ErrorRecoveryLevel" => p.error_recovery_level = got,
                _ => p.default_time2retain = got,
            }
        }
        "DefaultTime2Wait" => {
            let (mine, got) = (number(ours)?, number(theirs)?);
            if got < mine || got > 3600 {
                return Err(bad());
            }
            p.default_time2wait = got;
        }
        "InitialR2T" | "DataPDUInOrder" | "DataSequenceInOrder" => {
            // OR: an offer of Yes can only be answered Yes.
            let (mine, got) = (boolean(ours)?, boolean(theirs)?);
            if mine && !got {
                return Err(bad());
            }
            match key {
                "InitialR2T" => p.initial_r2t = got,
                "DataPDUInOrder" => p.data_pdu_in_order = got,
                _ => p.data_sequence_in_order = got,
            }
        }
        "ImmediateData" => {
            // AND: an offer of No can only be answered No.
            let (mine, got) = (boolean(ours)?, boolean(theirs)?);
            if !mine && got {
                return Err(bad());
            }
            p.immediate_data = got;
        }
        _ => return Err(bad()),
    }
    Ok(())
}

fn get<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn proto(why: String) -> LoginError {
    LoginError::Protocol(why)
}
