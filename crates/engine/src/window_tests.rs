//! The replay window against byte-level models of what it must give back.

use braid_block::Flags;
use bytes::Bytes;
use rand::{Rng, SeedableRng};

use super::api::Payload;
use super::window::{Extent, Window, ENTRY_COST};

fn b(len: usize, v: u8) -> Payload {
    Payload::new(Bytes::from(vec![v; len]))
}

fn data(w: &Window) -> Vec<(u64, Bytes)> {
    w.to_replay()
        .into_iter()
        .map(|(o, e)| match e {
            Extent::Data(d) => (o, d),
            other => panic!("not data: {other:?}"),
        })
        .collect()
}

/// Random writes, zeroing, trims, FUA requests, punches and FLUSHes
/// against a byte-level model of what the window must give back: the
/// newest not yet durable content of every byte, nothing else.
#[test]
fn the_window_gives_back_exactly_the_newest_unflushed_bytes() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut w = Window::new(u64::MAX);
    // Per byte: what the window must replay there. 0 = zeroes, 1 = trim,
    // 2.. = that data byte.
    let mut model: Vec<Option<u16>> = vec![None; 4096];
    for step in 0..4000 {
        let offset = rng.gen_range(0..4000u64);
        let len = rng.gen_range(1..=(4096 - offset).min(96));
        let range = offset as usize..(offset + len) as usize;
        let fua = rng.gen_ratio(1, 8);
        match rng.gen_range(0..12) {
            0 => {
                w.punch(offset, len);
                model[range].fill(None);
            }
            1 => {
                let mark = w.mark();
                w.flushed(mark);
                model.fill(None);
            }
            2 => {
                let flags = Flags::NO_HOLE;
                w.acked_extent(offset, Extent::Zeroes { len, flags }, fua);
                model[range].fill((!fua).then_some(0));
            }
            3 => {
                w.acked_extent(offset, Extent::Trim { len }, fua);
                model[range].fill((!fua).then_some(1));
            }
            _ => {
                let v = (step % 251) as u8 + 2;
                w.acked_data(offset, &b(len as usize, v), fua);
                model[range].fill((!fua).then_some(u16::from(v)));
            }
        }
        let mut got: Vec<Option<u16>> = vec![None; 4096];
        let mut bytes = 0;
        for (o, e) in w.to_replay() {
            for i in 0..e.len() as usize {
                let at = o as usize + i;
                assert!(got[at].is_none(), "entries overlap at {at}");
                got[at] = Some(match &e {
                    Extent::Data(d) => u16::from(d[i]),
                    Extent::Zeroes { flags, .. } => {
                        assert_eq!(*flags, Flags::NO_HOLE, "flags kept");
                        0
                    }
                    Extent::Trim { .. } => 1,
                });
            }
            bytes += e.len();
        }
        assert_eq!(got, model, "after step {step}");
        assert_eq!(w.bytes(), bytes, "byte count after step {step}");
    }
}

#[test]
fn a_flush_makes_what_it_covered_durable_and_only_that() {
    let mut w = Window::new(1 << 20);
    w.acked_data(0, &b(4096, 1), false);
    let mark = w.mark();
    w.acked_data(8192, &b(4096, 2), false);
    w.flushed(mark);
    assert_eq!(data(&w), vec![(8192, Bytes::from(vec![2; 4096]))]);
    assert_eq!(w.bytes(), 4096);
}

#[test]
fn newer_writes_replace_what_they_overlap_so_replay_never_goes_back() {
    let mut w = Window::new(1 << 30);
    w.acked_data(0, &b(12288, 1), false);
    w.acked_data(4096, &b(4096, 2), true); // FUA: durable, only punches
    let v = |len, x| Bytes::from(vec![x; len]);
    assert_eq!(data(&w), vec![(0, v(4096, 1)), (8192, v(4096, 1))]);
    w.acked_data(2048, &b(8192, 3), false);
    assert_eq!(
        data(&w),
        vec![(0, v(2048, 1)), (10240, v(2048, 1)), (2048, v(8192, 3))]
    );
    assert_eq!(w.bytes(), 12288);
    w.punch(0, 1 << 20);
    assert!(w.to_replay().is_empty());
    assert_eq!(w.bytes(), 0);
    assert_eq!(w.pinned(), 0, "nothing held once nothing is kept");
}

#[test]
fn past_its_limit_the_window_lets_the_oldest_go_until_a_flush_covers_them() {
    let cost = 4096 + ENTRY_COST;
    let mut w = Window::new(2 * cost);
    w.acked_data(0, &b(4096, 1), false);
    w.acked_data(4096, &b(4096, 2), false);
    assert!(!w.overflowed());
    w.acked_data(8192, &b(4096, 3), false);
    assert!(w.overflowed());
    let v = |x| Bytes::from(vec![x; 4096]);
    assert_eq!(
        data(&w),
        vec![(4096, v(2)), (8192, v(3))],
        "the oldest went, the newest are kept"
    );
    let mark = w.mark();
    w.flushed(mark);
    assert!(!w.overflowed(), "a FLUSH after them covers what was let go");
    w.acked_data(0, &b(4096, 4), false);
    assert_eq!(data(&w), vec![(0, v(4))]);
}

/// A FLUSH sent before the window let writes go covers only what was
/// acknowledged before it was sent. When it succeeds, the window must
/// still say it is not whole, or a restart would replay nothing and the
/// next FLUSH succeed over lost writes. Before the fix the window said
/// "the FLUSH covered only the first write, yet the window says it holds
/// every unflushed write: replay would give back []".
#[test]
fn a_flush_sent_before_an_overflow_does_not_make_the_window_whole() {
    let cost = 4096 + ENTRY_COST;
    let mut w = Window::new(2 * cost);
    w.acked_data(0, &b(4096, 1), false);
    let mark = w.mark();
    w.acked_data(4096, &b(4096, 2), false);
    w.acked_data(8192, &b(4096, 3), false);
    w.acked_data(12288, &b(4096, 4), false);
    assert!(w.overflowed());
    w.flushed(mark);
    assert!(
        w.overflowed(),
        "the FLUSH covered only the first write, yet the window says it holds every \
         unflushed write: replay would give back {:?}",
        data(&w)
            .iter()
            .map(|(o, d)| (*o, d.len()))
            .collect::<Vec<_>>()
    );
    let mark = w.mark();
    w.flushed(mark);
    assert!(!w.overflowed());
}

/// 1000 overlapping 1 MiB writes, each 4 KiB past the last: the window
/// keeps a 4 KiB remnant of each. Counted by slice length that was 4 MiB
/// while the remnants kept 1000 MiB of buffers alive (before the fix:
/// "the window counts 4 MiB but keeps 1000 MiB of buffers alive"); now
/// what it counts bounds what it keeps, whatever the pattern. A buffer is
/// kept alive by the window while the test's own handle to it is not the
/// only one.
#[test]
fn the_window_counts_the_memory_its_slices_pin() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for pattern in 0..3 {
        let mut w = Window::new(u64::MAX);
        let mut buffers: Vec<(Bytes, u64)> = Vec::new();
        for i in 0..1000u64 {
            let len = match pattern {
                0 => 1 << 20,
                _ => rng.gen_range(1..=256) * 4096,
            };
            // A pooled buffer is larger than the write it holds.
            let pinned = (len as u64).next_power_of_two();
            let data = Bytes::from(vec![i as u8; len]);
            let offset = match pattern {
                0 => i * 4096,
                1 => rng.gen_range(0..1024u64) * 4096,
                _ => rng.gen_range(0..(64 << 20) / 4096u64) * 4096,
            };
            let payload = Payload {
                data: data.clone(),
                pinned,
            };
            buffers.push((data, pinned));
            w.acked_data(offset, &payload, false);
            drop(payload);
            buffers.retain(|(b, _)| !b.is_unique());
            let kept: u64 = buffers.iter().map(|(_, p)| p).sum();
            assert!(
                w.pinned() >= kept,
                "pattern {pattern}, write {i}: the window counts {} KiB but keeps {} KiB of \
                 buffers alive",
                w.pinned() >> 10,
                kept >> 10
            );
            // And it does not keep more than twice what it would replay
            // (remnants of mostly punched buffers are copied out).
            assert!(
                w.pinned() <= 2 * w.bytes() + (w.to_replay().len() as u64) * ENTRY_COST,
                "pattern {pattern}, write {i}: {} KiB held for {} KiB of data",
                w.pinned() >> 10,
                w.bytes() >> 10
            );
        }
        w.punch(0, u64::MAX / 2);
        assert_eq!(w.pinned(), 0, "pattern {pattern}: all released");
        buffers.retain(|(b, _)| !b.is_unique());
        assert!(buffers.is_empty(), "pattern {pattern}: buffers still kept");
    }
}

/// A window bounded by memory stays within its bound under overlapping
/// writes, however much they would replay.
#[test]
fn the_bound_is_a_bound_on_memory() {
    let limit = 8 << 20;
    let mut w = Window::new(limit);
    for i in 0..2000u64 {
        let data = Bytes::from(vec![i as u8; 1 << 20]);
        w.acked_data(
            i * 4096,
            &Payload {
                data,
                pinned: 1 << 20,
            },
            false,
        );
        assert!(w.pinned() <= limit, "write {i}: {} held", w.pinned());
    }
}
