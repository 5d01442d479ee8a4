//! Session reinstatement (RFC 7143 6.3.5): a login with the ISID of a
//! session that still exists (same initiator, target and portal group,
//! TSIH 0) replaces it. The old session is closed and every task it had
//! has ended before the new login completes, so none of its writes can
//! land after the new session starts: the fence an initiator needs before
//! it re-sends on another path what a dead connection may still hold.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tracing::info;

/// What names a session.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    /// iSCSI names compare without case (RFC 3722 stringprep folds it).
    pub initiator: String,
    pub isid: [u8; 6],
    pub target: String,
    pub tag: u16,
}

/// A live session: told to stop through `stop`, says it ended through
/// `ended`.
#[derive(Debug)]
struct Live {
    stop: watch::Sender<bool>,
    ended: watch::Receiver<bool>,
    id: u64,
}

/// Every normal session of the server.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    live: Mutex<HashMap<Key, Live>>,
    next: std::sync::atomic::AtomicU64,
}

/// A session's place in the table; when dropped (the session has ended,
/// tasks and all), whoever reinstates it may go on.
#[derive(Debug)]
pub(crate) struct Registration {
    sessions: Arc<Sessions>,
    key: Key,
    id: u64,
    pub stop: watch::Receiver<bool>,
    ended: watch::Sender<bool>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut live = self.sessions.lock();
        if live.get(&self.key).is_some_and(|l| l.id == self.id) {
            live.remove(&self.key);
        }
        drop(live);
        let _ = self.ended.send(true);
    }
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Live>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enters a new session under `key`. An older one under the same key
    /// is told to stop first, and this returns only once it has ended.
    pub async fn enter(self: &Arc<Self>, mut key: Key) -> Registration {
        key.initiator = key.initiator.to_lowercase();
        key.target = key.target.to_lowercase();
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (stop_tx, stop_rx) = watch::channel(false);
        let (ended_tx, ended_rx) = watch::channel(false);
        loop {
            let old = {
                let mut live = self.lock();
                match live.get(&key) {
                    Some(old) => {
                        let _ = old.stop.send(true);
                        old.ended.clone()
                    }
                    None => {
                        live.insert(
                            key.clone(),
                            Live {
                                stop: stop_tx,
                                ended: ended_rx,
                                id,
                            },
                        );
                        break;
                    }
                }
            };
            info!(initiator = %key.initiator, "session reinstatement: ending the old session first");
            let mut old = old;
            let _ = old.wait_for(|e| *e).await;
            // Its registration is gone from the table once it has ended;
            // look again (another login may have come in between).
        }
        Registration {
            sessions: self.clone(),
            key,
            id,
            stop: stop_rx,
            ended: ended_tx,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(isid: u8) -> Key {
        Key {
            initiator: "iqn.2026-11.org.example:Host".into(),
            isid: [0x80, 0, 0, 0, 0, isid],
            target: "iqn.2026-11.org.braid-storage:vol".into(),
            tag: 1,
        }
    }

    #[tokio::test]
    async fn a_login_with_the_same_isid_waits_until_the_old_session_ended() {
        let s = Arc::new(Sessions::default());
        let mut first = s.enter(key(1)).await;
        let other = s.enter(key(2)).await;
        assert!(!*other.stop.borrow(), "another ISID is another session");
        let mut k = key(1);
        k.initiator = k.initiator.to_uppercase();
        let s2 = s.clone();
        let second = tokio::spawn(async move { s2.enter(k).await });
        first.stop.wait_for(|s| *s).await.unwrap();
        tokio::task::yield_now().await;
        assert!(!second.is_finished(), "not before the old one has ended");
        drop(first);
        let second = second.await.unwrap();
        assert!(!*second.stop.borrow());
    }
}
