//! The target's login against an access list: each initiator's own CHAP
//! credentials, the targets it may see, discovery's own credential and
//! initiators not listed, with the CHAP responses written out byte by
//! byte (MD5 of identifier 42, the secret and sixteen 0x07 bytes).

use std::sync::Arc;

use crate::access::{Access, Entry, Grant};
use crate::chap::Credentials;
use crate::login::{Status, Step, TargetConfig, TargetLogin, OPERATIONAL, SECURITY};
use crate::login_tests::{config, request, TARGET};
use crate::text;

const A: &str = "iqn.2026-11.org.example:host-a";
const B: &str = "iqn.2026-11.org.example:host-b";
const OTHER_TARGET: &str = "iqn.2026-11.org.example:other";

/// MD5(0x2a || "host-a-secret" || 0x07 * 16).
const A_RESPONSE: &str = "0x55be0bd62fbe161fd77a04b244f0f6fc";
/// MD5(0x2a || "host-b-secret" || 0x07 * 16).
const B_RESPONSE: &str = "0x1bf6063a3ad164b7b5d540425c08ecb3";
/// MD5(0x2a || "discovery-secret" || 0x07 * 16).
const DISCOVERY_RESPONSE: &str = "0x812f886a198f3c9442f83147def48815";

fn creds(user: &str, secret: &[u8]) -> Option<Credentials> {
    Some(Credentials {
        user: user.into(),
        secret: secret.to_vec(),
        mutual: None,
    })
}

/// A sees only TARGET, B everything; others are refused; discovery has
/// its own secret.
fn access() -> Access {
    Access {
        initiators: vec![
            Entry {
                initiator: A.into(),
                grant: Grant {
                    chap: creds("a", b"host-a-secret"),
                    targets: Some(vec![TARGET.into()]),
                },
            },
            Entry {
                initiator: B.into(),
                grant: Grant {
                    chap: creds("b", b"host-b-secret"),
                    targets: None,
                },
            },
        ],
        others: None,
        discovery: creds("disc", b"discovery-secret"),
    }
}

fn target(access: Access) -> TargetLogin {
    TargetLogin::new(TargetConfig {
        targets: vec![TARGET.into(), OTHER_TARGET.into()],
        access: Arc::new(access),
        chap_id: 42,
        chap_challenge: [7; 16],
        ..config()
    })
}

fn keys(step: &Step) -> Vec<(String, String)> {
    match step {
        Step::Continue(p) | Step::Complete(p, _) => text::parse(&p.data).unwrap(),
        Step::Fail(_, st, why) => panic!("refused {st:?}: {why}"),
    }
}

fn refused(step: Step) -> (Status, String) {
    match step {
        Step::Fail(pdu, status, why) => {
            assert_eq!((pdu.bhs.0[36], pdu.bhs.0[37]), (status.0, status.1));
            (status, why)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The first request and CHAP_A; checks the challenge is the configured
/// one, byte for byte.
fn challenged(t: &mut TargetLogin, first: &[(&str, &str)]) {
    let mut pairs = first.to_vec();
    pairs.push(("AuthMethod", "CHAP"));
    let k = keys(&t.handle(&request(false, false, SECURITY, 0, &pairs)));
    assert!(k.contains(&("AuthMethod".into(), "CHAP".into())), "{k:?}");
    let k = keys(&t.handle(&request(false, false, SECURITY, 0, &[("CHAP_A", "5")])));
    assert!(k.contains(&("CHAP_I".into(), "42".into())), "{k:?}");
    let want = format!("0x{}", "07".repeat(16));
    assert!(k.contains(&("CHAP_C".into(), want)), "{k:?}");
}

fn answer(t: &mut TargetLogin, user: &str, response: &str) -> Step {
    t.handle(&request(
        true,
        false,
        SECURITY,
        OPERATIONAL,
        &[("CHAP_N", user), ("CHAP_R", response)],
    ))
}

#[test]
fn each_initiator_logs_in_with_its_own_secret_only() {
    let mut t = target(access());
    challenged(&mut t, &[("InitiatorName", A), ("TargetName", TARGET)]);
    let step = answer(&mut t, "a", A_RESPONSE);
    assert!(
        matches!(step, Step::Continue(ref p) if p.bhs.0[1] & 0x80 != 0),
        "{step:?}"
    );

    // B's user and secret are right for B, not for a login claiming A:
    // such a login could otherwise reinstate A's session.
    let mut t = target(access());
    challenged(&mut t, &[("InitiatorName", A), ("TargetName", TARGET)]);
    let (status, why) = refused(answer(&mut t, "b", B_RESPONSE));
    assert_eq!(
        (status, why.as_str()),
        (Status::AUTH_FAILED, "CHAP: wrong name or secret")
    );

    // A's user with B's secret, and A's response under B's name.
    let mut t = target(access());
    challenged(&mut t, &[("InitiatorName", A), ("TargetName", TARGET)]);
    assert_eq!(
        refused(answer(&mut t, "a", B_RESPONSE)).0,
        Status::AUTH_FAILED
    );
    let mut t = target(access());
    challenged(&mut t, &[("InitiatorName", B), ("TargetName", TARGET)]);
    assert_eq!(
        refused(answer(&mut t, "b", A_RESPONSE)).0,
        Status::AUTH_FAILED
    );
}

#[test]
fn the_initiator_name_cannot_change_once_given() {
    // Authenticated as B, then claiming A in the operational stage.
    let mut t = target(access());
    challenged(&mut t, &[("InitiatorName", B), ("TargetName", TARGET)]);
    let _ = keys(&answer(&mut t, "b", B_RESPONSE));
    let step = t.handle(&request(
        true,
        false,
        OPERATIONAL,
        3,
        &[("InitiatorName", A)],
    ));
    let (status, why) = refused(step);
    assert_eq!(status, Status::INITIATOR_ERROR);
    assert!(why.contains("InitiatorName changed"), "{why}");
}

#[test]
fn unlisted_initiators_are_refused_and_unseen_targets_not_found() {
    let step = target(access()).handle(&request(
        false,
        false,
        SECURITY,
        0,
        &[
            ("InitiatorName", "iqn.2026-11.org.example:stranger"),
            ("TargetName", TARGET),
            ("AuthMethod", "CHAP,None"),
        ],
    ));
    let (status, why) = refused(step);
    assert_eq!(status, Status::NOT_AUTHORIZED);
    assert_eq!((status.0, status.1), (2, 2));
    assert!(why.contains("not in this target's access list"), "{why}");

    // A may not see OTHER_TARGET: refused as if it were not there.
    let step = target(access()).handle(&request(
        false,
        false,
        SECURITY,
        0,
        &[("InitiatorName", A), ("TargetName", OTHER_TARGET)],
    ));
    assert_eq!(refused(step).0, Status::NOT_FOUND);

    // Skipping the security stage does not skip the list.
    let step = target(access()).handle(&request(
        true,
        false,
        OPERATIONAL,
        3,
        &[("InitiatorName", A), ("TargetName", TARGET)],
    ));
    assert_eq!(refused(step).0, Status::AUTH_FAILED);

    // With a grant for others, an unlisted initiator gets it.
    let mut open = access();
    open.others = Some(Grant {
        chap: None,
        targets: Some(vec![OTHER_TARGET.into()]),
    });
    let mut t = target(open.clone());
    let k = keys(&t.handle(&request(
        false,
        false,
        SECURITY,
        0,
        &[
            ("InitiatorName", "iqn.2026-11.org.example:stranger"),
            ("TargetName", OTHER_TARGET),
            ("AuthMethod", "CHAP,None"),
        ],
    )));
    assert!(k.contains(&("AuthMethod".into(), "None".into())), "{k:?}");
    let step = target(open).handle(&request(
        false,
        false,
        SECURITY,
        0,
        &[
            ("InitiatorName", "iqn.2026-11.org.example:stranger"),
            ("TargetName", TARGET),
        ],
    ));
    assert_eq!(refused(step).0, Status::NOT_FOUND);
}

#[test]
fn discovery_proves_its_own_credential_not_the_sessions() {
    let first = [("InitiatorName", A), ("SessionType", "Discovery")];
    let mut t = target(access());
    challenged(&mut t, &first);
    let _ = keys(&answer(&mut t, "disc", DISCOVERY_RESPONSE));

    let mut t = target(access());
    challenged(&mut t, &first);
    assert_eq!(
        refused(answer(&mut t, "a", A_RESPONSE)).0,
        Status::AUTH_FAILED
    );

    // A session's type is the first request's: a normal login's
    // credentials do not become a discovery session's.
    let mut t = target(access());
    challenged(&mut t, &[("InitiatorName", A), ("TargetName", TARGET)]);
    let step = t.handle(&request(
        false,
        false,
        SECURITY,
        0,
        &[("SessionType", "Discovery")],
    ));
    assert_eq!(refused(step).0, Status::INITIATOR_ERROR);

    // Without a discovery credential, discovery needs none, but an
    // unlisted initiator is still refused.
    let mut none = access();
    none.discovery = None;
    let k = keys(&target(none.clone()).handle(&request(
        false,
        false,
        SECURITY,
        0,
        &[first[0], first[1], ("AuthMethod", "CHAP,None")],
    )));
    assert!(k.contains(&("AuthMethod".into(), "None".into())), "{k:?}");
    let step = target(none).handle(&request(
        false,
        false,
        SECURITY,
        0,
        &[
            ("InitiatorName", "iqn.2026-11.org.example:stranger"),
            ("SessionType", "Discovery"),
        ],
    ));
    assert_eq!(refused(step).0, Status::NOT_AUTHORIZED);
}
