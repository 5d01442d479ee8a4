//! Framing and negotiation against byte vectors written out by hand.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;

use crate::digest::{self, Digests};
use crate::negotiate::{self, Params};
use crate::pdu::{Bhs, FrameError, Framer, Opcode, Pdu, BHS_LEN};

fn login(data: &[u8]) -> Pdu {
    let mut bhs = Bhs::new(Opcode::LoginRequest);
    bhs.set_immediate(true);
    bhs.set_final(true);
    bhs.set_itt(0x0102_0304);
    Pdu::new(bhs, Bytes::copy_from_slice(data))
}

fn wire(pdu: &Pdu, digests: Digests) -> Vec<u8> {
    let mut out = Vec::new();
    pdu.encode(digests, &mut out);
    out
}

#[test]
fn a_login_request_on_the_wire() {
    let w = wire(&login(b"SessionType=Discovery\0"), Digests::default());
    // 22 bytes of text padded to 24.
    assert_eq!(w.len(), BHS_LEN + 24);
    assert_eq!(w[0], 0x43, "immediate bit and opcode 0x03");
    assert_eq!(w[1], 0x80, "final bit");
    assert_eq!(w[4], 0, "no AHS");
    assert_eq!(&w[5..8], &[0, 0, 22], "data segment length");
    assert_eq!(&w[16..20], &[1, 2, 3, 4], "initiator task tag");
    assert_eq!(&w[BHS_LEN..BHS_LEN + 22], b"SessionType=Discovery\0");
    assert_eq!(&w[BHS_LEN + 22..], &[0, 0], "padding");
}

#[test]
fn digests_follow_the_header_and_the_padded_data() {
    let both = Digests {
        header: true,
        data: true,
    };
    let w = wire(&login(b"abcde"), both);
    assert_eq!(w.len(), BHS_LEN + 4 + 8 + 4);
    assert_eq!(&w[BHS_LEN..BHS_LEN + 4], &digest::wire(&w[..BHS_LEN]));
    let data = &w[BHS_LEN + 4..BHS_LEN + 12];
    assert_eq!(data, b"abcde\0\0\0");
    assert_eq!(&w[BHS_LEN + 12..], &digest::wire(data));
    // No data, no data digest.
    assert_eq!(wire(&login(b""), both).len(), BHS_LEN + 4);
}

#[test]
fn the_framer_waits_for_whole_pdus_and_splits_back_to_back_ones() {
    let digests = Digests {
        header: true,
        data: true,
    };
    let mut framer = Framer::new(8192);
    framer.set(digests, 8192);
    let a = login(b"InitiatorName=iqn.2026-11.org.example:a\0");
    let mut b = login(b"");
    b.bhs = Bhs::new(Opcode::NopOut);
    b.ahs = Bytes::from_static(&[9, 9, 9, 9, 8, 8, 8, 8]);
    let mut stream = wire(&a, digests);
    stream.extend(wire(&b, digests));
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    for byte in stream {
        buf.extend_from_slice(&[byte]);
        while let Some(pdu) = framer.next(&mut buf).unwrap() {
            got.push(pdu);
        }
    }
    assert!(buf.is_empty());
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].data, a.data);
    assert_eq!(got[0].bhs.itt(), 0x0102_0304);
    assert_eq!(got[1].bhs.opcode(), Opcode::NopOut);
    assert_eq!(&got[1].ahs[..], &[9, 9, 9, 9, 8, 8, 8, 8]);
    assert!(got[1].data.is_empty());
}

#[test]
fn damaged_pdus_are_refused() {
    let digests = Digests {
        header: true,
        data: true,
    };
    let mut framer = Framer::new(8192);
    framer.set(digests, 8192);
    let good = wire(&login(b"TargetName=x\0"), digests);

    let mut header = good.clone();
    header[20] ^= 1;
    let r = framer.next(&mut BytesMut::from(&header[..]));
    assert_eq!(r, Err(FrameError::HeaderDigest));

    let mut data = good.clone();
    data[BHS_LEN + 4] ^= 0x80;
    let r = framer.next(&mut BytesMut::from(&data[..]));
    assert_eq!(
        r,
        Err(FrameError::DataDigest {
            opcode: Opcode::LoginRequest
        })
    );
}

#[test]
fn an_oversized_data_segment_is_refused_from_its_header_alone() {
    let framer = Framer::new(8192);
    let mut bhs = Bhs::new(Opcode::DataOut);
    bhs.set_data_len(8193);
    let r = framer.next(&mut BytesMut::from(&bhs.0[..]));
    assert_eq!(
        r,
        Err(FrameError::DataTooLong {
            opcode: Opcode::DataOut,
            len: 8193,
            max: 8192
        })
    );
}

#[test]
fn opcodes_round_trip_and_say_who_sends_them() {
    for b in 0..0x40u8 {
        assert_eq!(Opcode::from_byte(b).byte(), b);
    }
    assert!(Opcode::ScsiCommand.from_initiator());
    assert!(!Opcode::R2t.from_initiator());
    assert_eq!(
        Opcode::from_byte(0x43),
        Opcode::LoginRequest,
        "I bit ignored"
    );
}

fn pairs(text: &[(&str, &str)]) -> Vec<(String, String)> {
    text.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What open-iscsi offers in a normal session's operational stage (its
/// defaults), answered by a target with 1 MiB bursts and no digests wanted.
#[test]
fn an_open_iscsi_style_offer_is_answered_by_the_rules() {
    let offered = pairs(&[
        ("InitiatorName", "iqn.2026-11.org.example:client"),
        ("HeaderDigest", "CRC32C,None"),
        ("DataDigest", "None"),
        ("MaxRecvDataSegmentLength", "262144"),
        ("MaxBurstLength", "16776192"),
        ("FirstBurstLength", "262144"),
        ("InitialR2T", "No"),
        ("ImmediateData", "Yes"),
        ("MaxOutstandingR2T", "1"),
        ("DefaultTime2Wait", "2"),
        ("DefaultTime2Retain", "0"),
        ("ErrorRecoveryLevel", "0"),
        ("MaxConnections", "1"),
        ("X-com.example.Thing", "1"),
    ]);
    let ours = Params {
        max_recv_data: 65536,
        max_burst: 1 << 20,
        first_burst: 65536,
        initial_r2t: false,
        immediate_data: true,
        ..Params::default()
    };
    let ok = negotiate::Digests {
        none: true,
        crc32c: false,
    };
    let a = negotiate::respond(&offered, &ours, ok);
    assert_eq!(
        a.pairs,
        pairs(&[
            ("HeaderDigest", "None"),
            ("DataDigest", "None"),
            ("MaxBurstLength", "1048576"),
            ("FirstBurstLength", "65536"),
            ("InitialR2T", "No"),
            ("ImmediateData", "Yes"),
            ("MaxOutstandingR2T", "1"),
            ("DefaultTime2Wait", "2"),
            ("DefaultTime2Retain", "0"),
            ("ErrorRecoveryLevel", "0"),
            ("MaxConnections", "1"),
            ("X-com.example.Thing", "NotUnderstood"),
        ])
    );
    let p = a.params;
    assert_eq!((p.max_recv_data, p.peer_max_recv_data), (65536, 262144));
    assert_eq!((p.max_burst, p.first_burst), (1 << 20, 65536));
    assert!(!p.header_digest && !p.data_digest);
    assert!(!p.initial_r2t && p.immediate_data);
}

#[test]
fn or_and_min_max_and_digest_lists_combine_as_the_rfc_says() {
    let ours = Params {
        initial_r2t: true,
        immediate_data: false,
        default_time2wait: 5,
        default_time2retain: 10,
        ..Params::default()
    };
    let crc = negotiate::Digests {
        none: true,
        crc32c: true,
    };
    let a = negotiate::respond(
        &pairs(&[
            ("InitialR2T", "No"),
            ("ImmediateData", "Yes"),
            ("DefaultTime2Wait", "1"),
            ("DefaultTime2Retain", "60"),
            ("HeaderDigest", "CRC32C,None"),
        ]),
        &ours,
        crc,
    );
    assert_eq!(
        a.pairs,
        pairs(&[
            ("InitialR2T", "Yes"),
            ("ImmediateData", "No"),
            ("DefaultTime2Wait", "5"),
            ("DefaultTime2Retain", "10"),
            ("HeaderDigest", "CRC32C"),
        ])
    );
    assert!(a.params.header_digest);
}

#[test]
fn bad_values_are_rejected_and_keep_the_default() {
    let only_none = negotiate::Digests {
        none: true,
        crc32c: false,
    };
    let a = negotiate::respond(
        &pairs(&[
            ("MaxBurstLength", "100"),
            ("MaxConnections", "lots"),
            ("InitialR2T", "Maybe"),
            ("DataDigest", "CRC32C"),
            ("ErrorRecoveryLevel", "3"),
        ]),
        &Params::default(),
        only_none,
    );
    assert!(a.pairs.iter().all(|(_, v)| v == "Reject"), "{:?}", a.pairs);
    assert_eq!(a.params, Params::default());
}

#[test]
fn a_first_burst_never_exceeds_the_burst() {
    let ours = Params {
        max_burst: 8192,
        first_burst: 65536,
        ..Params::default()
    };
    let any = negotiate::Digests {
        none: true,
        crc32c: true,
    };
    let a = negotiate::respond(
        &pairs(&[("MaxBurstLength", "8192"), ("FirstBurstLength", "65536")]),
        &ours,
        any,
    );
    assert_eq!((a.params.max_burst, a.params.first_burst), (8192, 8192));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn whatever_encode_writes_the_framer_reads_back(
        data in proptest::collection::vec(any::<u8>(), 0..3000),
        words in 0usize..4,
        header in any::<bool>(),
        data_digest in any::<bool>(),
        opcode in 0u8..0x40,
    ) {
        let digests = Digests { header, data: data_digest };
        let mut bhs = Bhs::new(Opcode::from_byte(opcode));
        bhs.set_itt(7);
        let pdu = Pdu { bhs, ahs: Bytes::from(vec![5u8; words * 4]), data: Bytes::from(data) };
        let mut framer = Framer::new(4096);
        framer.set(digests, 4096);
        let mut buf = BytesMut::from(&wire(&pdu, digests)[..]);
        let back = framer.next(&mut buf).unwrap().expect("a whole PDU");
        prop_assert!(buf.is_empty());
        prop_assert_eq!(back.ahs, pdu.ahs);
        prop_assert_eq!(back.data, pdu.data);
        prop_assert_eq!(back.bhs.itt(), 7);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_framer(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        header in any::<bool>(),
        data_digest in any::<bool>(),
    ) {
        let mut framer = Framer::new(256);
        framer.set(Digests { header, data: data_digest }, 256);
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(_)) = framer.next(&mut buf) {}
    }
}
