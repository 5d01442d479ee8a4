//! Operational keys of a login (RFC 7143, "Login/Text Operational Text
//! Keys"), negotiated as the RFC's result functions say: a list of
//! choices (digests), the minimum or maximum of two numbers, boolean OR or
//! AND, or declared by each side for itself (`MaxRecvDataSegmentLength`).
//!
//! [`respond`] is the answering side: it takes the keys the other side
//! offered and its own limits, and returns the answers and the result.

/// What a session and its connection run with. `Default` is the RFC's
/// defaults, which hold for every key nobody offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub header_digest: bool,
    pub data_digest: bool,
    /// Most data this side accepts in one PDU (declared by this side).
    pub max_recv_data: u32,
    /// Most data the other side accepts in one PDU (declared by it).
    pub peer_max_recv_data: u32,
    pub max_burst: u32,
    pub first_burst: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_outstanding_r2t: u32,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u32,
    pub max_connections: u32,
    pub default_time2wait: u32,
    pub default_time2retain: u32,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            header_digest: false,
            data_digest: false,
            max_recv_data: 8192,
            peer_max_recv_data: 8192,
            max_burst: 262_144,
            first_burst: 65_536,
            initial_r2t: true,
            immediate_data: true,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            max_connections: 1,
            default_time2wait: 2,
            default_time2retain: 20,
        }
    }
}

/// How the two sides' values of a key combine.
#[derive(Clone, Copy)]
enum Rule {
    /// A list in order of preference; the answer is the first the
    /// answering side supports.
    Digest,
    Min(u32, u32),
    Max(u32, u32),
    Or,
    And,
    /// Each side states its own value; it is not answered.
    Declared(u32, u32),
    /// Obsoleted by RFC 7143 (RFC 3720's markers): answered Reject, so
    /// the default (no markers) holds. NotUnderstood, the answer to keys
    /// nobody defined, is forbidden for these: RFC 3720 initiators send
    /// them and expect an answer they know.
    Obsolete,
}

fn rule(key: &str) -> Option<Rule> {
    const LEN: (u32, u32) = (512, (1 << 24) - 1);
    Some(match key {
        "HeaderDigest" | "DataDigest" => Rule::Digest,
        "MaxRecvDataSegmentLength" => Rule::Declared(LEN.0, LEN.1),
        "MaxBurstLength" | "FirstBurstLength" => Rule::Min(LEN.0, LEN.1),
        "MaxOutstandingR2T" | "MaxConnections" => Rule::Min(1, 65535),
        "ErrorRecoveryLevel" => Rule::Min(0, 2),
        "DefaultTime2Wait" => Rule::Max(0, 3600),
        "DefaultTime2Retain" => Rule::Min(0, 3600),
        "InitialR2T" | "DataPDUInOrder" | "DataSequenceInOrder" => Rule::Or,
        "ImmediateData" => Rule::And,
        "IFMarker" | "OFMarker" | "IFMarkInt" | "OFMarkInt" => Rule::Obsolete,
        _ => return None,
    })
}

/// Keys the login state machine handles itself (names, session type,
/// authentication, the portal group), not negotiated here.
pub fn is_login_key(key: &str) -> bool {
    matches!(
        key,
        "InitiatorName"
            | "InitiatorAlias"
            | "TargetName"
            | "TargetAlias"
            | "TargetAddress"
            | "TargetPortalGroupTag"
            | "SessionType"
            | "AuthMethod"
            | "CHAP_A"
            | "CHAP_I"
            | "CHAP_C"
            | "CHAP_N"
            | "CHAP_R"
            | "SendTargets"
    )
}

/// The answering side's outcome: what to send back, and the result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub pairs: Vec<(String, String)>,
    pub params: Params,
}

/// Answers the operational keys in `offered` with `ours` (this side's
/// preferences and limits: its digests wanted, its maximums, its boolean
/// preferences). Keys it does not know are answered `NotUnderstood`, values
/// out of range or unparsable `Reject` (the key keeps its default), as the
/// RFC asks; keys of the login itself are left to the caller.
pub fn respond(offered: &[(String, String)], ours: &Params, digests_ok: Digests) -> Answer {
    let mut params = Params {
        max_recv_data: ours.max_recv_data,
        ..Params::default()
    };
    let pairs = respond_into(offered, ours, digests_ok, &mut params);
    Answer { pairs, params }
}

/// [`respond`] for a negotiation spread over several PDUs: each answer
/// updates `params`, which keeps what earlier PDUs settled.
pub fn respond_into(
    offered: &[(String, String)],
    ours: &Params,
    digests_ok: Digests,
    params: &mut Params,
) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    for (key, value) in offered {
        if is_login_key(key) {
            continue;
        }
        let Some(r) = rule(key) else {
            pairs.push((key.clone(), "NotUnderstood".to_owned()));
            continue;
        };
        let answer = match r {
            Rule::Obsolete => Some("Reject".to_owned()),
            Rule::Digest => {
                let pick = value.split(',').map(str::trim).find(|v| match *v {
                    "None" => digests_ok.none,
                    "CRC32C" => digests_ok.crc32c,
                    _ => false,
                });
                if let Some(v) = pick {
                    set_bool(params, key, v == "CRC32C");
                }
                Some(pick.unwrap_or("Reject").to_owned())
            }
            Rule::Min(lo, hi) | Rule::Max(lo, hi) | Rule::Declared(lo, hi) => {
                match value.parse::<u32>().ok().filter(|v| (lo..=hi).contains(v)) {
                    None => Some("Reject".to_owned()),
                    Some(theirs) => {
                        let mine = number(ours, key);
                        let result = match r {
                            Rule::Min(..) => theirs.min(mine),
                            Rule::Max(..) => theirs.max(mine),
                            _ => theirs,
                        };
                        set_number(params, key, result);
                        (!matches!(r, Rule::Declared(..))).then(|| result.to_string())
                    }
                }
            }
            Rule::Or | Rule::And => match value.as_str() {
                "Yes" | "No" => {
                    let theirs = value == "Yes";
                    let mine = boolean(ours, key);
                    let result = if matches!(r, Rule::Or) {
                        theirs || mine
                    } else {
                        theirs && mine
                    };
                    set_bool(params, key, result);
                    Some(if result { "Yes" } else { "No" }.to_owned())
                }
                _ => Some("Reject".to_owned()),
            },
        };
        if let Some(a) = answer {
            pairs.push((key.clone(), a));
        }
    }
    // The RFC forbids a first burst larger than the whole burst.
    params.first_burst = params.first_burst.min(params.max_burst);
    pairs
}

/// Which digest values the answering side accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digests {
    pub none: bool,
    pub crc32c: bool,
}

fn number(p: &Params, key: &str) -> u32 {
    match key {
        "MaxRecvDataSegmentLength" => p.max_recv_data,
        "MaxBurstLength" => p.max_burst,
        "FirstBurstLength" => p.first_burst,
        "MaxOutstandingR2T" => p.max_outstanding_r2t,
        "MaxConnections" => p.max_connections,
        "ErrorRecoveryLevel" => p.error_recovery_level,
        "DefaultTime2Wait" => p.default_time2wait,
        "DefaultTime2Retain" => p.default_time2retain,
        _ => unreachable!("not a numeric key: {key}"),
    }
}

fn set_number(p: &mut Params, key: &str, v: u32) {
    match key {
        // Declared by the other side: its own receive limit.
        "MaxRecvDataSegmentLength" => p.peer_max_recv_data = v,
        "MaxBurstLength" => p.max_burst = v,
        "FirstBurstLength" => p.first_burst = v,
        "MaxOutstandingR2T" => p.max_outstanding_r2t = v,
        "MaxConnections" => p.max_connections = v,
        "ErrorRecoveryLevel" => p.error_recovery_level = v,
        "DefaultTime2Wait" => p.default_time2wait = v,
        "DefaultTime2Retain" => p.default_time2retain = v,
        _ => unreachable!("not a numeric key: {key}"),
    }
}

fn boolean(p: &Params, key: &str) -> bool {
    match key {
        "InitialR2T" => p.initial_r2t,
        "ImmediateData" => p.immediate_data,
        "DataPDUInOrder" => p.data_pdu_in_order,
        "DataSequenceInOrder" => p.data_sequence_in_order,
        _ => unreachable!("not a boolean key: {key}"),
    }
}

fn set_bool(p: &mut Params, key: &str, v: bool) {
    match key {
        "HeaderDigest" => p.header_digest = v,
        "DataDigest" => p.data_digest = v,
        "InitialR2T" => p.initial_r2t = v,
        "ImmediateData" => p.immediate_data = v,
        "DataPDUInOrder" => p.data_pdu_in_order = v,
        "DataSequenceInOrder" => p.data_sequence_in_order = v,
        _ => unreachable!("not a boolean key: {key}"),
    }
}
