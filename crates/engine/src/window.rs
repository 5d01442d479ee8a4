//! The replay window: what the target acknowledged since the last FLUSH
//! that succeeded, kept so that a target that restarted (and may have lost
//! what it never made durable) can be given it again, as NFS clients
//! resend unstable writes when the server's write verifier changes.
//!
//! It keeps writes with their data, and zeroing and trims as extents
//! without payload, by acknowledgement order. A FUA request, or a FLUSH
//! that covered a request, makes it durable: it leaves the window. A later
//! request over the same range replaces what it overlaps, so a replay never
//! puts old data over newer.
//!
//! Its bound is on memory, not on the bytes it would replay: a slice of a
//! write keeps the whole buffer it came in alive, so the window counts each
//! buffer's size (`pinned`) as long as any slice of it is kept, and copies
//! what little is left of a buffer once less than half of it is still in
//! use. Past its bound it lets its oldest entries go and remembers up to
//! which acknowledgement it did: until a FLUSH covers those, a restart
//! cannot be made whole, and says so.

use std::collections::BTreeMap;

mod order;

use braid_block::Flags;
use bytes::Bytes;
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use crate::api::Payload;
use order::AckOrder;

/// What an entry costs besides its data: the maps' nodes and the entry.
pub(crate) const ENTRY_COST: u64 = 128;

/// One range the window would write again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Extent {
    /// Written data.
    Data(Bytes),
    /// Zeroed (WRITE_ZEROES) with these flags (NO_HOLE, FAST_ZERO).
    Zeroes { len: u64, flags: Flags },
    /// Trimmed: replayed as a trim, so a target that reads trimmed blocks
    /// as zeroes gives zeroes back.
    Trim { len: u64 },
}

impl Extent {
    pub fn len(&self) -> u64 {
        match self {
            Self::Data(d) => d.len() as u64,
            Self::Zeroes { len, .. } | Self::Trim { len } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The part `[from, to)` of this extent (offsets within it).
    fn part(&self, from: u64, to: u64) -> Self {
        match self {
            Self::Data(d) => Self::Data(d.slice(from as usize..to as usize)),
            Self::Zeroes { flags, .. } => Self::Zeroes {
                len: to - from,
                flags: *flags,
            },
            Self::Trim { .. } => Self::Trim { len: to - from },
        }
    }
}

#[derive(Debug)]
struct Stored {
    /// The acknowledgement it came with (or of the entry it is a part of).
    seq: u64,
    offset: u64,
    extent: Extent,
    /// The buffer a data extent is a slice of.
    origin: Option<u64>,
}

/// A buffer some entries are slices of.
#[derive(Debug)]
struct Origin {
    pinned: u64,
    /// Bytes of it the window still uses, and the entries that use them:
    /// mostly one, the whole write, held inline (a set of its own cost an
    /// allocation per write, and under 4 KiB random writes that never
    /// flush, the window's upkeep was a fifth of `braid attach`'s CPU).
    live: u64,
    /// Their ids in [`Window::entries`].
    slices: SmallVec<[usize; 1]>,
}

/// Acknowledged, not yet durable requests, by acknowledgement order.
#[derive(Debug)]
pub struct Window {
    /// Every entry, oldest first: seq grows with each acknowledgement, and
    /// the pieces a later request leaves of an entry keep its seq (and
    /// its place). Entries never overlap.
    entries: AckOrder<Stored>,
    /// offset → id in `entries` of every entry: the same entries by where
    /// they lie, so that a request finds what it overlaps without looking
    /// at the whole window (which holds thousands of small writes between
    /// FLUSHes).
    by_offset: BTreeMap<u64, usize>,
    origins: FxHashMap<u64, Origin>,
    next_origin: u64,
    next_seq: u64,
    /// Memory the window holds: buffers it pins plus [`ENTRY_COST`] each.
    pinned: u64,
    limit: u64,
    /// Acknowledgements up to this seq were let go to stay within the
    /// limit: the window cannot give them back until a FLUSH covers them.
    dropped_upto: Option<u64>,
    /// Tests: a FLUSH makes the window whole, whatever it covered.
    #[cfg(test)]
    pub(crate) undo_overflow: bool,
}

impl Window {
    pub fn new(limit: u64) -> Self {
        Self {
            entries: AckOrder::new(),
            by_offset: BTreeMap::new(),
            origins: FxHashMap::default(),
            next_origin: 0,
            next_seq: 0,
            pinned: 0,
            limit,
            dropped_upto: None,
            #[cfg(test)]
            undo_overflow: false,
        }
    }

    /// A write the target acknowledged. A FUA write is already durable: it
    /// only replaces older data in its range.
    pub fn acked_data(&mut self, offset: u64, payload: &Payload, fua: bool) {
        let len = payload.data.len() as u64;
        self.punch(offset, len);
        if fua || len == 0 {
            return;
        }
        let origin = self.next_origin;
        self.next_origin += 1;
        self.origins.insert(
            origin,
            Origin {
                pinned: payload.pinned.max(len),
                live: 0,
                slices: SmallVec::new(),
            },
        );
        self.pinned += payload.pinned.max(len);
        self.record(offset, Extent::Data(payload.data.clone()), Some(origin));
    }

    /// A WRITE_ZEROES or TRIM the target acknowledged (`extent` says which
    /// and how long).
    pub fn acked_extent(&mut self, offset: u64, extent: Extent, fua: bool) {
        let len = extent.len();
        self.punch(offset, len);
        if fua || len == 0 {
            return;
        }
        self.record(offset, extent, None);
    }

    fn record(&mut self, offset: u64, extent: Extent, origin: Option<u64>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let id = self.entries.push_back(Stored {
            seq,
            offset,
            extent,
            origin,
        });
        self.index(id);
        self.shed();
    }

    /// Lets the oldest entries go while the window holds more than its
    /// limit.
    fn shed(&mut self) {
        while self.pinned > self.limit {
            let Some(front) = self.entries.front() else {
                break;
            };
            let seq = self.take(front).seq;
            self.dropped_upto = Some(self.dropped_upto.map_or(seq, |d| d.max(seq)));
        }
    }

    /// Counts and indexes entry `id`, just put in `entries`.
    fn index(&mut self, id: usize) {
        self.pinned += ENTRY_COST;
        let s = self.entries.get(id);
        let (offset, len, origin) = (s.offset, s.extent.len(), s.origin);
        if let Some(o) = origin {
            let o = self.origins.get_mut(&o).expect("origin of a slice");
            o.live += len;
            o.slices.push(id);
        }
        self.by_offset.insert(offset, id);
    }

    /// Removes an entry from the maps; its buffer stays counted until
    /// [`Self::release`]. Returns it and the entry before it.
    fn unlink(&mut self, id: usize) -> (Stored, Option<usize>) {
        let (s, before) = self.entries.remove(id);
        self.by_offset.remove(&s.offset);
        self.pinned -= ENTRY_COST;
        if let Some(o) = s.origin {
            let o = self.origins.get_mut(&o).expect("origin of a slice");
            o.live -= s.extent.len();
            if let Some(i) = o.slices.iter().position(|&k| k == id) {
                o.slices.swap_remove(i);
            }
        }
        (s, before)
    }

    /// Removes an entry and releases its buffer if nothing else uses it.
    fn take(&mut self, id: usize) -> Stored {
        let (s, _) = self.unlink(id);
        if let Some(o) = s.origin {
            self.release(o);
        }
        s
    }

    /// Lets a buffer go once no entry uses it; one used less than half has
    /// its remaining slices copied out, so that it can go too.
    fn release(&mut self, id: u64) {
        let Some(o) = self.origins.get(&id) else {
            return;
        };
        if o.live * 2 >= o.pinned && o.live > 0 {
            return;
        }
        let o = self.origins.remove(&id).expect("present above");
        self.pinned -= o.pinned;
        for entry in o.slices {
            let s = self.entries.get_mut(entry);
            let copy = match &s.extent {
                Extent::Data(d) => Bytes::copy_from_slice(d),
                _ => unreachable!("only data extents have a buffer"),
            };
            let len = copy.len() as u64;
            s.extent = Extent::Data(copy);
            let new = self.next_origin;
            self.next_origin += 1;
            s.origin = Some(new);
            let mut slices = SmallVec::new();
            slices.push(entry);
            self.origins.insert(
                new,
                Origin {
                    pinned: len,
                    live: len,
                    slices,
                },
            );
            self.pinned += len;
        }
    }

    /// A FLUSH is being sent: it covers what was acknowledged so far. The
    /// mark goes to [`Self::flushed`] when it succeeds.
    pub fn mark(&self) -> u64 {
        self.next_seq
    }

    /// The FLUSH with `mark` succeeded: what it covered is durable. What
    /// the window had let go is whole again once a FLUSH covers it.
    pub fn flushed(&mut self, mark: u64) {
        while let Some(front) = self.entries.front() {
            if self.entries.get(front).seq >= mark {
                break;
            }
            self.take(front);
        }
        if self.entries.is_empty() {
            // Its slots' memory goes too, not kept at the window's peak.
            self.entries = AckOrder::new();
        }
        if self.dropped_upto.is_some_and(|d| d < mark) {
            self.dropped_upto = None;
        }
        #[cfg(test)]
        if self.undo_overflow {
            self.dropped_upto = None;
        }
    }

    /// Forgets `[offset, offset + len)`: newer data is (or will be) there.
    pub fn punch(&mut self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let end = offset.saturating_add(len);
        // Entries never overlap, so by offset they also end in order: going
        // down from `end`, the first that ends at or before `offset` ends
        // the search.
        let mut hit: SmallVec<[usize; 2]> = SmallVec::new();
        for (&o, &id) in self.by_offset.range(..end).rev() {
            let e_end = o + self.entries.get(id).extent.len();
            if e_end <= offset {
                break;
            }
            hit.push(id);
        }
        let mut touched: SmallVec<[u64; 2]> = SmallVec::new();
        for id in hit {
            let (s, mut place) = self.unlink(id);
            let o = s.offset;
            let e_end = o + s.extent.len();
            // What lies outside the punched range stays, with its seq.
            let left = (o < offset).then(|| (o, 0, offset - o));
            let right = (e_end > end).then(|| (end, end - o, e_end - o));
            for (at, from, to) in left.into_iter().chain(right) {
                let part = Stored {
                    seq: s.seq,
                    offset: at,
                    extent: s.extent.part(from, to),
                    origin: s.origin,
                };
                // In the entry's place: the order stays by seq.
                let id = self.entries.insert_after(place, part);
                self.index(id);
                place = Some(id);
            }
            touched.extend(s.origin);
        }
        for id in touched {
            self.release(id);
        }
    }

    /// What to give a restarted target again, oldest first; the window
    /// keeps it (it is still not durable until a FLUSH succeeds).
    pub fn to_replay(&self) -> Vec<(u64, Extent)> {
        self.entries
            .iter()
            .map(|s| (s.offset, s.extent.clone()))
            .collect()
    }

    /// Holds nothing to give back.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Acknowledged requests were let go to stay within the limit and no
    /// FLUSH has covered them yet.
    pub fn overflowed(&self) -> bool {
        self.dropped_upto.is_some()
    }

    /// Memory the window holds (see [`Self::limit`]).
    pub fn pinned(&self) -> u64 {
        self.pinned
    }

    /// Bytes of requests the window would replay.
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|s| s.extent.len()).sum()
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }
}
