//! Live connections of a server: ids, figures, and fencing.
//!
//! Fencing (`x-braid:fence=<ids>`) is why this exists: before an initiator
//! re-sends the writes of a failed path, it asks the target to close that
//! path's connections and to answer only once every request they had
//! received has completed or been dropped, so no stale write can land after
//! its retry. A connection leaves the registry only when nothing of it is in
//! flight any more, so an id that is not here has nothing left to drain.
//!
//! A fence is scoped (see `braid_proto::braid_ns`): a fence may close only
//! connections of the export it was asked for that were opened with the
//! asker's session token. An id is this server's tag (64 bits, random per
//! server, new when a Ceph gateway reconnects to its cluster as a new
//! client) and 64 random bits: unguessable, and it names the server that
//! issued it, so that a gateway asked to fence another gateway's
//! connections knows whose they are (`gateway::fence`), and a server asked
//! to fence ids it never issued refuses (`lineage.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use braid_proto::braid_ns::{ConnId, SessionToken};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::hold::Hold;

/// Per-connection counters. Each moves when the reply for a request has
/// been handed to the writer (bytes counted are payload bytes).
#[derive(Debug, Default)]
pub struct ConnStats {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub read_bytes: AtomicU64,
    pub written_bytes: AtomicU64,
    /// Other commands: flush, trim, zero, cache, block status.
    pub others: AtomicU64,
    /// Requests answered with an error.
    pub errors: AtomicU64,
    /// Time from a FLUSH reaching the backend to its answer.
    pub flush_latency: crate::stats::LatencyHistogram,
}

/// One connection as the registry knows it.
#[derive(Debug)]
pub struct Conn {
    pub id: ConnId,
    pub peer: String,
    /// The client's address; `None` for unix socket clients.
    pub peer_ip: Option<std::net::IpAddr>,
    pub portal: String,
    pub export: Mutex<Option<String>>,
    /// The initiator session token it presented (`x-braid:session`).
    pub session: Mutex<Option<SessionToken>>,
    pub stats: ConnStats,
    fenced: AtomicBool,
    inflight: AtomicUsize,
    drained: Notify,
    tasks: Mutex<Vec<AbortHandle>>,
    /// Test hook: requests wait before reaching the backend while set.
    hold: Hold,
}

impl Conn {
    /// Whether a fence closed this connection: requests not yet started
    /// are dropped instead of executed.
    pub fn fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// Whether requests are being held before the backend (the test
    /// hook; always false without the `test-hooks` feature).
    pub fn held(&self) -> bool {
        self.hold.held()
    }

    /// Waits while the connection is held; returns early if it is fenced.
    pub async fn wait_unheld(&self) {
        self.hold.wait(|| self.fenced()).await;
    }

    /// Requests received and not yet finished with the backend.
    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::SeqCst)
    }

    pub fn begin(&self) {
        // Sequentially consistent with the fence's store of `fenced` and its
        // read of `inflight`: a request beginning while a fence starts then
        // either sees the fence (and is dropped) or is seen by its drain
        // (which waits for it). With acquire/release alone each side may
        // miss the other's write (store buffering), letting a stale write
        // land after the fence has answered.
        self.inflight.fetch_add(1, Ordering::SeqCst);
    }

    pub fn end(&self) {
        if self.inflight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.drained.notify_waiters();
        }
    }

    /// Registers a task to abort when the connection is fenced.
    pub fn own(&self, handle: AbortHandle) {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        if self.fenced() {
            handle.abort();
        } else {
            tasks.push(handle);
        }
    }

    /// Marks the connection fenced and stops its reader and writer:
    /// requests not yet started are dropped, nothing more is answered.
    pub fn cut(&self) {
        self.fenced.store(true, Ordering::SeqCst);
        // Held requests have not started: they are dropped now.
        self.hold.wake();
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for t in tasks {
            t.abort();
        }
    }

    /// Waits until no request is in flight.
    pub async fn drain(&self) {
        loop {
            let notified = self.drained.notified();
            if self.inflight() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// All live connections of one server.
#[derive(Debug)]
pub struct Registry {
    conns: Mutex<HashMap<ConnId, Arc<Conn>>>,
    /// Figures of connections that have left, for counters that only grow.
    pub stats: crate::stats::TargetStats,
    /// The high 64 bits of every new connection id.
    tag: AtomicU64,
    /// Tags this process issued ids under before the current one.
    past: Mutex<Vec<u64>>,
    /// This process among the servers of its state directory, which
    /// tells an earlier process's ids from a stranger's.
    lineage: std::sync::OnceLock<crate::lineage::Lineage>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    pub fn new() -> Self {
        Self {
            conns: Mutex::new(HashMap::new()),
            stats: Default::default(),
            tag: AtomicU64::new(uuid::Uuid::new_v4().as_u128() as u64),
            past: Mutex::default(),
            lineage: std::sync::OnceLock::new(),
        }
    }

    /// Issues ids under `lineage`'s tag from now on, and answers fences of
    /// earlier processes of its state directory. Call before serving.
    pub fn adopt(&self, lineage: crate::lineage::Lineage) {
        self.set_tag(lineage.tag());
        let _ = self.lineage.set(lineage);
    }

    /// The tag new connection ids carry.
    pub fn tag(&self) -> u64 {
        self.tag.load(Ordering::SeqCst)
    }

    /// Connections accepted from now on carry `tag`.
    pub fn set_tag(&self, tag: u64) {
        let old = self.tag.swap(tag, Ordering::SeqCst);
        if old != tag {
            self.past
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(old);
        }
    }

    /// Refuses unless every id of `ids` (none of them live here) was
    /// issued by this process or by an earlier one of its state directory
    /// that has stopped: only then has nothing of them anything left in
    /// flight. Another server's ids are its own to fence.
    ///
    /// # Errors
    ///
    /// Which id this server cannot answer for, and what to do.
    pub async fn vouch(self: &Arc<Self>, ids: &[ConnId]) -> Result<(), String> {
        let strangers: Vec<ConnId> = {
            let past = self.past.lock().unwrap_or_else(|p| p.into_inner());
            ids.iter()
                .filter(|id| {
                    let t = Self::tag_of(**id);
                    t != self.tag() && !past.contains(&t)
                })
                .copied()
                .collect()
        };
        if strangers.is_empty() {
            return Ok(());
        }
        let me = self.clone();
        let issuers = tokio::task::spawn_blocking(move || {
            strangers
                .into_iter()
                .map(|id| {
                    let issuer = me.lineage.get().map(|l| l.issuer(Self::tag_of(id)));
                    (id, issuer)
                })
                .collect::<Vec<_>>()
        })
        .await
        .map_err(|e| format!("checking the state directory: {e}"))?;
        use crate::lineage::Issuer;
        for (id, issuer) in issuers {
            match issuer {
                Some(Issuer::Earlier) => {}
                Some(Issuer::Running) => {
                    return Err(format!(
                        "connection {id} was not issued by this server but by another braid \
                         serve running with the same state directory; ask that server"
                    ))
                }
                Some(Issuer::Unknown) | None => {
                    return Err(format!(
                        "connection {id} was not issued by this server (nor by an earlier \
                         process with its state directory), so it cannot say whether its \
                         requests have ended; ask the server that issued it. Two braid serve \
                         processes must never serve one volume"
                    ))
                }
            }
        }
        Ok(())
    }

    /// The tag of the server that issued `id`.
    pub fn tag_of(id: ConnId) -> u64 {
        (id.0 >> 64) as u64
    }

    /// Adds a connection and returns it; remove it with [`Self::remove`].
    pub fn add(
        &self,
        peer: String,
        peer_ip: Option<std::net::IpAddr>,
        portal: String,
    ) -> Arc<Conn> {
        // 64 bits from the OS's random source under the tag: an id cannot
        // be guessed, and a collision is never seen in practice (checked
        // anyway).
        let fresh = || {
            let random = u128::from(uuid::Uuid::new_v4().as_u128() as u64);
            ConnId((u128::from(self.tag()) << 64) | random)
        };
        let mut id = fresh();
        while self.lock().contains_key(&id) {
            id = fresh();
        }
        let conn = Arc::new(Conn {
            id,
            peer,
            peer_ip,
            portal,
            export: Mutex::new(None),
            session: Mutex::new(None),
            stats: ConnStats::default(),
            fenced: AtomicBool::new(false),
            inflight: AtomicUsize::new(0),
            drained: Notify::new(),
            tasks: Mutex::new(Vec::new()),
            hold: Hold::default(),
        });
        self.lock().insert(id, conn.clone());
        conn
    }

    /// How many connections are open.
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    pub fn remove(&self, id: ConnId) {
        let gone = self.lock().remove(&id);
        if let Some(conn) = gone {
            self.stats.retire(&conn);
        }
    }

    /// A snapshot of the live connections, by id.
    pub fn list(&self) -> Vec<Arc<Conn>> {
        let mut v: Vec<Arc<Conn>> = self.lock().values().cloned().collect();
        v.sort_by_key(|c| c.id);
        v
    }

    /// Fences `ids` for a client asking over a connection to `export` with
    /// `session`: refuses, fencing nothing, unless every connection named
    /// that is still here belongs to `export` and was opened with the same
    /// session token. Returns the ids that are not here: gone (with nothing
    /// left to drain) if this server issued them, another server's if not.
    ///
    /// # Errors
    ///
    /// Why the fence was refused, for the asker.
    pub async fn fence_scoped(
        &self,
        ids: &[ConnId],
        export: &str,
        session: Option<SessionToken>,
    ) -> Result<Vec<ConnId>, String> {
        let Some(session) = session else {
            return Err(
                "a fence needs the session token of the connections it names (x-braid:session)"
                    .into(),
            );
        };
        let named: Vec<Arc<Conn>> = {
            let conns = self.lock();
            ids.iter().filter_map(|id| conns.get(id).cloned()).collect()
        };
        for c in &named {
            let theirs = *c.session.lock().unwrap_or_else(|p| p.into_inner());
            let their_export = c.export.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if theirs != Some(session) || their_export.as_deref() != Some(export) {
                return Err(format!(
                    "connection {} is not one of this session's connections to export {export:?}",
                    c.id
                ));
            }
        }
        self.fence(ids).await;
        let conns = self.lock();
        Ok(ids
            .iter()
            .filter(|id| !conns.contains_key(id))
            .copied()
            .collect())
    }

    /// Closes the connections `ids` and returns once every request they had
    /// received has completed or been dropped. Unknown ids are already
    /// gone, with nothing in flight. Unscoped: clients' fences go through
    /// [`Self::fence_scoped`].
    pub async fn fence(&self, ids: &[ConnId]) {
        let targets: Vec<Arc<Conn>> = {
            let conns = self.lock();
            ids.iter().filter_map(|id| conns.get(id).cloned()).collect()
        };
        for conn in &targets {
            conn.cut();
        }
        for conn in &targets {
            conn.drain().await;
        }
    }

    /// Closes every connection of `export` at once, answering nothing
    /// more on them, and returns how many there were; their requests
    /// drain on their own. For a server that lost the right to write
    /// (a blocklisted Ceph gateway): the clients fail over and fence.
    pub fn cut_export(&self, export: &str) -> usize {
        let targets: Vec<Arc<Conn>> = self
            .lock()
            .values()
            .filter(|c| {
                c.export
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_deref()
                    == Some(export)
            })
            .cloned()
            .collect();
        for conn in &targets {
            conn.cut();
        }
        targets.len()
    }

    /// Test hook (`test-hooks` feature): holds every request of
    /// connection `id` before it reaches the backend, as a stuck disk or a
    /// slow server would, until [`Self::release`] or a fence. Returns
    /// whether the connection exists.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn hold(&self, id: ConnId) -> bool {
        let Some(conn) = self.lock().get(&id).cloned() else {
            return false;
        };
        conn.hold.set(true);
        true
    }

    /// Lets held requests of connection `id` go on to the backend (unless
    /// a fence dropped them meanwhile).
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn release(&self, id: ConnId) {
        if let Some(conn) = self.lock().get(&id).cloned() {
            conn.hold.set(false);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ConnId, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn fence_waits_for_inflight_and_aborts_tasks() {
        let reg = Arc::new(Registry::new());
        let conn = reg.add("peer".into(), None, "portal".into());
        let reader = tokio::spawn(std::future::pending::<()>());
        conn.own(reader.abort_handle());
        conn.begin();
        let r2 = reg.clone();
        let id = conn.id;
        let fence = tokio::spawn(async move { r2.fence(&[id, ConnId(999)]).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !fence.is_finished(),
            "fence returned with a request in flight"
        );
        assert!(conn.fenced());
        assert!(reader.await.unwrap_err().is_cancelled());
        conn.end();
        tokio::time::timeout(Duration::from_secs(5), fence)
            .await
            .expect("fence finished")
            .unwrap();
    }

    #[tokio::test]
    async fn fence_wakes_held_requests_so_they_are_dropped() {
        let reg = Arc::new(Registry::new());
        let conn = reg.add("p".into(), None, "q".into());
        assert!(reg.hold(conn.id));
        conn.begin();
        let c2 = conn.clone();
        let held = tokio::spawn(async move {
            c2.wait_unheld().await;
            let dropped = c2.fenced();
            c2.end();
            dropped
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!held.is_finished());
        tokio::time::timeout(Duration::from_secs(5), reg.fence(&[conn.id]))
            .await
            .expect("fence does not wait for a held request");
        assert!(held.await.unwrap(), "held request ran after its fence");
    }

    #[tokio::test]
    async fn a_fence_closes_only_its_own_sessions_connections_of_its_export() {
        let reg = Registry::new();
        let (mine, theirs) = (SessionToken(1), SessionToken(2));
        let conn = |export: &str, session| {
            let c = reg.add("p".into(), None, "q".into());
            *c.export.lock().unwrap() = Some(export.into());
            *c.session.lock().unwrap() = Some(session);
            c
        };
        let a = conn("vol", mine);
        let b = conn("vol", theirs);
        let c = conn("other", mine);
        assert_ne!(a.id, b.id);
        for (ids, export, session) in [
            (vec![b.id], "vol", Some(mine)),
            (vec![a.id, b.id], "vol", Some(mine)),
            (vec![c.id], "vol", Some(mine)),
            (vec![a.id], "vol", None),
        ] {
            let r = reg.fence_scoped(&ids, export, session).await;
            assert!(r.is_err(), "{ids:?} {session:?}");
            assert!(!a.fenced() && !b.fenced() && !c.fenced());
        }
        let gone = reg
            .fence_scoped(&[a.id, ConnId(7)], "vol", Some(mine))
            .await
            .unwrap();
        assert_eq!(gone, vec![ConnId(7)], "the id this server does not know");
        assert!(a.fenced() && !b.fenced() && !c.fenced());
    }

    #[test]
    fn ids_carry_the_tag_of_the_server_that_issued_them() {
        let reg = Registry::new();
        let a = reg.add("p".into(), None, "q".into());
        assert_eq!(Registry::tag_of(a.id), reg.tag());
        reg.set_tag(0xfeed);
        let b = reg.add("p".into(), None, "q".into());
        assert_eq!(Registry::tag_of(b.id), 0xfeed);
        assert_ne!(a.id.0 as u64, b.id.0 as u64);
    }

    #[tokio::test]
    async fn only_ids_of_this_process_or_a_stopped_earlier_one_are_vouched_for() {
        let state = tempfile::tempdir().unwrap();
        let earlier = crate::lineage::Lineage::claim(state.path()).unwrap();
        let earlier_id = ConnId(u128::from(earlier.tag()) << 64 | 5);
        let running = crate::lineage::Lineage::claim(state.path()).unwrap();
        let running_id = ConnId(u128::from(running.tag()) << 64 | 6);
        let reg = Arc::new(Registry::new());
        let first_tag = ConnId(u128::from(reg.tag()) << 64 | 7);
        reg.adopt(crate::lineage::Lineage::claim(state.path()).unwrap());
        let own = ConnId(u128::from(reg.tag()) << 64 | 8);
        let stranger = ConnId(0x5eed << 64 | 9);
        assert!(reg.vouch(&[own, first_tag]).await.is_ok());
        let e = reg.vouch(&[own, stranger]).await.unwrap_err();
        assert!(e.contains("not issued by this server"), "{e}");
        let e = reg.vouch(&[earlier_id]).await.unwrap_err();
        assert!(e.contains("running"), "alive beside it: {e}");
        assert!(reg.vouch(&[running_id]).await.is_err());
        drop(earlier);
        assert!(
            reg.vouch(&[earlier_id]).await.is_ok(),
            "stopped: nothing left"
        );
        let alone = Arc::new(Registry::new());
        assert!(
            alone.vouch(&[stranger]).await.is_err(),
            "without a state directory only its own"
        );
    }

    #[tokio::test]
    async fn tasks_owned_after_a_fence_are_aborted_at_once() {
        let reg = Registry::new();
        let conn = reg.add("p".into(), None, "q".into());
        reg.fence(&[conn.id]).await;
        let late = tokio::spawn(std::future::pending::<()>());
        conn.own(late.abort_handle());
        assert!(late.await.unwrap_err().is_cancelled());
    }
}
