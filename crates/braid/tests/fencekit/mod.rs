//! The stale-write scenario of iSCSI fencing, on loopback: a volume of
//! two paths, the first through a [`Relay`]; a write (v1) sent on the
//! first path is held in the target's backing store (a
//! `braid-powercut` file that delays the one write at the block), the
//! path is cut while it is there, braid fences and re-sends it on the
//! second path, then writes v2 of the block. Once the delayed write has
//! landed, the block shows whether the fence held: v2, or the stale v1
//! landed on top of it.
//!
//! The relay opens again once the delayed write has landed (the failed
//! link comes back), so a fence that may go only through the failed
//! path's portal can then be carried out.

#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use braid_initiator::{IoError, Volume};
use braid_powercut::PowerCut;
use bytes::Bytes;

use crate::relaykit::Relay;

/// Where the block is, and its size.
pub const BLOCK: u64 = 1 << 20;
pub const LEN: usize = 4096;

pub fn v1() -> Vec<u8> {
    vec![0xa1; LEN]
}

pub fn v2() -> Vec<u8> {
    vec![0xb2; LEN]
}

/// The runtime a scenario's volume runs on.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A `braid-powercut` mount under `dir` with one file of `size` bytes.
pub fn mount(dir: &Path, size: u64) -> PowerCut {
    let at = dir.join("mnt");
    std::fs::create_dir(&at).expect("a mount point");
    PowerCut::mount(&at, "lun.img", size).expect("mounting braid-powercut")
}

/// What the scenario came to.
#[derive(Debug)]
pub struct Outcome {
    pub v1: Result<(), IoError>,
    pub v2: Result<(), IoError>,
    /// The block after the delayed write landed: 1, 2, or 0 for neither.
    pub found: u8,
    /// The delayed write had landed when v1 ended (a fence that waited
    /// for it ends v1 only then).
    pub landed_first: bool,
    /// When v1 ended, and when the delayed write was seen landed, from
    /// the cut.
    pub v1_after: Duration,
    pub landed_after: Duration,
}

impl Outcome {
    /// Asserts that the fence held: both writes acknowledged, v1 re-sent
    /// only once the held write had landed, and v2 on the block (checked
    /// first: it is what a user loses);
    /// `otherwise` says what a stale v1 on the block means.
    pub fn assert_fenced(&self, otherwise: &str) {
        assert!(self.v1.is_ok() && self.v2.is_ok(), "{self:?}");
        assert_eq!(
            self.found, 2,
            "the block holds v{} after the held write landed: {otherwise} ({self:?})",
            self.found
        );
        assert!(
            self.landed_first,
            "v1 was re-sent before the held write landed (the fence did not wait for it), \
             though this time the block held v2: {self:?}"
        );
    }
}

/// Runs the scenario on `vol` (path 1 through `relay`, path 2 direct)
/// with the write held `delay` in `pc`'s backing store; every wait is
/// bounded by `limit`.
pub async fn stale_write(
    vol: &Volume,
    pc: &PowerCut,
    relay: &Relay,
    delay: Duration,
    limit: Duration,
) -> Outcome {
    vol.set_path_enabled(2, false).expect("path 2");
    pc.delay_next_write_at(BLOCK, delay);
    let v1 = vol.write(BLOCK, Bytes::from(v1()), false);
    tokio::pin!(v1);
    let begun = Instant::now();
    while pc.delayed().begun == 0 {
        assert!(
            begun.elapsed() < limit,
            "v1 never reached the backing store"
        );
        tokio::select! {
            r = &mut v1 => panic!("v1 ended before it reached the backing store: {r:?}"),
            () = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
    }
    vol.set_path_enabled(2, true).expect("path 2");
    relay.cut_and_hold();
    let cut = Instant::now();
    let mut landed_after = None;
    let v1 = loop {
        if landed_after.is_none() && pc.delayed().landed > 0 {
            landed_after = Some(cut.elapsed());
            relay.open();
        }
        tokio::select! {
            r = &mut v1 => break r,
            () = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
        assert!(cut.elapsed() < limit, "v1 did not end in {limit:?}");
    };
    let v1_after = cut.elapsed();
    let landed_first = pc.delayed().landed > 0;
    let v2 = tokio::time::timeout(limit, vol.write(BLOCK, Bytes::from(v2()), false))
        .await
        .expect("v2 ends");
    while pc.delayed().landed == 0 {
        assert!(cut.elapsed() < limit, "the delayed write never landed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    relay.open();
    let landed_after = landed_after.unwrap_or_else(|| cut.elapsed());
    Outcome {
        v1,
        v2,
        found: version(pc),
        landed_first,
        v1_after,
        landed_after,
    }
}

/// The version the block holds, read from the backing file itself.
pub fn version(pc: &PowerCut) -> u8 {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(pc.file()).expect("open the backing file");
    let mut got = vec![0; LEN];
    f.read_exact_at(&mut got, BLOCK).expect("read the block");
    if got == v1() {
        1
    } else if got == v2() {
        2
    } else {
        0
    }
}

/// The reservation keys registered for unit `lun` of `target` at
/// `portal`, read through braid's initiator by a session of another
/// initiator name.
pub async fn registered_keys(portal: std::net::SocketAddr, target: &str, lun: u16) -> Vec<u64> {
    use braid_initiator::iscsi::{open, reserve, SessionConfig};
    let cfg = SessionConfig {
        initiator: "iqn.2026-11.org.example:onlooker".into(),
        target: target.into(),
        lun,
        chap: None,
        params: braid_iscsi::negotiate::Params::default(),
        isid_random: 7,
        next_qualifier: 1.into(),
    };
    let spec = braid_initiator::discover::PathSpec {
        local: Default::default(),
        portal: braid_initiator::Endpoint::Tcp(portal),
    };
    let t = Duration::from_secs(5);
    let o = open::open(&spec, &cfg, cfg.next_isid(), t)
        .await
        .expect("a session");
    let keys = reserve::keys(&o.conn, t).await.expect("READ KEYS");
    o.conn.logout(t).await;
    keys
}
