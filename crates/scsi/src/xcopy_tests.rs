//! EXTENDED COPY parameter lists written out byte by byte, as ESXi and
//! libiscsi's conformance tests send them.

use super::*;
use crate::cdb::Command;

const NAA: [u8; 16] = [0x6b, 0x2a, 0x1d, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
const OTHER: [u8; 16] = [0x6b, 0x2a, 0x1d, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9];

fn header(targets: usize, segments: usize, inline: u32) -> Vec<u8> {
    let mut h = vec![0u8; 16];
    h[0] = 1; // list identifier
    h[1] = 0x18; // LIST ID USAGE 11b: no list identifier
    h[2..4].copy_from_slice(&(targets as u16).to_be_bytes());
    h[8..12].copy_from_slice(&(segments as u32).to_be_bytes());
    h[12..16].copy_from_slice(&inline.to_be_bytes());
    h
}

/// An identification target descriptor naming `naa`, 512-byte blocks.
fn target(naa: &[u8; 16]) -> Vec<u8> {
    let mut d = vec![0u8; 32];
    d[0] = 0xe4;
    d[4] = 0x01; // binary
    d[5] = 0x03; // logical unit, NAA
    d[7] = 16;
    d[8..24].copy_from_slice(naa);
    d[29..32].copy_from_slice(&[0, 2, 0]);
    d
}

fn segment(src: u16, dst: u16, blocks: u16, src_lba: u64, dst_lba: u64) -> Vec<u8> {
    let mut d = vec![0u8; 28];
    d[0] = 0x02;
    d[2..4].copy_from_slice(&0x18u16.to_be_bytes());
    d[4..6].copy_from_slice(&src.to_be_bytes());
    d[6..8].copy_from_slice(&dst.to_be_bytes());
    d[10..12].copy_from_slice(&blocks.to_be_bytes());
    d[12..20].copy_from_slice(&src_lba.to_be_bytes());
    d[20..28].copy_from_slice(&dst_lba.to_be_bytes());
    d
}

fn list(targets: &[Vec<u8>], segments: &[Vec<u8>]) -> Vec<u8> {
    let t: Vec<u8> = targets.concat();
    let s: Vec<u8> = segments.concat();
    let mut l = header(t.len(), s.len(), 0);
    l.extend(t);
    l.extend(s);
    l
}

/// Units `NAA` (1000 blocks, writable) and `OTHER` (100 blocks, read
/// only), by name.
fn find(naa: &[u8; 16]) -> Option<Found<&'static str>> {
    match *naa {
        NAA => Some(("a", 1000, true)),
        OTHER => Some(("b", 100, false)),
        _ => None,
    }
}

#[test]
fn the_cdbs_are_read() {
    let mut c = [0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&76u32.to_be_bytes());
    let cmd = Command::parse(&c).unwrap();
    assert_eq!(cmd, Command::ExtendedCopy { param_len: 76 });
    assert_eq!(cmd.data_out_len(512), Some(76));
    // LID4 (service action 1) is not offered.
    c[1] = 0x01;
    assert!(matches!(
        Command::parse(&c),
        Ok(Command::Unsupported { .. })
    ));
    let mut c = [0u8; 16];
    c[0] = 0x84;
    c[1] = 0x03;
    c[2] = 9;
    c[10..14].copy_from_slice(&1024u32.to_be_bytes());
    assert_eq!(
        Command::parse(&c),
        Ok(Command::ReceiveCopyResults {
            action: 3,
            list_id: 9,
            alloc: 1024
        })
    );
}

#[test]
fn one_segment_within_one_unit_becomes_one_copy() {
    let l = list(&[target(&NAA)], &[segment(0, 0, 2048 % 1000, 0, 500)]);
    let parsed = parse(&l).unwrap();
    assert_eq!(
        parsed.targets,
        vec![Some(Named {
            naa: NAA,
            block_size: 512
        })]
    );
    let copies = resolve(&parsed, 512, find).unwrap();
    assert_eq!(
        copies,
        vec![Copy {
            source: "a",
            source_lba: 0,
            destination: "a",
            destination_lba: 500,
            blocks: 48,
        }]
    );
}

#[test]
fn a_copy_between_two_units_names_each() {
    let l = list(
        &[target(&OTHER), target(&NAA)],
        &[segment(0, 1, 100, 0, 900), segment(1, 1, 1, 0, 1)],
    );
    let copies = resolve(&parse(&l).unwrap(), 512, find).unwrap();
    assert_eq!(copies.len(), 2);
    assert_eq!((copies[0].source, copies[0].destination), ("b", "a"));
    assert_eq!(copies[0].blocks, 100);
}

#[test]
fn an_empty_list_copies_nothing() {
    assert_eq!(parse(&[]), Ok(CopyList::default()));
}

#[test]
fn lists_cut_short_are_parameter_list_length_errors() {
    let l = list(&[target(&NAA)], &[segment(0, 0, 1, 0, 1)]);
    // Into the header, the target descriptor and the segment descriptor.
    for cut in [15, 16 + 31, l.len() - 1] {
        assert_eq!(
            parse(&l[..cut]),
            Err(Sense::PARAMETER_LIST_LENGTH),
            "cut at {cut}"
        );
    }
    // Lengths that add up past the most a list may carry.
    let mut huge = header(32, usize::MAX >> 40, 0);
    huge.resize(4096, 0);
    assert_eq!(parse(&huge), Err(Sense::PARAMETER_LIST_LENGTH));
    let mut over = header(32, MAX_LIST as usize, 0);
    over.resize(16 + 32 + MAX_LIST as usize, 0);
    assert_eq!(parse(&over), Err(Sense::PARAMETER_LIST_LENGTH));
}

#[test]
fn descriptor_counts_are_bounded() {
    let many: Vec<Vec<u8>> = (0..=MAX_TARGETS).map(|_| target(&NAA)).collect();
    let l = list(&many, &[segment(0, 0, 1, 0, 1)]);
    assert_eq!(parse(&l), Err(TOO_MANY_TARGETS));
    let many: Vec<Vec<u8>> = (0..=MAX_SEGMENTS).map(|_| segment(0, 0, 1, 0, 1)).collect();
    let l = list(&[target(&NAA)], &many);
    assert_eq!(parse(&l), Err(TOO_MANY_SEGMENTS));
    let max: Vec<Vec<u8>> = (0..MAX_SEGMENTS).map(|_| segment(0, 0, 1, 0, 1)).collect();
    let l = list(&[target(&NAA)], &max);
    assert_eq!(parse(&l).unwrap().segments.len(), usize::from(MAX_SEGMENTS));
}

#[test]
fn descriptor_types_not_offered_are_named() {
    let mut fc = target(&NAA);
    fc[0] = 0xe0; // Fibre Channel N_Port_Name
    let l = list(&[fc], &[segment(0, 0, 1, 0, 1)]);
    assert_eq!(parse(&l), Err(UNSUPPORTED_TARGET_TYPE));
    let mut stream = segment(0, 0, 1, 0, 1);
    stream[0] = 0x03; // stream to stream
    stream.truncate(20);
    stream[2..4].copy_from_slice(&0x10u16.to_be_bytes());
    let l = list(&[target(&NAA)], &[stream]);
    assert_eq!(parse(&l), Err(UNSUPPORTED_SEGMENT_TYPE));
    let mut tape = target(&NAA);
    tape[1] = 0x01; // a sequential-access device
    assert_eq!(
        parse(&list(&[tape], &[segment(0, 0, 1, 0, 1)])),
        Err(UNSUPPORTED_TARGET_TYPE)
    );
}

#[test]
fn fields_that_cannot_be_taken_are_invalid_in_the_parameter_list() {
    let mut l = list(&[target(&NAA)], &[segment(0, 0, 1, 0, 1)]);
    l[1] = 0x08; // LIST ID USAGE 01b, reserved
    assert_eq!(parse(&l), Err(INVALID_FIELD_IN_PARAMETERS));
    let mut l = list(&[target(&NAA)], &[segment(0, 0, 1, 0, 1)]);
    l[12..16].copy_from_slice(&4u32.to_be_bytes());
    l.extend_from_slice(&[0; 4]);
    assert_eq!(parse(&l), Err(INVALID_FIELD_IN_PARAMETERS));
    // A block-to-block segment of the wrong length.
    let mut long = segment(0, 0, 1, 0, 1);
    long.extend_from_slice(&[0; 4]);
    long[2..4].copy_from_slice(&0x1cu16.to_be_bytes());
    let l = list(&[target(&NAA)], &[long]);
    assert_eq!(parse(&l), Err(INVALID_FIELD_IN_PARAMETERS));
}

#[test]
fn obsolete_bits_of_a_target_descriptor_are_not_read() {
    let mut t = target(&NAA);
    t[1] = 0xc0 | 0x20; // LU ID TYPE 11b, NUL
    let l = list(&[t], &[segment(0, 0, 1, 0, 1)]);
    assert_eq!(resolve(&parse(&l).unwrap(), 512, find).unwrap().len(), 1);
}

#[test]
fn what_cannot_be_reached_or_lies_outside_aborts_the_copy() {
    let unknown = [7u8; 16];
    let cases = [
        // Destination index past the list.
        (
            list(&[target(&NAA)], &[segment(0, 1, 1, 0, 1)]),
            UNREACHABLE,
        ),
        // A unit this target does not serve.
        (
            list(&[target(&unknown)], &[segment(0, 0, 1, 0, 1)]),
            UNREACHABLE,
        ),
        // Past the end of the destination, and of the source.
        (
            list(&[target(&NAA)], &[segment(0, 0, 2, 0, 999)]),
            OUT_OF_RANGE,
        ),
        (
            list(&[target(&NAA)], &[segment(0, 0, 2, 999, 0)]),
            OUT_OF_RANGE,
        ),
        (
            list(&[target(&NAA)], &[segment(0, 0, 2, u64::MAX, 0)]),
            OUT_OF_RANGE,
        ),
        // A read-only destination.
        (
            list(&[target(&NAA), target(&OTHER)], &[segment(0, 1, 1, 0, 0)]),
            Sense::WRITE_PROTECTED,
        ),
    ];
    for (i, (l, want)) in cases.into_iter().enumerate() {
        assert_eq!(
            resolve(&parse(&l).unwrap(), 512, find),
            Err(want),
            "case {i}"
        );
    }
    // Another designator type names no unit here.
    let mut t10 = target(&NAA);
    t10[5] = 0x01;
    let l = list(&[t10], &[segment(0, 0, 1, 0, 1)]);
    assert_eq!(resolve(&parse(&l).unwrap(), 512, find), Err(UNREACHABLE));
    // Nor does one named with another block size.
    let mut big = target(&NAA);
    big[29..32].copy_from_slice(&[0, 0x10, 0]);
    let l = list(&[big], &[segment(0, 0, 1, 0, 1)]);
    assert_eq!(resolve(&parse(&l).unwrap(), 512, find), Err(UNREACHABLE));
    assert_eq!(UNREACHABLE.fixed()[2], 0x0a);
}

#[test]
fn operating_parameters_state_the_limits() {
    let d = receive_copy_results(OPERATING_PARAMETERS, 1024, || None).unwrap();
    assert_eq!(d.len(), 46);
    assert_eq!(u32::from_be_bytes([d[0], d[1], d[2], d[3]]), 42);
    assert_eq!(u16::from_be_bytes([d[8], d[9]]), MAX_TARGETS);
    assert_eq!(u16::from_be_bytes([d[10], d[11]]), MAX_SEGMENTS);
    assert_eq!(u32::from_be_bytes([d[12], d[13], d[14], d[15]]), MAX_LIST);
    assert_eq!(
        u32::from_be_bytes([d[16], d[17], d[18], d[19]]),
        MAX_SEGMENT_BYTES
    );
    assert_eq!(&d[43..], &[2, 0x02, 0xe4]);
    assert_eq!(
        receive_copy_results(OPERATING_PARAMETERS, 8, || None)
            .unwrap()
            .len(),
        8
    );
    // FAILED SEGMENT DETAILS and the others are not offered.
    assert_eq!(
        receive_copy_results(0x04, 1024, || None),
        Err(Sense::INVALID_FIELD_IN_CDB.in_cdb_field(1, 4))
    );
}

#[test]
fn the_third_party_copy_page_lists_the_commands() {
    let d = third_party_copy_page();
    assert_eq!(&d[..4], &[0, 1, 0, 12]);
    assert_eq!(
        &d[4..16],
        &[10, 0x83, 3, 0x00, 0x10, 0x11, 0x84, 3, 0x00, 0x03, 0x07, 0]
    );
    // Then token copy's: ROD token limits, ROD token features, ROD types,
    // each a whole number of four-byte words as SPC-4 asks.
    let mut at = 16;
    let mut kinds = Vec::new();
    while at < d.len() {
        let len = usize::from(u16::from_be_bytes([d[at + 2], d[at + 3]]));
        assert_eq!(len % 4, 0, "descriptor {:04x}", kinds.len());
        kinds.push(u16::from_be_bytes([d[at], d[at + 1]]));
        at += 4 + len;
    }
    assert_eq!(at, d.len());
    assert_eq!(kinds, [0x0000, 0x0106, 0x0108]);
}

#[test]
fn copy_status_answers_for_the_nexus_and_list_that_copied() {
    let l = list(&[target(&NAA)], &[segment(0, 0, 1, 0, 1)]);
    assert_eq!(parse(&l).unwrap().list_id, None, "LIST ID USAGE 11b");
    let mut held = l.clone();
    held[1] = 0x00;
    held[0] = 7;
    assert_eq!(parse(&held).unwrap().list_id, Some(7));

    let results = Results::default();
    let a = crate::NexusName::new("iqn.a", [0, 0, 0, 0, 0, 1], 1);
    let b = crate::NexusName::new("iqn.b", [0, 0, 0, 0, 0, 1], 1);
    let ask = |n: &crate::NexusName, id: u8| {
        receive_copy_results(COPY_STATUS, 1024, || results.get(n, id.into()))
    };
    assert_eq!(
        ask(&a, 7),
        Err(Sense::INVALID_FIELD_IN_CDB.in_cdb_field(2, 7))
    );
    let status = Status {
        ok: true,
        segments: 1,
        bytes: 1 << 20,
    };
    results.put(&a, 7, status);
    let d = ask(&a, 7).unwrap();
    assert_eq!(d, [0, 0, 0, 8, 0x01, 0, 1, 0, 0, 0x10, 0, 0]);
    assert!(ask(&b, 7).is_err(), "another nexus's copy");
    assert!(ask(&a, 8).is_err(), "another list");
    // Past 4 GiB the count is in kibibytes (units 01h; F1h would say
    // logical blocks, SPC-4 table 'transfer count units'); a failed copy
    // says so.
    results.put(
        &a,
        7,
        Status {
            ok: false,
            segments: 3,
            bytes: 8 << 30,
        },
    );
    let d = ask(&a, 7).unwrap();
    assert_eq!(&d[4..], &[0x02, 0, 3, 0x01, 0, 0x80, 0, 0]);
    // The oldest results go first.
    for id in 0..=255u8 {
        results.put(&b, id.into(), status);
    }
    assert!(results.get(&a, 7).is_none());
    assert!(results.get(&b, 0).is_some());
}
