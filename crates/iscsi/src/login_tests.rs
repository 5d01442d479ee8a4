//! The target's login against requests built byte by byte, as an
//! initiator sends them.

use bytes::Bytes;

use crate::login::{
    SessionType, Status, Step, TargetConfig, TargetLogin, FULL_FEATURE, OPERATIONAL, SECURITY,
};
use crate::negotiate::{self, Params};
use crate::pdu::{Bhs, Opcode, Pdu};
use crate::text;

const TARGET: &str = "iqn.2026-11.org.example:vol";
const ISID: [u8; 6] = [0x80, 0x12, 0x34, 0x56, 0x00, 0x01];

fn target() -> TargetLogin {
    TargetLogin::new(TargetConfig {
        targets: vec![TARGET.into()],
        params: Params {
            max_recv_data: 262_144,
            max_burst: 1 << 20,
            first_burst: 65_536,
            initial_r2t: false,
            ..Params::default()
        },
        digests: negotiate::Digests {
            none: true,
            crc32c: true,
        },
        portal_group_tag: 3,
    })
}

/// A Login Request: T/C bits, stages, ISID, ITT 0x77, CmdSN 5,
/// ExpStatSN 9, and the text pairs.
fn request(transit: bool, more: bool, csg: u8, nsg: u8, pairs: &[(&str, &str)]) -> Pdu {
    let mut bhs = Bhs::new(Opcode::LoginRequest);
    bhs.set_immediate(true);
    bhs.0[1] = (u8::from(transit) << 7) | (u8::from(more) << 6) | (csg << 2) | nsg;
    bhs.0[8..14].copy_from_slice(&ISID);
    bhs.set_itt(0x77);
    bhs.set_u32(24, 5);
    bhs.set_u32(28, 9);
    Pdu::new(bhs, Bytes::from(text::encode(pairs)))
}

fn keys(pdu: &Pdu) -> Vec<(String, String)> {
    text::parse(&pdu.data).unwrap()
}

fn get<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[test]
fn a_normal_login_through_both_stages() {
    let mut t = target();
    let step = t.handle(&request(
        true,
        false,
        SECURITY,
        OPERATIONAL,
        &[
            ("InitiatorName", "iqn.2026-11.org.example:client"),
            ("SessionType", "Normal"),
            ("TargetName", TARGET),
            ("AuthMethod", "CHAP,None"),
        ],
    ));
    let Step::Continue(resp) = step else {
        panic!("{step:?}")
    };
    let b = resp.bhs.0;
    assert_eq!(b[0], 0x23, "Login Response");
    assert_eq!(b[1], 0x81, "T, CSG security, NSG operational");
    assert_eq!(&b[8..14], &ISID, "ISID echoed");
    assert_ne!(&b[14..16], &[0, 0], "TSIH given");
    assert_eq!(resp.bhs.itt(), 0x77);
    assert_eq!(
        resp.bhs.u32_at(24),
        9,
        "StatSN starts at the initiator's ExpStatSN"
    );
    assert_eq!(
        (resp.bhs.u32_at(28), resp.bhs.u32_at(32)),
        (5, 5),
        "ExpCmdSN, MaxCmdSN"
    );
    assert_eq!((b[36], b[37]), (0, 0));
    let k = keys(&resp);
    assert_eq!(get(&k, "AuthMethod"), Some("None"));
    assert_eq!(get(&k, "TargetPortalGroupTag"), Some("3"));

    let step = t.handle(&request(
        true,
        false,
        OPERATIONAL,
        FULL_FEATURE,
        &[
            ("HeaderDigest", "CRC32C,None"),
            ("DataDigest", "None"),
            ("MaxRecvDataSegmentLength", "131072"),
            ("MaxBurstLength", "16776192"),
            ("FirstBurstLength", "262144"),
            ("InitialR2T", "No"),
            ("ImmediateData", "Yes"),
        ],
    ));
    let Step::Complete(resp, session) = step else {
        panic!("{step:?}")
    };
    assert_eq!(resp.bhs.0[1], 0x87, "T, CSG operational, NSG full feature");
    assert_eq!(resp.bhs.u32_at(24), 10, "StatSN counts responses");
    let k = keys(&resp);
    assert_eq!(get(&k, "HeaderDigest"), Some("CRC32C"));
    assert_eq!(get(&k, "MaxBurstLength"), Some("1048576"));
    assert_eq!(
        get(&k, "MaxRecvDataSegmentLength"),
        Some("262144"),
        "declared"
    );
    assert_eq!(session.kind, SessionType::Normal);
    assert_eq!(session.target.as_deref(), Some(TARGET));
    assert_eq!(session.isid, ISID);
    let p = session.params;
    assert!(p.header_digest && !p.data_digest);
    assert_eq!((p.max_recv_data, p.peer_max_recv_data), (262_144, 131_072));
    assert_eq!((p.max_burst, p.first_burst), (1 << 20, 65_536));
    assert!(!p.initial_r2t && p.immediate_data);
}

#[test]
fn a_discovery_login_may_start_in_the_operational_stage() {
    let mut t = target();
    let step = t.handle(&request(
        true,
        false,
        OPERATIONAL,
        FULL_FEATURE,
        &[
            ("InitiatorName", "iqn.2026-11.org.example:client"),
            ("SessionType", "Discovery"),
        ],
    ));
    let Step::Complete(resp, session) = step else {
        panic!("{step:?}")
    };
    assert_eq!(session.kind, SessionType::Discovery);
    assert_eq!(session.target, None);
    assert_eq!(get(&keys(&resp), "TargetPortalGroupTag"), None);
}

#[test]
fn text_continued_over_two_pdus_is_read_as_one() {
    let mut t = target();
    let whole = text::encode(&[
        ("InitiatorName", "iqn.2026-11.org.example:client"),
        ("TargetName", TARGET),
    ]);
    let (a, b) = whole.split_at(20);
    let mut first = request(false, true, OPERATIONAL, 0, &[]);
    first.data = Bytes::copy_from_slice(a);
    let step = t.handle(&first);
    let Step::Continue(resp) = step else {
        panic!("{step:?}")
    };
    assert!(
        resp.data.is_empty(),
        "no keys answered before the text is whole"
    );
    let mut second = request(true, false, OPERATIONAL, FULL_FEATURE, &[]);
    second.data = Bytes::copy_from_slice(b);
    let step = t.handle(&second);
    assert!(matches!(step, Step::Complete(..)), "{step:?}");
}

fn failure(step: Step) -> (Pdu, Status) {
    match step {
        Step::Fail(resp, status, _) => (resp, status),
        other => panic!("expected a failed login, got {other:?}"),
    }
}

#[test]
fn logins_that_cannot_proceed_are_answered_with_their_status() {
    let name = ("InitiatorName", "iqn.2026-11.org.example:client");
    let (resp, status) = failure(target().handle(&request(
        true,
        false,
        SECURITY,
        OPERATIONAL,
        &[name, ("TargetName", "iqn.2026-11.org.example:other")],
    )));
    assert_eq!(status, Status::NOT_FOUND);
    assert_eq!((resp.bhs.0[36], resp.bhs.0[37]), (2, 3));
    assert_eq!(resp.bhs.0[1] & 0x80, 0, "no transit on failure");

    let (_, status) = failure(target().handle(&request(
        true,
        false,
        SECURITY,
        OPERATIONAL,
        &[("TargetName", TARGET)],
    )));
    assert_eq!(status, Status::MISSING_PARAMETER);

    let (_, status) = failure(target().handle(&request(
        true,
        false,
        SECURITY,
        OPERATIONAL,
        &[name, ("TargetName", TARGET), ("AuthMethod", "CHAP")],
    )));
    assert_eq!(status, Status::AUTH_FAILED);

    let (_, status) =
        failure(target().handle(&request(true, false, OPERATIONAL, FULL_FEATURE, &[name])));
    assert_eq!(
        status,
        Status::MISSING_PARAMETER,
        "a normal session names its target"
    );

    let (_, status) =
        failure(target().handle(&request(true, true, SECURITY, OPERATIONAL, &[name])));
    assert_eq!(status, Status::INVALID_DURING_LOGIN, "T and C together");

    let mut nop = request(true, false, SECURITY, OPERATIONAL, &[name]);
    nop.bhs.0[0] = 0x40;
    let (_, status) = failure(target().handle(&nop));
    assert_eq!(status, Status::INVALID_DURING_LOGIN);

    let mut newer = request(true, false, SECURITY, OPERATIONAL, &[name]);
    newer.bhs.0[3] = 1;
    let (_, status) = failure(target().handle(&newer));
    assert_eq!(status, Status::UNSUPPORTED_VERSION);

    let mut bad_text = request(true, false, SECURITY, OPERATIONAL, &[]);
    bad_text.data = Bytes::from_static(b"no equals sign\0");
    let (_, status) = failure(target().handle(&bad_text));
    assert_eq!(status, Status::INVALID_DURING_LOGIN);
}
