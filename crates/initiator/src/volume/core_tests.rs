//! The driver's own checks: a read split over paths and answered in any
//! order comes back as the caller's bytes; data outside its chunk, gaps
//! and overlaps fail the read.

use super::reads::place_in_request;
use super::*;
use crate::engine::ChunkInfo;
use crate::engine::{EngineConfig, PathConfig, Submit};
use braid_block::Flags;
use braid_policy::{by_name, PolicyOptions, SplitRules, NAMES};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// The byte the fake target holds at `offset`.
fn byte_at(offset: u64) -> u8 {
    (offset.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn split_then_reassemble_returns_the_callers_bytes(
        align_shift in 0u32..13,
        offset_blocks in 0u64..5000,
        len_blocks in 1u64..3000,
        chunk_blocks in 1u64..600,
        paths in 1usize..6,
        policy in 0usize..9,
        seed: u64,
    ) {
        let align = 1u64 << align_shift;
        let offset = offset_blocks * align;
        let len = (len_blocks * align).min(64 << 20);
        let mut engine = Engine::new(
            EngineConfig {
                split: SplitRules { align, chunk: chunk_blocks * align, max: (8 << 20) / align * align },
                size: 1 << 40,
                ..EngineConfig::default()
            },
            by_name(NAMES[policy], &PolicyOptions::default()).unwrap(),
        );
        for i in 0..paths {
            let p = engine.add_path(PathConfig::default(), Duration::ZERO);
            engine.path_up(
                Duration::ZERO,
                p,
                vec![Some(braid_proto::braid_ns::ConnId(i as u128))],
                true,
            );
        }
        while engine.poll_action().is_some() {}
        let id = engine.submit(Duration::ZERO, Submit::new(Op::Read, offset, len, Flags::empty()));
        let mut sends = Vec::new();
        while let Some(a) = engine.poll_action() {
            if let Action::Send(s) = a { sends.push(s) }
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        sends.shuffle(&mut rng);
        let mut done = Done::default();
        let mut result = None;
        for s in sends {
            let info = engine.chunk(s.cookie).unwrap();
            // The target may answer in several data chunks, any order.
            let cut = if s.len > 1 { rng.gen_range(0..s.len) } else { 0 };
            let mut parts = vec![(s.offset, cut), (s.offset + u64::from(cut), s.len - cut)];
            parts.retain(|(_, n)| *n > 0);
            parts.shuffle(&mut rng);
            for (at, n) in parts {
                let bytes: Vec<u8> = (at..at + u64::from(n)).map(byte_at).collect();
                let dest = place_in_request(&info, Some(at), u64::from(n)).unwrap();
                done.data.push((dest, Bytes::from(bytes)));
            }
            engine.reply(Duration::ZERO, s.cookie, Ok(()));
            while let Some(a) = engine.poll_action() {
                if let Action::Complete { req, result: r } = a {
                    prop_assert_eq!(req, id);
                    result = Some(r);
                }
            }
        }
        prop_assert_eq!(result, Some(Ok(())));
        let got = assemble(done, len).unwrap();
        let flat: Vec<u8> = got.data.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        let want: Vec<u8> = (offset..offset + len).map(byte_at).collect();
        prop_assert!(flat == want, "reassembled bytes differ");
    }
}

#[test]
fn data_outside_its_chunk_is_refused() {
    let info = ChunkInfo {
        path: PathId(0),
        op: Op::Read,
        len: 100,
        offset: 1000,
        req: Some(ReqId(1)),
        req_offset: 50,
    };
    assert_eq!(place_in_request(&info, Some(1000), 100), Some(50));
    assert_eq!(place_in_request(&info, Some(1010), 10), Some(60));
    assert_eq!(place_in_request(&info, None, 100), Some(50));
    assert_eq!(place_in_request(&info, Some(999), 10), None);
    assert_eq!(place_in_request(&info, Some(1095), 10), None);
    assert_eq!(place_in_request(&info, Some(u64::MAX), 10), None);
}

#[test]
fn gaps_and_overlaps_fail_the_read() {
    let d = Done {
        data: vec![
            (0, Bytes::from_static(b"ab")),
            (3, Bytes::from_static(b"d")),
        ],
        extents: vec![],
        piped: Vec::new(),
    };
    assert!(assemble(d, 4).is_err());
    let d = Done {
        data: vec![
            (0, Bytes::from_static(b"ab")),
            (1, Bytes::from_static(b"bc")),
        ],
        extents: vec![],
        piped: Vec::new(),
    };
    assert!(assemble(d, 3).is_err());
}

/// `bytes` in a pipe, as a reply's piece spliced from a socket would be.
fn piped(bytes: &[u8]) -> braid_pool::Piped {
    let mut fill = braid_pool::PipeFill::new(bytes.len(), braid_pool::PIPES).unwrap();
    assert!(fill.push(bytes));
    fill.finish().unwrap()
}

#[test]
fn pieces_in_pipes_and_buffers_together_cover_a_read_or_fail_it() {
    let d = Done {
        data: vec![(3, Bytes::from_static(b"def"))],
        extents: vec![],
        piped: vec![(6, piped(b"gh")), (0, piped(b"abc"))],
    };
    let got = assemble(d, 8).unwrap();
    let offsets: Vec<u64> = got.piped.iter().map(|(at, _)| *at).collect();
    assert_eq!(offsets, [0, 6], "piped pieces are handed on in order");
    // A piped piece overlapping a buffered one, and one leaving a gap.
    let d = Done {
        data: vec![(0, Bytes::from_static(b"abc"))],
        extents: vec![],
        piped: vec![(2, piped(b"cd"))],
    };
    assert!(assemble(d, 4).is_err());
    let d = Done {
        data: vec![(0, Bytes::from_static(b"ab"))],
        extents: vec![],
        piped: vec![(3, piped(b"d"))],
    };
    assert!(assemble(d, 4).is_err());
}
