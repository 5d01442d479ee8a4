//! What the simulated volume must show: for every block, the history of
//! what was written to it, and the rules a read, a landing write and a
//! durable copy are checked against.
//!
//! Writes to one block never overlap in time in the simulation (NBD lets
//! concurrent overlapping writes land in either order), so a block's
//! writes are acknowledged in the order they were submitted, and what a
//! block may hold at a moment is: the last write acknowledged before that
//! moment, or anything submitted after it (it may have landed, whole or
//! not, or failed half way).

use std::collections::HashMap;
use std::time::Duration;

/// What a block holds: zeroes (never written, zeroed or trimmed: the
/// simulated target reads trimmed blocks as zeroes), or one write's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Content {
    Zero,
    Data(u64),
}

/// One write to a block.
#[derive(Clone, Debug)]
struct Write {
    content: Content,
    #[allow(dead_code)] // shown in failures' debug output
    submitted: Duration,
    acked: Option<Duration>,
}

/// Every block's writes, in submission order.
#[derive(Debug, Default)]
pub(crate) struct History {
    blocks: HashMap<u64, Vec<Write>>,
}

impl History {
    /// A write of `content` to `block`; returns its place in the block's
    /// history.
    pub fn submitted(&mut self, block: u64, content: Content, at: Duration) -> usize {
        let v = self.blocks.entry(block).or_default();
        v.push(Write {
            content,
            submitted: at,
            acked: None,
        });
        v.len() - 1
    }

    /// The write at `index` of `block`'s history was acknowledged.
    pub fn acked(&mut self, block: u64, index: usize, at: Duration) {
        if let Some(w) = self.blocks.get_mut(&block).and_then(|v| v.get_mut(index)) {
            w.acked = Some(at);
        }
    }

    /// What `block` may hold at `at`: the last write acknowledged before
    /// then (zeroes if none), and every write submitted after it.
    pub fn allowed(&self, block: u64, at: Duration) -> Vec<Content> {
        let Some(v) = self.blocks.get(&block) else {
            return vec![Content::Zero];
        };
        match v.iter().rposition(|w| w.acked.is_some_and(|t| t <= at)) {
            Some(i) => v[i..].iter().map(|w| w.content).collect(),
            None => std::iter::once(Content::Zero)
                .chain(v.iter().map(|w| w.content))
                .collect(),
        }
    }

    /// The content of the last write to `block` acknowledged before `at`.
    pub fn last_acked(&self, block: u64, at: Duration) -> Content {
        self.blocks
            .get(&block)
            .and_then(|v| v.iter().rev().find(|w| w.acked.is_some_and(|t| t <= at)))
            .map_or(Content::Zero, |w| w.content)
    }

    /// Whether `block` held `content` at `at` or could have since (a
    /// version older than the last acknowledged one is stale).
    pub fn fresh(&self, block: u64, content: Content, at: Duration) -> bool {
        self.allowed(block, at).contains(&content)
    }

    pub fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.blocks.keys().copied()
    }
}

/// The content a write's payload carries for one block: its first eight
/// bytes are the write's version (0 for zeroes).
pub(crate) fn stamp(version: u64) -> [u8; 8] {
    version.to_le_bytes()
}

pub(crate) fn unstamp(block: &[u8]) -> Content {
    let mut b = [0u8; 8];
    b.copy_from_slice(&block[..8]);
    match u64::from_le_bytes(b) {
        0 => Content::Zero,
        v => Content::Data(v),
    }
}
