//! Token copy (Windows' ODX) carried out in the target: POPULATE TOKEN
//! makes a token for ranges of the unit it is sent to, WRITE USING TOKEN
//! writes ranges of the unit it is sent to from a token's data, which
//! may come from any export this server serves. The parameter lists, the
//! tokens and the answers are [`braid_scsi::rod`]'s; the blocks move by
//! the store's copy ([`braid_store::copy`]), as EXTENDED COPY's do, never
//! through the initiator.

use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use braid_scsi::rod::{self, Creator, Outcome as Held, RANDOM_LEN};
use braid_scsi::{Command, NexusName, Sense};
use braid_store::copy::{self, End};
use tracing::debug;

use super::unit::{self, Outcome, BLOCK};
use crate::{Served, Shared};

/// Runs POPULATE TOKEN `list_id` from `nexus` on `served` (reached
/// through portal group `tag`): the token is held server-wide and its
/// outcome on the unit, for RECEIVE ROD TOKEN INFORMATION.
pub fn populate(
    shared: &Shared,
    tag: u16,
    served: &Arc<Served>,
    nexus: &NexusName,
    list_id: u32,
    params: &[u8],
) -> Outcome {
    let described = unit::describe(&served.export, &served.name, tag, shared.instance);
    let made = rod::parse_populate(params, described.blocks).and_then(|p| {
        let blocks = p.ranges.iter().map(|r| u64::from(r.blocks)).sum::<u64>();
        let creator = Creator {
            naa: described.naa(),
            block_size: BLOCK,
        };
        shared
            .tokens
            .create(served.clone(), creator, p, now(), &random())
            .map(|t| (t, blocks))
    });
    let (held, outcome) = match made {
        Ok((token, blocks)) => (
            Held {
                action: rod::POPULATE_TOKEN,
                sense: None,
                blocks,
                token: Some(token),
            },
            Outcome::Good(Vec::new()),
        ),
        Err(sense) => (refused(rod::POPULATE_TOKEN, sense), Outcome::Check(sense)),
    };
    served.lu.tokens.put(nexus, list_id, held);
    outcome
}

/// Runs WRITE USING TOKEN `list_id` from `nexus` on `served`. The
/// token's unit, if another than `served`, is held to its reservations
/// as this initiator port's READ would be. Each piece reaches stable
/// storage before GOOD unless the destination's write cache is on, as a
/// WRITE's would.
pub async fn write_using(
    shared: &Shared,
    tag: u16,
    served: &Arc<Served>,
    nexus: &NexusName,
    list_id: u32,
    params: &[u8],
) -> Outcome {
    let described = unit::describe(&served.export, &served.name, tag, shared.instance);
    let ask = match rod::parse_write(params, described.blocks) {
        Ok(w) => w,
        Err(sense) => return keep(served, nexus, list_id, refused(WRITE, sense)),
    };
    let taken = match shared.tokens.take(&ask.token, now()) {
        Ok(t) => t,
        Err(sense) => return keep(served, nexus, list_id, refused(WRITE, sense)),
    };
    let pieces = rod::plan(&taken.ranges, ask.offset, &ask.ranges);
    let source = taken.unit.clone();
    let (written, outcome) = match pieces {
        Ok(pieces) => run(&source, served, nexus, &pieces).await,
        Err(sense) => (0, Outcome::Check(sense)),
    };
    taken.put_back(ask.delete, Some(now()));
    let sense = match &outcome {
        Outcome::Good(_) => None,
        Outcome::Check(s) => Some(*s),
        // Nothing was copied and the initiator is told so by its status.
        Outcome::Conflict => return outcome,
        // The connection closes unanswered; a later RECEIVE ROD TOKEN
        // INFORMATION on another finds the copy failed.
        Outcome::Lost => Some(Sense::WRITE_ERROR),
    };
    served.lu.tokens.put(
        nexus,
        list_id,
        Held {
            action: WRITE,
            sense,
            blocks: written,
            token: None,
        },
    );
    outcome
}

const WRITE: u8 = rod::WRITE_USING_TOKEN;

/// Copies `pieces` from `source` to `destination`: the blocks written,
/// and the answer.
async fn run(
    source: &Arc<Served>,
    destination: &Arc<Served>,
    nexus: &NexusName,
    pieces: &[rod::Piece],
) -> (u64, Outcome) {
    if !Arc::ptr_eq(source, destination) {
        for p in pieces {
            let read = Command::Read {
                lba: p.source_lba,
                blocks: u32::try_from(p.blocks).unwrap_or(u32::MAX),
                fua: false,
            };
            if source.lu.conflicts(nexus, &read) {
                return (0, Outcome::Conflict);
            }
        }
    }
    let durable = !destination.lu.write_cache.on();
    let mut written = 0;
    for p in pieces {
        let from = End {
            export: source.export.clone(),
            offset: p.source_lba * u64::from(BLOCK),
        };
        let to = End {
            export: destination.export.clone(),
            offset: p.destination_lba * u64::from(BLOCK),
        };
        match copy::copy(&from, &to, p.blocks * u64::from(BLOCK), durable).await {
            Ok(done) => debug!(
                from = %source.name,
                to = %destination.name,
                blocks = p.blocks,
                in_kernel = done.in_kernel,
                "WRITE USING TOKEN piece"
            ),
            Err(e) => return (written, unit::failed(&e, true)),
        }
        written += p.blocks;
    }
    (written, Outcome::Good(Vec::new()))
}

fn refused(action: u8, sense: Sense) -> Held {
    Held {
        action,
        sense: Some(sense),
        blocks: 0,
        token: None,
    }
}

fn keep(served: &Served, nexus: &NexusName, list_id: u32, held: Held) -> Outcome {
    let answer = held.sense.map_or(Outcome::Good(Vec::new()), Outcome::Check);
    served.lu.tokens.put(nexus, list_id, held);
    answer
}

/// Time since the first token command, the clock `braid_scsi::rod`'s
/// tokens age by.
fn now() -> Duration {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// Bytes no initiator can guess, for a token's tail.
fn random() -> [u8; RANDOM_LEN] {
    let mut r = [0u8; RANDOM_LEN];
    for chunk in r.chunks_mut(16) {
        chunk.copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    }
    r
}
