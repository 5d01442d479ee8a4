//! The initiator's login: its first request byte by byte, whole logins
//! against braid's own target login (no authentication, CHAP, mutual
//! CHAP, wrong secrets), and target answers written out by hand.

use bytes::Bytes;

use super::login::{InitiatorLogin, Isid, Kind, LoggedIn, LoginConfig, LoginError, Step};
use crate::chap::{self, Credentials};
use crate::login::{self as target, Status, TargetConfig, TargetLogin};
use crate::negotiate::{self, Params};
use crate::pdu::{Bhs, Opcode, Pdu};
use crate::text;

const TARGET: &str = "iqn.2026-11.org.example:vol";
const INITIATOR: &str = "iqn.2026-11.org.example:client";

fn wanted() -> Params {
    Params {
        header_digest: true,
        data_digest: false,
        max_recv_data: 262_144,
        max_burst: 1 << 20,
        first_burst: 256 * 1024,
        initial_r2t: false,
        immediate_data: true,
        max_outstanding_r2t: 4,
        ..Params::default()
    }
}

fn config(chap: Option<Credentials>) -> LoginConfig {
    LoginConfig {
        initiator: INITIATOR.into(),
        kind: Kind::Normal {
            target: TARGET.into(),
        },
        isid: Isid::random(0x00ab_cdef, 2),
        tsih: 0,
        cid: 0,
        cmd_sn: 1,
        chap,
        chap_id: 0x42,
        chap_challenge: [0x5a; 16],
        params: wanted(),
    }
}

fn braid_target(chap: Option<Credentials>) -> TargetLogin {
    TargetLogin::new(TargetConfig {
        targets: vec![TARGET.into()],
        params: Params {
            max_recv_data: 65_536,
            max_burst: 512 * 1024,
            first_burst: 65_536,
            initial_r2t: false,
            max_outstanding_r2t: 1,
            ..Params::default()
        },
        digests: negotiate::Digests {
            none: true,
            crc32c: true,
        },
        portal_group_tag: 7,
        access: std::sync::Arc::new(crate::access::Access::open(chap)),
        chap_id: 9,
        chap_challenge: [0x33; 16],
    })
}

/// Runs a whole login between the two sides (at most 16 round trips).
fn run(mut i: InitiatorLogin, mut t: TargetLogin) -> Result<LoggedIn, LoginError> {
    let mut req = i.start();
    for _ in 0..16 {
        let resp = match t.handle(&req) {
            target::Step::Continue(r)
            | target::Step::Complete(r, _)
            | target::Step::Fail(r, ..) => r,
        };
        match i.handle(&resp)? {
            Step::Send(next) => req = next,
            Step::Done(done) => return Ok(*done),
            Step::Redirect { address, .. } => panic!("redirected to {address}"),
        }
    }
    panic!("the login did not end in 16 round trips")
}

fn creds(secret: &str, mutual: Option<(&str, &str)>) -> Credentials {
    Credentials {
        user: "client".into(),
        secret: secret.as_bytes().to_vec(),
        mutual: mutual.map(|(u, s)| (u.to_owned(), s.as_bytes().to_vec())),
    }
}

#[test]
fn the_first_request_by_the_byte() {
    let mut i = InitiatorLogin::new(config(None));
    let p = i.start();
    let b = p.bhs.0;
    assert_eq!(b[0], 0x43, "immediate Login Request");
    assert_eq!(b[1], 0x81, "T, security stage, next operational");
    assert_eq!((b[2], b[3]), (0, 0), "version 0");
    assert_eq!(
        &b[8..14],
        &[0x80 | 0x2b, 0xcd, 0xef, 0x00, 0x00, 0x02],
        "random ISID"
    );
    assert_eq!(&b[14..16], &[0, 0], "TSIH 0: a new session");
    assert_eq!(p.bhs.itt(), 0);
    assert_eq!(p.bhs.u32_at(24), 1, "CmdSN");
    assert_eq!(
        text::parse(&p.data).unwrap(),
        [
            ("InitiatorName".into(), INITIATOR.into()),
            ("SessionType".into(), "Normal".into()),
            ("TargetName".into(), TARGET.into()),
            ("AuthMethod".into(), "None".into())
        ]
    );
    assert_eq!(Isid([0x80, 1, 2, 3, 0, 9]).to_string(), "800102030009");
}

#[test]
fn a_login_without_authentication_settles_every_key() {
    let done = run(InitiatorLogin::new(config(None)), braid_target(None)).unwrap();
    let p = done.params;
    assert!(p.header_digest && !p.data_digest);
    assert_eq!(p.max_recv_data, 262_144, "ours, as declared");
    assert_eq!(p.peer_max_recv_data, 65_536, "the target's, as declared");
    assert_eq!(p.max_burst, 512 * 1024, "the smaller of the two");
    assert_eq!(p.first_burst, 65_536);
    assert!(!p.initial_r2t && p.immediate_data);
    assert_eq!(p.max_outstanding_r2t, 1);
    assert_eq!(done.portal_group_tag, Some(7));
    assert_eq!(done.tsih, 1);
    assert_eq!(done.cmd_sn, 1);
}

#[test]
fn chap_and_mutual_chap_log_in_with_the_right_secrets() {
    let t = creds("initiator-secret", None);
    run(
        InitiatorLogin::new(config(Some(t.clone()))),
        braid_target(Some(t)),
    )
    .unwrap();
    let both = creds("initiator-secret", Some(("target", "target-secret")));
    run(
        InitiatorLogin::new(config(Some(both.clone()))),
        braid_target(Some(both)),
    )
    .unwrap();
}

#[test]
fn wrong_secrets_fail_either_way() {
    let e = run(
        InitiatorLogin::new(config(Some(creds("wrong", None)))),
        braid_target(Some(creds("right", None))),
    )
    .unwrap_err();
    assert_eq!(e, LoginError::Refused(Status::AUTH_FAILED));
    assert!(
        e.to_string().contains("check the CHAP user and secret"),
        "{e}"
    );
    // The target knows another secret of its own: braid refuses it.
    let e = run(
        InitiatorLogin::new(config(Some(creds("s", Some(("target", "expected")))))),
        braid_target(Some(creds("s", Some(("target", "other"))))),
    )
    .unwrap_err();
    assert!(
        matches!(&e, LoginError::Auth(m) if m.contains("mutual CHAP")),
        "{e}"
    );
    // CHAP required, none given.
    let e = run(
        InitiatorLogin::new(config(None)),
        braid_target(Some(creds("s", None))),
    )
    .unwrap_err();
    assert!(matches!(e, LoginError::Refused(Status::AUTH_FAILED)), "{e}");
    // Mutual CHAP asked of a target that authenticates nobody.
    let e = run(
        InitiatorLogin::new(config(Some(creds("s", Some(("t", "u")))))),
        braid_target(None),
    )
    .unwrap_err();
    assert!(matches!(e, LoginError::Refused(Status::AUTH_FAILED)), "{e}");
}

/// A Login Response in `stage`, moving to `next` when `transit`, with
/// StatSN 10 and the given keys.
fn response(transit: bool, stage: u8, next: u8, keys: &[(&str, &str)]) -> Pdu {
    let mut b = Bhs::new(Opcode::LoginResponse);
    b.0[1] = (u8::from(transit) << 7) | (stage << 2) | if transit { next } else { 0 };
    b.0[14..16].copy_from_slice(&0x0102u16.to_be_bytes());
    b.set_u32(24, 10);
    b.set_u32(28, 1);
    b.set_u32(32, 64);
    Pdu::new(b, Bytes::from(text::encode(keys)))
}

fn sent(step: Step) -> Pdu {
    match step {
        Step::Send(p) => p,
        other => panic!("{other:?}"),
    }
}

#[test]
fn chap_steps_by_the_byte() {
    let mut i = InitiatorLogin::new(config(Some(creds("secret", Some(("tgt", "tsecret"))))));
    let first = i.start();
    assert_eq!(
        text::parse(&first.data).unwrap()[3].1,
        "CHAP",
        "mutual: CHAP only"
    );
    let a = sent(
        i.handle(&response(false, 0, 0, &[("AuthMethod", "CHAP")]))
            .unwrap(),
    );
    assert_eq!(a.bhs.0[1], 0x00, "no transit while CHAP runs");
    assert_eq!(a.bhs.u32_at(28), 11, "ExpStatSN follows the StatSN");
    assert_eq!(
        text::parse(&a.data).unwrap(),
        [("CHAP_A".into(), "5".into())]
    );
    let challenge = [1u8, 2, 3, 4];
    let r = sent(
        i.handle(&response(
            false,
            0,
            0,
            &[
                ("CHAP_A", "5"),
                ("CHAP_I", "7"),
                ("CHAP_C", &chap::to_hex(&challenge)),
            ],
        ))
        .unwrap(),
    );
    assert_eq!(r.bhs.0[1], 0x81, "asks to move on with its answer");
    let keys = text::parse(&r.data).unwrap();
    let want = chap::to_hex(&chap::response(7, b"secret", &challenge));
    assert_eq!(keys[0], ("CHAP_N".into(), "client".into()));
    assert_eq!(keys[1], ("CHAP_R".into(), want));
    assert_eq!(keys[2], ("CHAP_I".into(), "66".into()));
    assert_eq!(keys[3], ("CHAP_C".into(), chap::to_hex(&[0x5a; 16])));
    let proof = chap::to_hex(&chap::response(66, b"tsecret", &[0x5a; 16]));
    let op = sent(
        i.handle(&response(
            true,
            0,
            1,
            &[("CHAP_N", "tgt"), ("CHAP_R", &proof)],
        ))
        .unwrap(),
    );
    assert_eq!(op.bhs.0[1], 0x87, "T, operational, next full feature");
    let offer = text::parse(&op.data).unwrap();
    assert_eq!(offer[0], ("HeaderDigest".into(), "CRC32C,None".into()));
    assert_eq!(offer[1], ("DataDigest".into(), "None".into()));
    assert!(offer.contains(&("MaxRecvDataSegmentLength".into(), "262144".into())));
}

#[test]
fn answers_outside_the_result_functions_end_the_login() {
    let to_operational = |i: &mut InitiatorLogin| {
        i.start();
        sent(
            i.handle(&response(true, 0, 1, &[("AuthMethod", "None")]))
                .unwrap(),
        )
    };
    for (key, value) in [
        ("MaxBurstLength", "2097152"),
        ("ImmediateData", "Maybe"),
        ("InitialR2T", "Yes"),
        ("HeaderDigest", "MD5"),
        ("DefaultTime2Wait", "1"),
        ("MaxRecvDataSegmentLength", "12"),
    ] {
        let mut i = InitiatorLogin::new(config(None));
        to_operational(&mut i);
        // InitialR2T=Yes answers an offer of No: OR allows it.
        let r = i.handle(&response(true, 1, 3, &[(key, value)]));
        if key == "InitialR2T" {
            let Ok(Step::Done(d)) = r else {
                panic!("{r:?}")
            };
            assert!(d.params.initial_r2t);
            continue;
        }
        assert!(
            matches!(r, Err(LoginError::Protocol(_))),
            "{key}={value}: {r:?}"
        );
    }
}

#[test]
fn keys_the_target_offers_are_answered_and_text_may_continue() {
    let mut i = InitiatorLogin::new(config(None));
    i.start();
    i.handle(&response(true, 0, 1, &[("AuthMethod", "None")]))
        .unwrap();
    // The target answers in two PDUs (C bit), then offers a key of its own.
    let mut first = response(false, 1, 0, &[("HeaderDigest", "None")]);
    first.bhs.0[1] |= 0x40;
    let more = sent(i.handle(&first).unwrap());
    assert!(
        more.data.is_empty() && more.bhs.0[1] & 0x80 == 0,
        "an empty request for the rest"
    );
    let r = sent(
        i.handle(&response(
            false,
            1,
            0,
            &[("X-vendor.key", "1"), ("MaxBurstLength", "65536")],
        ))
        .unwrap(),
    );
    assert_eq!(
        text::parse(&r.data).unwrap(),
        [("X-vendor.key".into(), "NotUnderstood".into())]
    );
    assert_eq!(r.bhs.0[1], 0x87);
    let Step::Done(d) = i.handle(&response(true, 1, 3, &[])).unwrap() else {
        panic!()
    };
    assert!(!d.params.header_digest);
    assert_eq!(d.params.max_burst, 65_536);
    assert_eq!(d.params.first_burst, 65_536, "never above MaxBurstLength");
    assert_eq!(d.tsih, 0x0102);
}

#[test]
fn redirects_and_refusals_are_reported() {
    let mut i = InitiatorLogin::new(config(None));
    i.start();
    let mut r = response(false, 0, 0, &[("TargetAddress", "10.0.9.9:3260,1")]);
    r.bhs.0[36] = 1;
    r.bhs.0[37] = 2;
    assert_eq!(
        i.handle(&r).unwrap(),
        Step::Redirect {
            address: "10.0.9.9:3260,1".into(),
            permanent: true
        }
    );
    let mut r = response(false, 0, 0, &[]);
    r.bhs.0[36] = 2;
    r.bhs.0[37] = 3;
    let e = i.handle(&r).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the target refused the login: no such target (check the IQN) (status 0x02/0x03)"
    );
    let nop = Pdu::new(Bhs::new(Opcode::NopIn), Bytes::new());
    assert!(matches!(i.handle(&nop), Err(LoginError::Protocol(_))));
}
