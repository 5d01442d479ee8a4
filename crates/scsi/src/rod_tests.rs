use super::*;
use crate::NexusName;

const NAA: [u8; 16] = [0x6b, 0x2a, 0x1d, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

fn creator() -> Creator {
    Creator {
        naa: NAA,
        block_size: 512,
    }
}

fn range(lba: u64, blocks: u32) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[0..8].copy_from_slice(&lba.to_be_bytes());
    d[8..12].copy_from_slice(&blocks.to_be_bytes());
    d
}

/// A POPULATE TOKEN parameter list as an initiator sends it.
fn populate(flags: u8, timeout: u32, rod_type: u32, ranges: &[[u8; 16]]) -> Vec<u8> {
    let mut p = vec![0u8; 16];
    let len = 16 + 16 * ranges.len();
    p[0..2].copy_from_slice(&((len - 2) as u16).to_be_bytes());
    p[2] = flags;
    p[4..8].copy_from_slice(&timeout.to_be_bytes());
    p[8..12].copy_from_slice(&rod_type.to_be_bytes());
    p[14..16].copy_from_slice(&((16 * ranges.len()) as u16).to_be_bytes());
    for r in ranges {
        p.extend_from_slice(r);
    }
    p
}

/// A WRITE USING TOKEN parameter list.
fn write_using(offset: u64, token: &[u8; TOKEN_LEN], ranges: &[[u8; 16]]) -> Vec<u8> {
    let mut p = vec![0u8; 536];
    let len = 536 + 16 * ranges.len();
    p[0..2].copy_from_slice(&((len - 2) as u16).to_be_bytes());
    p[8..16].copy_from_slice(&offset.to_be_bytes());
    p[16..528].copy_from_slice(token);
    p[534..536].copy_from_slice(&((16 * ranges.len()) as u16).to_be_bytes());
    for r in ranges {
        p.extend_from_slice(r);
    }
    p
}

fn r(lba: u64, blocks: u32) -> Range {
    Range { lba, blocks }
}

#[test]
fn a_populate_token_list_is_read_with_its_ranges_and_timeout() {
    let p = populate(0, 0, 0, &[range(0, 8), range(100, 4), range(50, 0)]);
    let got = parse_populate(&p, 1000).unwrap();
    assert_eq!(
        got.ranges,
        [r(0, 8), r(100, 4)],
        "a range of 0 blocks is passed over"
    );
    assert_eq!(
        got.timeout,
        Duration::from_secs(60),
        "0 asks for the default"
    );
    let p = populate(0x02, 5, ROD_TYPE_AUR, &[range(10, 1)]);
    assert_eq!(
        parse_populate(&p, 1000).unwrap().timeout,
        Duration::from_secs(5)
    );
}

#[test]
fn a_populate_token_list_is_refused_as_spc_says() {
    let bad = |p: Vec<u8>, capacity: u64| parse_populate(&p, capacity).unwrap_err();
    assert_eq!(
        bad(populate(0, 0, 0, &[range(996, 8)]), 1000),
        Sense::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        bad(populate(0, 0, 0, &[range(u64::MAX, 8)]), 1000),
        Sense::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        bad(populate(0, 0, 0, &[range(0, 8), range(7, 2)]), 1000),
        INVALID_FIELD_IN_PARAMETERS,
        "overlapping ranges"
    );
    assert_eq!(
        bad(populate(0, 601, 0, &[range(0, 8)]), 1000),
        INVALID_FIELD_IN_PARAMETERS
    );
    assert_eq!(
        bad(populate(0x02, 0, 0x0080_0001, &[range(0, 8)]), 1000),
        INVALID_FIELD_IN_PARAMETERS,
        "a point in time copy is not offered"
    );
    // Without RTV the type field is not read.
    assert!(parse_populate(&populate(0, 0, 0x0080_0001, &[range(0, 8)]), 1000).is_ok());
    assert_eq!(
        bad(populate(0, 0, 0, &[]), 1000),
        INVALID_FIELD_IN_PARAMETERS
    );
    assert_eq!(
        bad(populate(0, 0, 0, &[range(0, 0)]), 1000),
        INVALID_FIELD_IN_PARAMETERS,
        "no block at all"
    );
    let too_much = MAX_TOKEN_BLOCKS as u32;
    assert_eq!(
        bad(
            populate(0, 0, 0, &[range(0, too_much), range(too_much as u64, 1)]),
            u64::MAX
        ),
        INVALID_FIELD_IN_PARAMETERS
    );
    let many: Vec<[u8; 16]> = (0..65).map(|i| range(i * 2, 1)).collect();
    assert_eq!(
        bad(populate(0, 0, 0, &many), 1000),
        INVALID_FIELD_IN_PARAMETERS
    );
    // A list shorter than its lengths say, or a DATA LENGTH that does
    // not cover the ranges.
    let mut short = populate(0, 0, 0, &[range(0, 8)]);
    short.truncate(30);
    assert_eq!(bad(short, 1000), Sense::PARAMETER_LIST_LENGTH);
    let mut under = populate(0, 0, 0, &[range(0, 8)]);
    under[0..2].copy_from_slice(&20u16.to_be_bytes());
    assert_eq!(bad(under, 1000), Sense::PARAMETER_LIST_LENGTH);
    assert_eq!(bad(vec![0; 8], 1000), Sense::PARAMETER_LIST_LENGTH);
}

#[test]
fn a_token_names_its_unit_and_size_and_cannot_be_guessed() {
    let tokens: Tokens<&str> = Tokens::default();
    let now = Duration::ZERO;
    let p = parse_populate(&populate(0, 0, 0, &[range(0, 8), range(100, 4)]), 1000).unwrap();
    let t = tokens
        .create("a", creator(), p.clone(), now, &[7; RANDOM_LEN])
        .unwrap();
    assert_eq!(&t[0..8], &[0x00, 0x80, 0x00, 0x00, 0, 0, 0x01, 0xf8]);
    assert_eq!(
        t[16], 0xe4,
        "the creator unit as an identification descriptor"
    );
    assert_eq!(&t[20..24], &[0x01, 0x03, 0, 16]);
    assert_eq!(&t[24..40], &NAA);
    assert_eq!(&t[45..48], &[0, 2, 0], "block length 512");
    assert_eq!(u128::from_be_bytes(t[48..64].try_into().unwrap()), 12 * 512);
    assert_eq!(&t[128..], &[7; RANDOM_LEN][..]);
    let u = tokens
        .create("a", creator(), p, now, &[8; RANDOM_LEN])
        .unwrap();
    assert_ne!(t[8..16], u[8..16], "each token its own identifier");
    assert_eq!(tokens.len(), 2);
}

#[test]
fn a_token_is_taken_until_it_expires_or_is_deleted() {
    let tokens: Tokens<&str> = Tokens::default();
    let t0 = Duration::ZERO;
    let p = parse_populate(&populate(0, 2, 0, &[range(0, 8)]), 1000).unwrap();
    let t = tokens
        .create("a", creator(), p, t0, &[1; RANDOM_LEN])
        .unwrap();

    let taken = tokens.take(&t, t0 + Duration::from_secs(1)).unwrap();
    assert_eq!((taken.unit, taken.ranges.clone()), ("a", vec![r(0, 8)]));
    // While a copy reads it, it does not expire; a second reads too.
    let second = tokens.take(&t, t0 + Duration::from_secs(10)).unwrap();
    taken.put_back(false, Some(t0 + Duration::from_secs(10)));
    second.put_back(false, Some(t0 + Duration::from_secs(11)));
    // Use keeps it alive: 2 s of inactivity from its last use.
    tokens
        .take(&t, t0 + Duration::from_secs(12))
        .unwrap()
        .put_back(false, Some(t0 + Duration::from_secs(12)));
    // A copy dropped without a word (its task aborted) gives it back too.
    drop(tokens.take(&t, t0 + Duration::from_secs(13)).unwrap());
    assert_eq!(
        tokens.take(&t, t0 + Duration::from_secs(16)).unwrap_err(),
        TOKEN_EXPIRED
    );

    let p = parse_populate(&populate(0, 0, 0, &[range(0, 8)]), 1000).unwrap();
    let d = tokens
        .create("b", creator(), p, t0, &[2; RANDOM_LEN])
        .unwrap();
    tokens.take(&d, t0).unwrap().put_back(true, Some(t0));
    assert_eq!(tokens.take(&d, t0).unwrap_err(), TOKEN_DELETED);

    let mut forged = d;
    forged[300] ^= 1;
    assert_eq!(tokens.take(&forged, t0).unwrap_err(), TOKEN_UNKNOWN);
    let mut zero = [0u8; TOKEN_LEN];
    zero[0..4].copy_from_slice(&0xffff_0001u32.to_be_bytes());
    assert_eq!(tokens.take(&zero, t0).unwrap_err(), TOKEN_UNSUPPORTED_TYPE);
}

#[test]
fn tokens_are_bounded_and_expired_ones_make_room() {
    let tokens: Tokens<u32> = Tokens::default();
    let t0 = Duration::ZERO;
    let p = parse_populate(&populate(0, 1, 0, &[range(0, 1)]), 10).unwrap();
    for i in 0..MAX_TOKENS {
        let mut random = [0u8; RANDOM_LEN];
        random[..8].copy_from_slice(&(i as u64).to_be_bytes());
        tokens
            .create(i as u32, creator(), p.clone(), t0, &random)
            .unwrap();
    }
    assert_eq!(
        tokens.create(0, creator(), p.clone(), t0, &[9; RANDOM_LEN]),
        Err(INSUFFICIENT_RESOURCES)
    );
    let later = t0 + Duration::from_secs(2);
    assert!(tokens
        .create(0, creator(), p, later, &[9; RANDOM_LEN])
        .is_ok());
    assert_eq!(tokens.len(), 1, "the expired ones were swept");
}

#[test]
fn a_write_using_token_list_is_read_with_its_token() {
    let mut token = [0u8; TOKEN_LEN];
    token[0..4].copy_from_slice(&ROD_TYPE_AUR.to_be_bytes());
    token[511] = 0x5a;
    let p = write_using(3, &token, &[range(20, 4)]);
    let w = parse_write(&p, 100).unwrap();
    assert_eq!(
        (w.offset, w.token, w.ranges, w.delete),
        (3, token, vec![r(20, 4)], false)
    );
    let mut del = p.clone();
    del[2] = 0x02;
    assert!(parse_write(&del, 100).unwrap().delete, "DEL_TKN");
    assert_eq!(
        parse_write(&write_using(0, &token, &[range(98, 4)]), 100).unwrap_err(),
        Sense::LBA_OUT_OF_RANGE
    );
    assert_eq!(
        parse_write(&p[..540], 100).unwrap_err(),
        Sense::PARAMETER_LIST_LENGTH
    );
}

#[test]
fn a_tokens_data_is_laid_onto_the_destination_ranges_in_order() {
    let source = [r(100, 4), r(0, 6)];
    // 10 blocks: 100..104 then 0..6.
    assert_eq!(
        plan(&source, 0, &[r(50, 10)]).unwrap(),
        [
            Piece {
                source_lba: 100,
                destination_lba: 50,
                blocks: 4
            },
            Piece {
                source_lba: 0,
                destination_lba: 54,
                blocks: 6
            }
        ]
    );
    assert_eq!(
        plan(&source, 3, &[r(10, 2), r(20, 2)]).unwrap(),
        [
            Piece {
                source_lba: 103,
                destination_lba: 10,
                blocks: 1
            },
            Piece {
                source_lba: 0,
                destination_lba: 11,
                blocks: 1
            },
            Piece {
                source_lba: 1,
                destination_lba: 20,
                blocks: 2
            }
        ]
    );
    // Past what the token holds: what it holds is written.
    let short = plan(&source, 8, &[r(0, 5)]).unwrap();
    assert_eq!(
        short,
        [Piece {
            source_lba: 4,
            destination_lba: 0,
            blocks: 2
        }]
    );
    assert_eq!(
        plan(&source, 10, &[r(0, 1)]),
        Err(INVALID_FIELD_IN_PARAMETERS)
    );
}

#[test]
fn receive_rod_token_information_gives_the_token_and_the_count() {
    assert_eq!(
        receive_rod_token_information(None, 1024),
        Err(Sense::INVALID_FIELD_IN_CDB.in_cdb_field(2, 7))
    );
    let token = [0x33; TOKEN_LEN];
    let d = receive_rod_token_information(
        Some(Outcome {
            action: POPULATE_TOKEN,
            sense: None,
            blocks: 12,
            token: Some(token),
        }),
        1024,
    )
    .unwrap();
    assert_eq!(d.len(), 32 + 4 + 2 + TOKEN_LEN);
    assert_eq!(
        u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize,
        d.len() - 4
    );
    assert_eq!((d[4], d[5], d[12], d[13], d[15]), (0x10, 0x01, 0, 0, 0xf1));
    assert_eq!(u64::from_be_bytes(d[16..24].try_into().unwrap()), 12);
    assert_eq!(&d[32..38], &[0, 0, 0x02, 0x02, 0, 0]);
    assert_eq!(&d[38..], &token[..]);
    // A failed WRITE USING TOKEN: its sense, no token.
    let d = receive_rod_token_information(
        Some(Outcome {
            action: WRITE_USING_TOKEN,
            sense: Some(TOKEN_EXPIRED),
            blocks: 0,
            token: None,
        }),
        1024,
    )
    .unwrap();
    assert_eq!(
        (d[4], d[5], d[12], d[13], d[14]),
        (0x11, 0x02, 0x02, 18, 18)
    );
    assert_eq!((d[32 + 2], d[32 + 12], d[32 + 13]), (0x05, 0x23, 0x07));
    assert_eq!(&d[50..54], &[0, 0, 0, 0]);
    assert_eq!(d.len(), 54);
    assert_eq!(
        receive_rod_token_information(
            Some(Outcome {
                action: POPULATE_TOKEN,
                sense: None,
                blocks: 1,
                token: None,
            }),
            8
        )
        .unwrap()
        .len(),
        8
    );
}

#[test]
fn results_are_held_per_nexus_and_list() {
    let results = Results::default();
    let a = NexusName::new("iqn.a", [0, 0, 0, 0, 0, 1], 1);
    let b = NexusName::new("iqn.b", [0, 0, 0, 0, 0, 1], 1);
    let o = Outcome {
        action: WRITE_USING_TOKEN,
        sense: None,
        blocks: 4,
        token: None,
    };
    results.put(&a, 0x1234_5678, o.clone());
    assert_eq!(results.get(&a, 0x1234_5678), Some(o.clone()));
    assert_eq!(results.get(&b, 0x1234_5678), None);
    for id in 0..256 {
        results.put(&b, id, o.clone());
    }
    assert_eq!(results.get(&a, 0x1234_5678), None, "the oldest goes first");
}
