//! The target's login against hostile and old initiators: text that never
//! ends, names that are not names, keys of RFC 3720 that RFC 7143
//! obsoleted.

use bytes::Bytes;

use std::cell::Cell;
use std::hash::{BuildHasher, RandomState};
use std::rc::Rc;

use crate::login::{Status, Step, FULL_FEATURE, OPERATIONAL, SECURITY};
use crate::login_tests::{request, target, TARGET};
use crate::pdu::{Bhs, Opcode, Pdu};
use crate::text;

/// At least `bytes` of distinct keys, 10 bytes each (`X-00002a=\0`).
fn distinct_keys(bytes: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes);
    let mut i = 0u32;
    while out.len() < bytes {
        out.extend_from_slice(format!("X-{i:06x}=\0").as_bytes());
        i += 1;
    }
    out
}

fn continued(data: &[u8], more: bool) -> Pdu {
    let mut bhs = Bhs::new(Opcode::LoginRequest);
    bhs.set_immediate(true);
    bhs.0[1] = (u8::from(more) << 6) | (SECURITY << 2);
    bhs.set_itt(0x77);
    Pdu::new(bhs, Bytes::copy_from_slice(data))
}

/// 256 KiB of distinct keys over continued Login PDUs is refused as soon
/// as the text passes 64 KiB, before it is parsed, and what the login
/// holds never passes that.
#[test]
fn login_text_past_64_kib_is_refused_as_it_arrives() {
    let mut t = target();
    let text = distinct_keys(256 * 1024);
    let mut sent = 0;
    for (i, chunk) in text.chunks(8192).enumerate() {
        let last = sent + chunk.len() == text.len();
        sent += chunk.len();
        match t.handle(&continued(chunk, !last)) {
            Step::Continue(_) if sent <= text::MAX_TEXT => {
                assert!(t.buffered() <= text::MAX_TEXT);
            }
            Step::Fail(resp, status, why) => {
                assert!(sent > text::MAX_TEXT, "refused at {sent} bytes: {why}");
                assert_eq!(status, Status::INITIATOR_ERROR);
                assert_eq!((resp.bhs.0[36], resp.bhs.0[37]), (2, 0));
                assert!(why.contains("65536"), "{why}");
                return;
            }
            step => panic!(
                "PDU {i}: {sent} bytes of login text in, answered {}",
                match step {
                    Step::Continue(_) => "Continue",
                    Step::Complete(..) => "Complete",
                    Step::Fail(..) => "Fail",
                }
            ),
        }
    }
    panic!("256 KiB of login text accepted");
}

/// Parsing hashes each key once: no scan of the keys before it per key.
#[test]
fn text_parsing_hashes_each_key_once() {
    let data = distinct_keys(64 * 1024);
    let keys = data.iter().filter(|&&b| b == 0).count();
    let hashed = Rc::new(Cell::new(0));
    let pairs = text::parse_with(&data, Counting(hashed.clone(), RandomState::new())).unwrap();
    assert_eq!(pairs.len(), keys);
    assert_eq!(hashed.get(), keys);
}

/// A hasher that counts the hashes taken.
struct Counting(Rc<Cell<usize>>, RandomState);

impl BuildHasher for Counting {
    type Hasher = <RandomState as BuildHasher>::Hasher;
    fn build_hasher(&self) -> Self::Hasher {
        self.0.set(self.0.get() + 1);
        self.1.build_hasher()
    }
}

/// A login as `initiator` to `target`, straight to full feature: its
/// status, and the reason the login gives when it fails.
fn login_as(initiator: &str, target_name: &str) -> (Status, String) {
    let mut t = target();
    let step = t.handle(&request(
        true,
        false,
        OPERATIONAL,
        FULL_FEATURE,
        &[
            ("InitiatorName", initiator),
            ("SessionType", "Normal"),
            ("TargetName", target_name),
        ],
    ));
    match step {
        Step::Complete(..) => (Status::SUCCESS, String::new()),
        Step::Fail(resp, status, why) => {
            assert_eq!((resp.bhs.0[36], resp.bhs.0[37]), (status.0, status.1));
            (status, why)
        }
        Step::Continue(_) => panic!("{initiator}: the login went on"),
    }
}

/// Names that are not iSCSI names are refused with 0x0207 (missing or
/// invalid parameter), the reason naming the key and what is wrong; the
/// three forms of RFC 3720 log in.
#[test]
fn malformed_names_are_refused_at_login() {
    for good in [
        "iqn.2026-11.org.example:host",
        "iqn.1991-05.com.microsoft:win-server.example.com",
        "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test",
        "iqn.1993-08.org.debian:01:5a4e3f2b1c0d",
        "IQN.2026-11.ORG.EXAMPLE:HOST",
        "eui.02004567A425678D",
        "naa.52004567BA64678D",
        "naa.62004567BA64678D0123456789ABCDEF",
    ] {
        assert_eq!(
            login_as(good, TARGET),
            (Status::SUCCESS, String::new()),
            "{good}"
        );
    }
    let long = format!("iqn.2026-11.org.example:{}", "h".repeat(200));
    for (bad, says) in [
        ("iqn.2026-11.org.example:a b", "' '"),
        ("iqn.2026-11.org.example:a\nb", "'\\n'"),
        ("iqn.2026-11.org.example:a_b", "'_'"),
        ("iqn.2026-11.org.example:a/b", "'/'"),
        ("iqn.2026-11.org.example:\u{e9}", "'\\u{e9}'"),
        (long.as_str(), "223"),
        ("host", "iqn., eui. or naa."),
        ("iqn.example.org:host", "yyyy-mm"),
        ("iqn.2026-13.org.example:host", "yyyy-mm"),
        ("iqn.2026-11:host", "naming authority"),
        ("iqn.2026-11.:host", "naming authority"),
        ("iqn.2026-11.org..example", "naming authority"),
        ("eui.02004567A425678", "16 hex digits"),
        ("eui.02004567A425678G", "16 hex digits"),
        ("naa.52004567BA64678D00", "16 or 32 hex digits"),
        ("", "empty"),
    ] {
        let (status, why) = login_as(bad, TARGET);
        assert_eq!(status, Status::MISSING_PARAMETER, "{bad:?}: {why}");
        assert!(why.starts_with("InitiatorName "), "{bad:?}: {why}");
        assert!(why.contains(says), "{bad:?}: {why:?} does not say {says:?}");
    }
    let (status, why) = login_as(
        "iqn.2026-11.org.example:host",
        "iqn.2026-11.org.example:v l",
    );
    assert_eq!(status, Status::MISSING_PARAMETER, "{why}");
    assert!(why.starts_with("TargetName "), "{why}");
    let (status, _) = login_as("iqn.2026-11.org.example:host", "iqn.2026-11.org.example:v2");
    assert_eq!(status, Status::NOT_FOUND, "a name, but not served here");
}

/// A target this side serves is found by its name even where the name is
/// one RFC 3722 would not make (an export called `my_vol`).
#[test]
fn a_served_target_is_found_whatever_its_name() {
    let mut cfg = crate::login_tests::config();
    cfg.targets = vec!["iqn.2026-11.org.example:my_vol".into()];
    let mut t = crate::login::TargetLogin::new(cfg);
    let step = t.handle(&request(
        true,
        false,
        OPERATIONAL,
        FULL_FEATURE,
        &[
            ("InitiatorName", "iqn.2026-11.org.example:host"),
            ("SessionType", "Normal"),
            ("TargetName", "iqn.2026-11.org.example:my_vol"),
        ],
    ));
    assert!(matches!(step, Step::Complete(..)), "{step:?}");
}

/// RFC 3720's marker keys, which RFC 7143 obsoleted, are answered Reject
/// (markers stay off), never NotUnderstood, which RFC 7143 forbids for
/// them; the login goes on.
#[test]
fn obsolete_marker_keys_are_rejected_not_misunderstood() {
    let mut t = target();
    let step = t.handle(&request(
        true,
        false,
        OPERATIONAL,
        FULL_FEATURE,
        &[
            ("InitiatorName", "iqn.2026-11.org.example:old"),
            ("SessionType", "Normal"),
            ("TargetName", TARGET),
            ("IFMarker", "No"),
            ("OFMarker", "Yes"),
            ("IFMarkInt", "2048~8192"),
            ("OFMarkInt", "2048~8192"),
        ],
    ));
    let Step::Complete(resp, _) = step else {
        panic!("{step:?}")
    };
    let answers = text::parse(&resp.data).unwrap();
    for key in ["IFMarker", "OFMarker", "IFMarkInt", "OFMarkInt"] {
        let answer = answers
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str());
        assert_eq!(answer, Some("Reject"), "{key} in {answers:?}");
    }
}
