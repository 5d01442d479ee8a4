//! The gateway registry: the record each gateway of an image keeps in the
//! image's metadata (`rbd image-meta list` shows them), and which records
//! are alive.
//!
//! A gateway writes its record under `braid.gateway.<tag>` before it
//! accepts a connection and removes it when it stops cleanly, after every
//! connection drained: the image's metadata changes only when a gateway
//! joins or leaves, as librbd announces every change of it to every client
//! of the image and waits up to 5 s for their answers. Between the two it
//! renews its lease with a heartbeat (a growing number, under the same key)
//! in the map of the image's barrier object (`barrier.rs`), every third of
//! its lease: one small write to one object, noticed by nobody. Another
//! gateway judges a record by its own monotonic clock: alive while its
//! heartbeat (or the record's own `seq`, which older versions renewed)
//! changed within the record's lease, expired after; so no two hosts'
//! clocks need to agree. An expired record is not forgotten:
//! its gateway may only be stalled, with writes still inside it, so a
//! surviving gateway blocklists the record's RADOS address before removing
//! it (`fence.rs`). A record that is gone therefore names a gateway that
//! either stopped cleanly or was fenced.
//!
//! A record names the image it belongs to (the cluster's fsid, the pool's
//! id, the RADOS namespace and the image's id): `rbd clone`, `rbd cp`, `rbd deep cp`, migration
//! and `rbd export --export-format 2` copy an image's metadata, records
//! included, and a copied record names a gateway of another image, which
//! this image's gateways must never fence. Such a record is foreign: it is
//! ignored, and removed by a gateway that writes the image.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Metadata keys of gateway records start with this.
pub const PREFIX: &str = "braid.gateway.";

/// The record format this version writes.
pub const VERSION: u32 = 2;

/// The image a record belongs to: ids that a copy of the image does not
/// keep (a clone or copy gets a new image id; another cluster, another
/// fsid) and that a rename keeps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scope {
    pub fsid: String,
    pub pool: i64,
    /// The RADOS namespace (empty: the pool's default one, which records
    /// written before namespaces were served leave out).
    #[serde(default)]
    pub namespace: String,
    pub image: String,
}

/// One gateway's record (JSON in the image's metadata).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Format version ([`VERSION`]).
    pub v: u32,
    /// The image whose gateway wrote it.
    pub scope: Scope,
    /// The gateway process's tag: the high 64 bits of the connection ids
    /// it issues.
    pub tag: u64,
    /// The tag of the image's RADOS client that wrote it (each image of a
    /// gateway has its own, a new one after a blocklist): the record's key.
    /// 0 in records of versions with one client per process, keyed by
    /// `tag`.
    #[serde(default)]
    pub client: u64,
    /// Its RADOS client's address, as `ceph osd blocklist add` takes it.
    pub addr: String,
    /// Its RADOS client's global id (`client.<gid>`).
    pub gid: u64,
    /// Where clients reach it (`x-braid:portal`).
    pub portals: Vec<String>,
    /// Its iSCSI portals with their portal group tags, for every
    /// gateway's SendTargets (none in records of gateways without iSCSI,
    /// or written before they were published).
    #[serde(default)]
    pub iscsi: Vec<(String, u16)>,
    /// How long the record stays alive without a renewal.
    pub lease_ms: u64,
    /// Grows with every rewrite of the record (renewals are heartbeats).
    pub seq: u64,
    /// The gateway serves the image alone: no other gateway may join it
    /// (it cannot blocklist, or it caches writes).
    pub alone: bool,
    /// For people reading `rbd image-meta list`.
    pub host: String,
    pub pid: u32,
}

/// The metadata key of the record of the client with `tag`.
pub fn key(tag: u64) -> String {
    format!("{PREFIX}{tag:016x}")
}

impl Entry {
    /// Parses a record; `None` for one this version cannot read.
    pub fn parse(value: &str) -> Option<Self> {
        serde_json::from_str::<Entry>(value)
            .ok()
            .filter(|e| e.v == VERSION)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a record always serialises")
    }

    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }

    /// The metadata key it is kept under.
    pub fn key(&self) -> String {
        key(if self.client != 0 {
            self.client
        } else {
            self.tag
        })
    }
}

/// What the registry says now, as one gateway sees it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Other gateways' records that are alive.
    pub live: Vec<Entry>,
    /// Records whose lease ran out: their gateways must be fenced before
    /// the record goes.
    pub expired: Vec<Entry>,
    /// Keys whose value this version cannot read.
    pub unreadable: Vec<String>,
    /// Keys of records that belong to another image (copied with the
    /// metadata): never fenced, to be removed.
    pub foreign: Vec<String>,
    /// What showed each record (alive or expired) renewed, by tag: a
    /// change between two views is a renewal.
    pub marks: HashMap<u64, Mark>,
}

/// The heartbeats in the barrier object's map, by record key: the key's
/// value is a number that grows with each renewal (unreadable ones are
/// left out, as if never renewed).
pub fn heartbeats(listed: &[(String, Vec<u8>)]) -> HashMap<String, u64> {
    listed
        .iter()
        .filter(|(k, _)| k.starts_with(PREFIX))
        .filter_map(|(k, v)| {
            let n = std::str::from_utf8(v).ok()?.parse().ok()?;
            Some((k.clone(), n))
        })
        .collect()
}

/// What shows a record renewed: its own `seq` and its heartbeat.
pub type Mark = (u64, Option<u64>);

/// When this gateway last saw each record renewed, by its own clock.
///
/// Only time during which this gateway was looking counts against a
/// record: a gateway looks every third of its lease, and a gap between two
/// looks longer than half a record's lease is a stall of this gateway or
/// of the whole cluster (`ceph osd pause`), during which no record could
/// be renewed, nor seen renewed. Such a gap, past that half, is not
/// counted, so a stall that ends does not make every other gateway look
/// dead at the first look after it.
#[derive(Debug, Default)]
pub struct Observed {
    seen: HashMap<String, (Mark, Duration)>,
    /// When the previous look was taken.
    last: Option<Duration>,
}

impl Observed {
    /// Takes the registry of the image `scope` as listed at `now` (this
    /// gateway's monotonic clock), with the heartbeats read after it, and
    /// sorts the records other than `own`.
    pub fn update(
        &mut self,
        now: Duration,
        own: &str,
        scope: &Scope,
        listed: &[(String, String)],
        beats: &HashMap<String, u64>,
    ) -> View {
        let mut view = View::default();
        let mut still = HashMap::new();
        let gap = self.last.map_or(Duration::ZERO, |l| now.saturating_sub(l));
        self.last = Some(now);
        for (k, v) in listed {
            if k == own || !k.starts_with(PREFIX) {
                continue;
            }
            let Some(entry) = Entry::parse(v) else {
                view.unreadable.push(k.clone());
                continue;
            };
            if entry.scope != *scope {
                view.foreign.push(k.clone());
                continue;
            }
            let mark = (entry.seq, beats.get(k).copied());
            let unseen = gap.saturating_sub(entry.lease() / 2);
            let since = match self.seen.get(k) {
                Some(&(seen, since)) if seen == mark => (since + unseen).min(now),
                _ => now,
            };
            still.insert(k.clone(), (mark, since));
            view.marks.insert(entry.tag, mark);
            if now.saturating_sub(since) < entry.lease() {
                view.live.push(entry);
            } else {
                view.expired.push(entry);
            }
        }
        // Records that are gone are forgotten: one that came back would be
        // a new incarnation anyway.
        self.seen = still;
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope() -> Scope {
        Scope {
            fsid: "f".into(),
            pool: 1,
            namespace: String::new(),
            image: "abc".into(),
        }
    }

    fn entry(tag: u64, seq: u64, lease_ms: u64) -> (String, String) {
        let e = Entry {
            v: VERSION,
            scope: scope(),
            tag,
            client: 0,
            addr: format!("127.0.0.1:0/{tag}"),
            gid: tag + 4000,
            portals: vec![format!("127.0.0.1:{}", 10000 + tag)],
            iscsi: Vec::new(),
            lease_ms,
            seq,
            alone: false,
            host: "h".into(),
            pid: 1,
        };
        (key(tag), e.to_json())
    }

    const S: Duration = Duration::from_secs(1);

    fn none() -> HashMap<String, u64> {
        HashMap::new()
    }

    /// Gateway 2's heartbeat, as gateway 1 sees it.
    fn beat(n: u64) -> HashMap<String, u64> {
        HashMap::from([(key(2), n)])
    }

    /// Gateway 1 has seen gateway 2's record (lease 3 s) and its first
    /// heartbeat at 0 s.
    fn beating() -> (Observed, String, [(String, String); 1]) {
        let mut o = Observed::default();
        let (own, record) = (key(1), [entry(2, 1, 3000)]);
        let v = o.update(Duration::ZERO, &own, &scope(), &record, &beat(1));
        assert_eq!(v.live.len(), 1);
        (o, own, record)
    }

    #[test]
    fn a_record_lives_while_its_heartbeat_grows_though_the_record_stays_as_written() {
        let (mut o, own, record) = beating();
        // Beats at 2 s and 4 s: alive until 7 s by this clock (which
        // looks every second, as a gateway looks every third of its lease).
        for (at, n) in [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 3)] {
            let v = o.update(at * S, &own, &scope(), &record, &beat(n));
            assert_eq!(v.live.len(), 1, "at {at} s");
        }
        let v = o.update(7 * S, &own, &scope(), &record, &beat(3));
        assert!(v.live.is_empty());
        assert_eq!(v.expired[0].tag, 2);
        assert_eq!(v.marks[&2], (1, Some(3)), "what a joining gateway compares");
        // A heartbeat that is gone is a change too (its gateway rewrote
        // it, or a fence removed it): a whole lease from then.
        assert_eq!(
            o.update(8 * S, &own, &scope(), &record, &none()).live.len(),
            1
        );
        for at in [9 * S, 10 * S] {
            assert_eq!(o.update(at, &own, &scope(), &record, &none()).live.len(), 1);
        }
        assert_eq!(
            o.update(11 * S, &own, &scope(), &record, &none())
                .expired
                .len(),
            1
        );
    }

    #[test]
    fn a_stall_between_two_looks_does_not_count_against_a_record() {
        let (mut o, own, record) = beating();
        assert_eq!(o.update(S, &own, &scope(), &record, &beat(2)).live.len(), 1);
        // Nothing could be looked at for 40 s (the OSDs paused), and the
        // first look after shows the heartbeat as it was.
        let v = o.update(41 * S, &own, &scope(), &record, &beat(2));
        assert_eq!(
            v.live.len(),
            1,
            "a stall is no failure of the other gateway"
        );
        // Looked at again and again, still unrenewed: it expires a lease
        // of looking later.
        let mut at = 41_000;
        let mut expired_at = None;
        while expired_at.is_none() && at < 60_000 {
            at += 1000;
            let v = o.update(Duration::from_millis(at), &own, &scope(), &record, &beat(2));
            if !v.expired.is_empty() {
                expired_at = Some(at);
            }
        }
        let expired_at = expired_at.expect("it expires");
        assert!((42_000..=45_000).contains(&expired_at), "{expired_at}");
    }

    #[test]
    fn heartbeats_are_numbers_under_record_keys() {
        let listed = [
            (key(1), b"17".to_vec()),
            (key(2), b"not a number".to_vec()),
            ("other".to_owned(), b"3".to_vec()),
        ];
        assert_eq!(heartbeats(&listed), HashMap::from([(key(1), 17)]));
    }

    #[test]
    fn a_record_lives_while_it_is_renewed_and_expires_when_it_is_not() {
        let mut o = Observed::default();
        let own = key(1);
        let v = o.update(
            Duration::ZERO,
            &own,
            &scope(),
            &[entry(1, 1, 3000), entry(2, 1, 3000)],
            &none(),
        );
        assert_eq!(v.live.len(), 1, "its own record is not listed");
        assert_eq!(v.live[0].tag, 2);
        // Unchanged for less than the lease: alive (looked at every
        // second, as a gateway looks every third of its lease).
        for at in [S, 2 * S] {
            assert_eq!(
                o.update(at, &own, &scope(), &[entry(2, 1, 3000)], &none())
                    .live
                    .len(),
                1
            );
        }
        // Renewed at 2.5 s: alive until 5.5 s by this clock.
        let renewed = Duration::from_millis(2500);
        assert_eq!(
            o.update(renewed, &own, &scope(), &[entry(2, 2, 3000)], &none())
                .live
                .len(),
            1
        );
        for at in [4 * S, 5 * S] {
            assert_eq!(
                o.update(at, &own, &scope(), &[entry(2, 2, 3000)], &none())
                    .live
                    .len(),
                1
            );
        }
        let v = o.update(6 * S, &own, &scope(), &[entry(2, 2, 3000)], &none());
        assert!(v.live.is_empty());
        assert_eq!(v.expired[0].tag, 2, "an expired record is kept for fencing");
    }

    #[test]
    fn a_record_first_seen_late_gets_a_whole_lease_from_then() {
        let mut o = Observed::default();
        // Whatever its age by its writer's clock: unknown here.
        let v = o.update(100 * S, &key(9), &scope(), &[entry(3, 77, 1000)], &none());
        assert_eq!(v.live.len(), 1);
        let half = Duration::from_millis(100_500);
        let v = o.update(half, &key(9), &scope(), &[entry(3, 77, 1000)], &none());
        assert_eq!(v.live.len(), 1);
        let v = o.update(
            Duration::from_millis(101_000),
            &key(9),
            &scope(),
            &[entry(3, 77, 1000)],
            &none(),
        );
        assert_eq!(v.expired.len(), 1);
    }

    #[test]
    fn removed_records_are_forgotten_and_foreign_values_set_aside() {
        let mut o = Observed::default();
        o.update(
            Duration::ZERO,
            &key(9),
            &scope(),
            &[entry(4, 1, 1000)],
            &none(),
        );
        assert!(o.update(S, &key(9), &scope(), &[], &none()).live.is_empty());
        assert!(o.seen.is_empty());
        let listed = [
            (key(5), "not json".to_owned()),
            ("braid.other".to_owned(), "x".to_owned()),
            ("conf_rbd_cache".to_owned(), "false".to_owned()),
        ];
        let v = o.update(2 * S, &key(9), &scope(), &listed, &none());
        assert_eq!(v.unreadable, vec![key(5)]);
        assert!(v.live.is_empty() && v.expired.is_empty());
    }

    #[test]
    fn records_copied_from_another_image_are_foreign_never_live_or_expired() {
        let mut o = Observed::default();
        let (k, v) = entry(6, 1, 1000);
        let copied_to = |f: &str, pool: i64, image: &str| Scope {
            fsid: f.into(),
            pool,
            namespace: String::new(),
            image: image.into(),
        };
        let mut other_namespace = scope();
        other_namespace.namespace = "tenant".into();
        // A clone or copy (new image id), another pool, another cluster,
        // another namespace.
        for other in [
            copied_to("f", 1, "def"),
            copied_to("f", 2, "abc"),
            copied_to("g", 1, "abc"),
            other_namespace,
        ] {
            for now in [Duration::ZERO, 100 * S] {
                let view = o.update(now, &key(9), &other, &[(k.clone(), v.clone())], &none());
                assert_eq!(view.foreign, vec![k.clone()]);
                assert!(view.live.is_empty() && view.expired.is_empty());
            }
        }
        assert_eq!(
            o.update(Duration::ZERO, &key(9), &scope(), &[(k, v)], &none())
                .live
                .len(),
            1
        );
    }

    #[test]
    fn records_round_trip_and_keys_name_the_tag() {
        let (k, v) = entry(0xab, 5, 1500);
        assert_eq!(k, "braid.gateway.00000000000000ab");
        let e = Entry::parse(&v).unwrap();
        assert_eq!(
            (e.tag, e.seq, e.lease()),
            (0xab, 5, Duration::from_millis(1500))
        );
        let without_namespace = v.replace("\"namespace\":\"\",", "");
        assert_ne!(without_namespace, v);
        assert_eq!(
            Entry::parse(&without_namespace),
            Some(e.clone()),
            "a record written before namespaces is in the default one"
        );
        let newer = v.replace("\"v\":2", "\"v\":3");
        assert_eq!(
            Entry::parse(&newer),
            None,
            "a newer format is not guessed at"
        );
    }
}
