//! The target's side of an iSCSI login (RFC 7143, "Login and Full Feature
//! Phase Negotiation"), without I/O: Login Request PDUs in, Login Response
//! PDUs out, and at the end what the session runs with.
//!
//! Stages: security negotiation (0), operational negotiation (1), full
//! feature phase (3). The initiator asks to move on with the T bit and
//! the stage it wants next; the target agrees by answering with the same.
//! The initiator's name and session type, in the first request, choose
//! what the login must prove ([`crate::access`]): an initiator the access
//! list refuses is turned away at once, and one whose grant (or, for a
//! discovery session, the discovery credential) holds CHAP credentials
//! runs CHAP (MD5, and mutual CHAP when the initiator asks and the target
//! has its own secret) in the security stage, and nothing moves past it
//! unauthenticated; without, `AuthMethod=None`. The name cannot change
//! once given, so a secret proves the name it was checked against.
//! A login that cannot go on is answered with a status class and detail,
//! after which the connection ends.

use std::sync::Arc;

use bytes::Bytes;

use crate::access::Access;
use crate::chap::{self, Credentials};
use crate::names;
use crate::negotiate::{self, Params};
use crate::pdu::{Bhs, Opcode, Pdu};
use crate::text;

/// Login stages as the CSG/NSG fields number them.
pub const SECURITY: u8 = 0;
pub const OPERATIONAL: u8 = 1;
pub const FULL_FEATURE: u8 = 3;

/// A login response's status: class (byte 36) and detail (byte 37).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status(pub u8, pub u8);

impl Status {
    pub const SUCCESS: Status = Status(0, 0);
    /// Authentication failure: the CHAP exchange failed.
    pub const AUTH_FAILED: Status = Status(2, 1);
    /// Authorization failure: this initiator may not log in here.
    pub const NOT_AUTHORIZED: Status = Status(2, 2);
    pub const NOT_FOUND: Status = Status(2, 3);
    pub const UNSUPPORTED_VERSION: Status = Status(2, 5);
    pub const MISSING_PARAMETER: Status = Status(2, 7);
    pub const SESSION_TYPE_UNSUPPORTED: Status = Status(2, 9);
    pub const INVALID_DURING_LOGIN: Status = Status(2, 0x0b);
    pub const INITIATOR_ERROR: Status = Status(2, 0);
    pub const TARGET_ERROR: Status = Status(3, 0);
}

/// What the target serves, for logins to check against.
#[derive(Clone, Debug)]
pub struct TargetConfig {
    /// Target names (IQNs) a normal session may name.
    pub targets: Vec<String>,
    /// This side's operational preferences and limits.
    pub params: Params,
    pub digests: negotiate::Digests,
    /// The portal group this connection arrived on.
    pub portal_group_tag: u16,
    /// Who may log in, with which credentials, to which targets.
    pub access: Arc<Access>,
    /// The random identifier and challenge this connection's CHAP uses
    /// (the caller draws them: no I/O here, not even randomness).
    pub chap_id: u8,
    pub chap_challenge: [u8; 16],
}

/// Where CHAP stands on this connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Auth {
    /// Not chosen yet (or not configured).
    Start,
    /// AuthMethod=CHAP agreed; CHAP_A next.
    Chosen,
    /// Challenge sent; CHAP_N and CHAP_R next.
    Challenged,
    /// The initiator proved itself (or no CHAP is configured).
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionType {
    Discovery,
    Normal,
}

/// A completed login.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub initiator: String,
    /// `None` for a discovery session.
    pub target: Option<String>,
    pub kind: SessionType,
    pub isid: [u8; 6],
    pub params: Params,
    /// The CmdSN the first full-feature command will carry.
    pub exp_cmd_sn: u32,
    /// The StatSN the next response will carry.
    pub stat_sn: u32,
}

/// What to do after a Login Request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send this response and read the next request.
    Continue(Pdu),
    /// Send this response; the connection is in full feature phase.
    Complete(Pdu, Box<Session>),
    /// Send this response, then close the connection.
    Fail(Pdu, Status, String),
}

/// One connection's login, target side.
#[derive(Debug)]
pub struct TargetLogin {
    cfg: TargetConfig,
    stage: u8,
    params: Params,
    initiator: Option<String>,
    target: Option<String>,
    kind: SessionType,
    isid: [u8; 6],
    /// Text of a request continued over several PDUs (C bit).
    pending: Vec<u8>,
    stat_sn: u32,
    exp_cmd_sn: u32,
    started: bool,
    tpgt_sent: bool,
    auth: Auth,
    /// What this login must prove, once its first request named the
    /// initiator: `Some(None)` is AuthMethod None.
    chap: Option<Option<Credentials>>,
}

impl TargetLogin {
    pub fn new(cfg: TargetConfig) -> Self {
        let params = Params {
            max_recv_data: cfg.params.max_recv_data,
            ..Params::default()
        };
        Self {
            cfg,
            stage: SECURITY,
            params,
            initiator: None,
            target: None,
            kind: SessionType::Normal,
            isid: [0; 6],
            pending: Vec::new(),
            stat_sn: 0,
            exp_cmd_sn: 0,
            started: false,
            tpgt_sent: false,
            auth: Auth::Start,
            chap: None,
        }
    }

    /// Bytes of continued login text held.
    pub fn buffered(&self) -> usize {
        self.pending.len()
    }

    /// Handles one PDU of the login phase.
    pub fn handle(&mut self, req: &Pdu) -> Step {
        let b = &req.bhs.0;
        if req.bhs.opcode() != Opcode::LoginRequest {
            return self.fail(
                req,
                Status::INVALID_DURING_LOGIN,
                "only Login Requests before login completes",
            );
        }
        if !self.started {
            self.started = true;
            self.isid.copy_from_slice(&b[8..14]);
            // The first response's StatSN is the initiator's ExpStatSN.
            self.stat_sn = req.bhs.u32_at(28);
            if b[3] > 0 {
                return self.fail(
                    req,
                    Status::UNSUPPORTED_VERSION,
                    "only iSCSI version 0 exists",
                );
            }
        }
        self.exp_cmd_sn = req.bhs.u32_at(24);
        let transit = b[1] & 0x80 != 0;
        let more = b[1] & 0x40 != 0;
        let csg = (b[1] >> 2) & 3;
        let nsg = b[1] & 3;
        if transit && more {
            return self.fail(req, Status::INVALID_DURING_LOGIN, "T and C both set");
        }
        if csg != self.stage && !(self.stage == SECURITY && csg == OPERATIONAL) {
            return self.fail(
                req,
                Status::INVALID_DURING_LOGIN,
                "login stage out of order",
            );
        }
        if csg == OPERATIONAL && self.needs_chap() {
            return self.fail(req, Status::AUTH_FAILED, SKIPPED);
        }
        // The security stage may be skipped by starting in operational.
        self.stage = csg;
        if self.pending.len() + req.data.len() > text::MAX_TEXT {
            let why = format!(
                "login text past {} bytes (over continued PDUs): more than any login needs",
                text::MAX_TEXT
            );
            return self.fail(req, Status::INITIATOR_ERROR, &why);
        }
        self.pending.extend_from_slice(&req.data);
        if more {
            // The rest of the text follows; acknowledge with no keys.
            return Step::Continue(self.response(req, false, 0, Bytes::new(), Status::SUCCESS));
        }
        let text = std::mem::take(&mut self.pending);
        let pairs = match text::parse(&text) {
            Ok(p) => p,
            Err(e) => return self.fail(req, Status::INVALID_DURING_LOGIN, &e.to_string()),
        };
        let mut answer: Vec<(String, String)> = Vec::new();
        if let Err((status, why)) = self.login_keys(&pairs, &mut answer) {
            return self.fail(req, status, &why);
        }
        if self.stage == OPERATIONAL && self.needs_chap() {
            // A first request that starts in the operational stage is
            // checked once it has named its initiator.
            return self.fail(req, Status::AUTH_FAILED, SKIPPED);
        }
        if self.stage == OPERATIONAL {
            let ops: Vec<(String, String)> = pairs
                .iter()
                .filter(|(k, _)| !negotiate::is_login_key(k) && k != "AuthMethod")
                .cloned()
                .collect();
            answer.extend(negotiate::respond_into(
                &ops,
                &self.cfg.params,
                self.cfg.digests,
                &mut self.params,
            ));
            if !answer.iter().any(|(k, _)| k == "MaxRecvDataSegmentLength") {
                // Declarative: stated whether asked or not.
                answer.push((
                    "MaxRecvDataSegmentLength".into(),
                    self.cfg.params.max_recv_data.to_string(),
                ));
            }
        }
        let data = Bytes::from(text::encode(&answer));
        if !transit {
            return Step::Continue(self.response(req, false, 0, data, Status::SUCCESS));
        }
        if self.needs_chap() {
            // An initiator may ask to move on at once; the target keeps it
            // in the security stage (T clear) until CHAP is done.
            return Step::Continue(self.response(req, false, 0, data, Status::SUCCESS));
        }
        let next = match (self.stage, nsg) {
            (SECURITY, OPERATIONAL) | (SECURITY, FULL_FEATURE) | (OPERATIONAL, FULL_FEATURE) => nsg,
            _ => return self.fail(req, Status::INVALID_DURING_LOGIN, "no such next stage"),
        };
        if next == FULL_FEATURE {
            let Some(initiator) = self.initiator.clone() else {
                return self.fail(
                    req,
                    Status::MISSING_PARAMETER,
                    "InitiatorName was never given",
                );
            };
            if self.kind == SessionType::Normal && self.target.is_none() {
                return self.fail(
                    req,
                    Status::MISSING_PARAMETER,
                    "a normal session needs TargetName",
                );
            }
            let resp = self.response(req, true, next, data, Status::SUCCESS);
            let session = Session {
                initiator,
                target: self.target.clone(),
                kind: self.kind,
                isid: self.isid,
                params: self.params,
                exp_cmd_sn: self.exp_cmd_sn,
                stat_sn: self.stat_sn,
            };
            return Step::Complete(resp, Box::new(session));
        }
        let resp = self.response(req, true, next, data, Status::SUCCESS);
        self.stage = next;
        Step::Continue(resp)
    }

    /// Whether CHAP is still owed: the initiator is known and its grant
    /// holds credentials it has not proven yet.
    fn needs_chap(&self) -> bool {
        matches!(self.chap, Some(Some(_))) && self.auth != Auth::Done
    }

    /// The keys of the login itself: names, session type, authentication.
    fn login_keys(
        &mut self,
        pairs: &[(String, String)],
        answer: &mut Vec<(String, String)>,
    ) -> Result<(), (Status, String)> {
        // Who is asking comes first, whatever the order of the keys: the
        // access list decides what the rest of the request may do.
        for (key, value) in pairs {
            match key.as_str() {
                "InitiatorName" => {
                    named("InitiatorName", value)?;
                    if self.initiator.as_ref().is_some_and(|i| i != value) {
                        return Err((
                            Status::INITIATOR_ERROR,
                            "InitiatorName changed during the login".into(),
                        ));
                    }
                    self.initiator = Some(value.clone());
                }
                "SessionType" => {
                    let kind = match value.as_str() {
                        "Discovery" => SessionType::Discovery,
                        "Normal" => SessionType::Normal,
                        _ => {
                            return Err((
                                Status::SESSION_TYPE_UNSUPPORTED,
                                format!("session type {value:?}"),
                            ))
                        }
                    };
                    if self.chap.is_some() && kind != self.kind {
                        return Err((
                            Status::INITIATOR_ERROR,
                            "SessionType changed after the first Login Request".into(),
                        ));
                    }
                    self.kind = kind;
                }
                _ => {}
            }
        }
        let Some(initiator) = self.initiator.clone() else {
            return Err((
                Status::MISSING_PARAMETER,
                "InitiatorName is required".into(),
            ));
        };
        if self.chap.is_none() {
            let Some(grant) = self.cfg.access.grant(&initiator) else {
                return Err((
                    Status::NOT_AUTHORIZED,
                    format!("initiator {initiator:?} is not in this target's access list"),
                ));
            };
            self.chap = Some(match self.kind {
                SessionType::Discovery => self.cfg.access.discovery.clone(),
                SessionType::Normal => grant.chap.clone(),
            });
        }
        for (key, value) in pairs {
            match key.as_str() {
                "TargetName" => {
                    // A name this target serves is taken as it is (an
                    // export's name may make one RFC 3722 would not); one
                    // this initiator may not see is as absent as one not
                    // served.
                    if !self.cfg.targets.iter().any(|t| t == value)
                        || !self.cfg.access.sees(&initiator, value)
                    {
                        named("TargetName", value)?;
                        return Err((Status::NOT_FOUND, format!("no target named {value:?} here")));
                    }
                    self.target = Some(value.clone());
                }
                "AuthMethod" => {
                    let offered = |m: &str| value.split(',').any(|v| v.trim() == m);
                    let chap = matches!(self.chap, Some(Some(_)));
                    let chosen = if chap { "CHAP" } else { "None" };
                    if !offered(chosen) {
                        return Err((
                            Status::AUTH_FAILED,
                            format!("AuthMethod {value:?}: this target requires {chosen}"),
                        ));
                    }
                    if chap {
                        self.auth = Auth::Chosen;
                    }
                    answer.push(("AuthMethod".into(), chosen.into()));
                }
                _ => {}
            }
        }
        self.chap_keys(pairs, answer)?;
        // A normal session learns its portal group in the first response
        // after it named its target.
        if self.target.is_some() && !self.tpgt_sent {
            self.tpgt_sent = true;
            answer.push((
                "TargetPortalGroupTag".into(),
                self.cfg.portal_group_tag.to_string(),
            ));
        }
        Ok(())
    }

    /// CHAP's steps in the security stage; without credentials configured
    /// the login is authenticated as soon as it starts.
    fn chap_keys(
        &mut self,
        pairs: &[(String, String)],
        answer: &mut Vec<(String, String)>,
    ) -> Result<(), (Status, String)> {
        let Some(Some(creds)) = self.chap.clone() else {
            self.auth = Auth::Done;
            return Ok(());
        };
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        let fail = |why: &str| Err((Status::AUTH_FAILED, why.to_owned()));
        match self.auth {
            Auth::Chosen => {
                let Some(algs) = get("CHAP_A") else {
                    return Ok(());
                };
                if !algs.split(',').any(|a| a.trim() == "5") {
                    return fail("CHAP_A: this target speaks only MD5 (5)");
                }
                answer.push(("CHAP_A".into(), "5".into()));
                answer.push(("CHAP_I".into(), self.cfg.chap_id.to_string()));
                answer.push(("CHAP_C".into(), chap::to_hex(&self.cfg.chap_challenge)));
                self.auth = Auth::Challenged;
            }
            Auth::Challenged => {
                let (Some(name), Some(resp)) = (get("CHAP_N"), get("CHAP_R")) else {
                    return fail("CHAP_N and CHAP_R were expected");
                };
                let want =
                    chap::response(self.cfg.chap_id, &creds.secret, &self.cfg.chap_challenge);
                let got = chap::from_hex(resp).unwrap_or_default();
                if name != creds.user || !chap::same(&got, &want) {
                    return fail("CHAP: wrong name or secret");
                }
                if let (Some(id), Some(challenge)) = (get("CHAP_I"), get("CHAP_C")) {
                    let Some((target_user, target_secret)) = &creds.mutual else {
                        return fail("mutual CHAP asked, but this target has no secret of its own");
                    };
                    let id: u8 = id
                        .parse()
                        .map_err(|_| (Status::AUTH_FAILED, "CHAP_I is not 0-255".to_owned()))?;
                    let challenge = chap::from_hex(challenge)
                        .ok_or((Status::AUTH_FAILED, "CHAP_C is not hex".to_owned()))?;
                    if challenge == self.cfg.chap_challenge {
                        // Our own challenge sent back would make us answer
                        // it for the attacker (a reflection attack).
                        return fail("CHAP_C repeats this target's challenge");
                    }
                    let r = chap::response(id, target_secret, &challenge);
                    answer.push(("CHAP_N".into(), target_user.clone()));
                    answer.push(("CHAP_R".into(), chap::to_hex(&r)));
                }
                self.auth = Auth::Done;
            }
            Auth::Start if get("CHAP_N").is_some() || get("CHAP_R").is_some() => {
                return fail("CHAP keys before AuthMethod=CHAP was agreed");
            }
            Auth::Start | Auth::Done => {}
        }
        Ok(())
    }

    fn response(&mut self, req: &Pdu, transit: bool, nsg: u8, data: Bytes, status: Status) -> Pdu {
        let mut bhs = Bhs::new(Opcode::LoginResponse);
        let b = &mut bhs.0;
        b[1] = (u8::from(transit) << 7) | (self.stage << 2) | if transit { nsg } else { 0 };
        b[2] = 0; // version-max
        b[3] = 0; // version-active
        b[8..14].copy_from_slice(&self.isid);
        // TSIH: one session per connection here, so any non-zero handle.
        b[14..16].copy_from_slice(&1u16.to_be_bytes());
        bhs.set_itt(req.bhs.itt());
        bhs.set_u32(24, self.stat_sn);
        bhs.set_u32(28, self.exp_cmd_sn);
        bhs.set_u32(32, self.exp_cmd_sn);
        bhs.0[36] = status.0;
        bhs.0[37] = status.1;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        Pdu::new(bhs, data)
    }

    fn fail(&mut self, req: &Pdu, status: Status, why: &str) -> Step {
        let resp = self.response(req, false, 0, Bytes::new(), status);
        Step::Fail(resp, status, why.to_owned())
    }
}

const SKIPPED: &str =
    "this target requires CHAP of this initiator: the security stage cannot be skipped";

/// Refuses a name that is not an iSCSI name with 0x0207 (RFC 7143 gives
/// that status to a missing or invalid parameter).
fn named(key: &str, value: &str) -> Result<(), (Status, String)> {
    names::check(value).map_err(|e| {
        let shown: String = value.chars().take(80).collect();
        (Status::MISSING_PARAMETER, format!("{key} {shown:?} {e}"))
    })
}
