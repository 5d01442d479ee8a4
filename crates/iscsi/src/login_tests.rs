//! The target's login against requests built byte by byte, as an
//! initiator sends them.

use bytes::Bytes;

use crate::login::{
    SessionType, Status, Step, TargetConfig, TargetLogin, FULL_FEATURE, OPERATIONAL, SECURITY,
};
use crate::negotiate::{self, Params};
use crate::pdu::{Bhs, Opcode, Pdu};
use crate::text;

pub(crate) const TARGET: &str = "iqn.2026-11.org.example:vol";
const ISID: [u8; 6] = [0x80, 0x12, 0x34, 0x56, 0x00, 0x01];

pub(crate) fn target() -> TargetLogin {
    TargetLogin::new(config())
}

pub(crate) fn config() -> TargetConfig {
    TargetConfig {
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
        access: std::sync::Arc::default(),
        chap_id: 0,
        chap_challenge: [0; 16],
    }
}

/// A Login Request: T/C bits, stages, ISID, ITT 0x77, CmdSN 5,
/// ExpStatSN 9, and the text pairs.
pub(crate) fn request(transit: bool, more: bool, csg: u8, nsg: u8, pairs: &[(&str, &str)]) -> Pdu {
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

mod chap_login {
    use super::*;
    use crate::chap::{self, Credentials};

    const CHALLENGE: [u8; 16] = [7; 16];

    fn target(mutual: bool) -> TargetLogin {
        let mut cfg = TargetConfig {
            targets: vec![TARGET.into()],
            params: Params::default(),
            digests: negotiate::Digests {
                none: true,
                crc32c: true,
            },
            portal_group_tag: 1,
            access: std::sync::Arc::new(crate::access::Access::open(Some(Credentials {
                user: "alice".into(),
                secret: b"initiator-secret".to_vec(),
                mutual: mutual.then(|| ("braid".to_owned(), b"target-secret!".to_vec())),
            }))),
            chap_id: 42,
            chap_challenge: CHALLENGE,
        };
        cfg.params.max_recv_data = 8192;
        TargetLogin::new(cfg)
    }

    fn name() -> (&'static str, &'static str) {
        ("InitiatorName", "iqn.2026-11.org.example:client")
    }

    /// AuthMethod, then CHAP_A: returns the target's CHAP_I and CHAP_C.
    fn challenged(t: &mut TargetLogin) -> (u8, Vec<u8>) {
        let step = t.handle(&request(
            false,
            false,
            SECURITY,
            0,
            &[name(), ("TargetName", TARGET), ("AuthMethod", "CHAP,None")],
        ));
        let Step::Continue(resp) = step else {
            panic!("{step:?}")
        };
        assert_eq!(get(&keys(&resp), "AuthMethod"), Some("CHAP"));
        let step = t.handle(&request(false, false, SECURITY, 0, &[("CHAP_A", "5")]));
        let Step::Continue(resp) = step else {
            panic!("{step:?}")
        };
        let k = keys(&resp);
        assert_eq!(get(&k, "CHAP_A"), Some("5"));
        let id: u8 = get(&k, "CHAP_I").unwrap().parse().unwrap();
        let c = chap::from_hex(get(&k, "CHAP_C").unwrap()).unwrap();
        (id, c)
    }

    /// The initiator's correct CHAP_R to this target's challenge.
    fn right_answer(t: &mut TargetLogin) -> String {
        let (id, c) = challenged(t);
        chap::to_hex(&chap::response(id, b"initiator-secret", &c))
    }

    #[test]
    fn mutual_chap_proves_both_sides() {
        let mut t = target(true);
        let (id, c) = challenged(&mut t);
        assert_eq!((id, c.as_slice()), (42, &CHALLENGE[..]));
        let r = chap::to_hex(&chap::response(id, b"initiator-secret", &c));
        let mine = [9u8; 16];
        let step = t.handle(&request(
            true,
            false,
            SECURITY,
            OPERATIONAL,
            &[
                ("CHAP_N", "alice"),
                ("CHAP_R", &r),
                ("CHAP_I", "5"),
                ("CHAP_C", &chap::to_hex(&mine)),
            ],
        ));
        let Step::Continue(resp) = step else {
            panic!("{step:?}")
        };
        let k = keys(&resp);
        assert_eq!(get(&k, "CHAP_N"), Some("braid"));
        let proof = chap::to_hex(&chap::response(5, b"target-secret!", &mine));
        assert_eq!(get(&k, "CHAP_R"), Some(proof.as_str()));
        let step = t.handle(&request(true, false, OPERATIONAL, FULL_FEATURE, &[]));
        assert!(matches!(step, Step::Complete(..)), "{step:?}");
    }

    fn refused(step: Step) -> Status {
        match step {
            Step::Fail(_, status, _) => status,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_wrong_secret_a_skipped_stage_and_a_reflected_challenge_are_refused() {
        let mut t = target(false);
        let (id, c) = challenged(&mut t);
        let wrong = chap::to_hex(&chap::response(id, b"guess", &c));
        let step = t.handle(&request(
            true,
            false,
            SECURITY,
            OPERATIONAL,
            &[("CHAP_N", "alice"), ("CHAP_R", &wrong)],
        ));
        assert_eq!(refused(step), Status::AUTH_FAILED);

        let mut t = target(false);
        let right = right_answer(&mut t);
        let step = t.handle(&request(
            true,
            false,
            SECURITY,
            OPERATIONAL,
            &[("CHAP_N", "mallory"), ("CHAP_R", &right)],
        ));
        assert_eq!(
            refused(step),
            Status::AUTH_FAILED,
            "right secret, wrong name"
        );

        let step = target(false).handle(&request(
            true,
            false,
            OPERATIONAL,
            FULL_FEATURE,
            &[name(), ("TargetName", TARGET)],
        ));
        assert_eq!(
            refused(step),
            Status::AUTH_FAILED,
            "no skipping the security stage"
        );

        let step = target(false).handle(&request(
            true,
            false,
            SECURITY,
            OPERATIONAL,
            &[name(), ("TargetName", TARGET), ("AuthMethod", "None")],
        ));
        assert_eq!(
            refused(step),
            Status::AUTH_FAILED,
            "AuthMethod None refused"
        );

        let mut t = target(true);
        let right = right_answer(&mut t);
        let step = t.handle(&request(
            true,
            false,
            SECURITY,
            OPERATIONAL,
            &[
                ("CHAP_N", "alice"),
                ("CHAP_R", &right),
                ("CHAP_I", "1"),
                ("CHAP_C", &chap::to_hex(&CHALLENGE)),
            ],
        ));
        assert_eq!(
            refused(step),
            Status::AUTH_FAILED,
            "our challenge reflected"
        );

        let mut t = target(false);
        let right = right_answer(&mut t);
        let step = t.handle(&request(
            true,
            false,
            SECURITY,
            OPERATIONAL,
            &[
                ("CHAP_N", "alice"),
                ("CHAP_R", &right),
                ("CHAP_I", "1"),
                ("CHAP_C", "0x0102"),
            ],
        ));
        assert_eq!(
            refused(step),
            Status::AUTH_FAILED,
            "mutual asked, no target secret"
        );
    }
}
