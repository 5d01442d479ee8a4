//! An iSCSI session in the server's connection registry
//! (`braid_store::registry`), so that whatever fences connections there
//! reaches it too: a Ceph gateway that finds itself blocklisted or cut
//! off from its monitors closes every connection of its images and waits
//! for them to drain before it reconnects as a new RADOS client, and one
//! asked through an image's barrier to drop connections closes those the
//! ids name and answers once they drained (`braid_gateway`).
//!
//! The registry's promise is that a connection it drained has nothing
//! left in flight. A session counts as one request in flight from its
//! login until its connection has ended and every task of it is gone
//! (waiting ones dropped, running ones finished with the backend), so a
//! drain of it waits for all of that. A fence wakes the session through a
//! task the registry aborts when it cuts the connection: the session then
//! stops taking PDUs, answers nothing more, and ends its tasks.

use std::sync::Arc;

use braid_store::registry::{Conn, Registry};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A session's place in the registry; it leaves (drained) when dropped.
#[derive(Debug)]
pub(crate) struct Member {
    pub conn: Arc<Conn>,
    registry: Arc<Registry>,
    /// Aborted by the registry when it cuts the connection.
    sentinel: JoinHandle<()>,
    cut: Option<oneshot::Receiver<()>>,
}

impl Member {
    /// Enters a session from `peer` on `portal` to `export` into
    /// `registry`, counted in flight until dropped.
    pub fn enter(
        registry: &Arc<Registry>,
        peer: std::net::SocketAddr,
        portal: String,
        export: &str,
    ) -> Self {
        let conn = registry.add(peer.to_string(), Some(peer.ip()), portal);
        *conn.export.lock().unwrap_or_else(|p| p.into_inner()) = Some(export.to_owned());
        conn.begin();
        let (tx, rx) = oneshot::channel::<()>();
        // Never ends on its own: the registry's cut aborts it, which drops
        // the sender and so wakes the session.
        let sentinel = tokio::spawn(async move {
            let _tx = tx;
            std::future::pending::<()>().await;
        });
        conn.own(sentinel.abort_handle());
        Self {
            conn,
            registry: registry.clone(),
            sentinel,
            cut: Some(rx),
        }
    }

    /// Resolves once the registry cut the connection (a fence, or the
    /// gateway lost its right to write); never again after that.
    pub async fn cut(&mut self) {
        match self.cut.as_mut() {
            Some(rx) => {
                let _ = rx.await;
                self.cut = None;
            }
            None => std::future::pending().await,
        }
    }
}

/// Resolves once the registry cut `m`'s connection; never without one.
pub(crate) async fn cut_off(m: Option<&mut Member>) {
    match m {
        Some(m) => m.cut().await,
        None => std::future::pending().await,
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.sentinel.abort();
        self.conn.end();
        self.registry.remove(self.conn.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_fence_wakes_the_session_and_waits_until_it_has_left() {
        let registry = Arc::new(Registry::new());
        let peer = "127.0.0.1:5000".parse().unwrap();
        let mut m = Member::enter(&registry, peer, "p".into(), "vol");
        assert_eq!(registry.cut_export("other"), 0);
        let id = m.conn.id;
        let r2 = registry.clone();
        let fence = tokio::spawn(async move { r2.fence(&[id]).await });
        tokio::time::timeout(Duration::from_secs(5), m.cut())
            .await
            .expect("the cut wakes the session");
        assert!(m.conn.fenced());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !fence.is_finished(),
            "the fence returned before the session ended"
        );
        drop(m);
        tokio::time::timeout(Duration::from_secs(5), fence)
            .await
            .expect("the fence ends once the session left")
            .unwrap();
        assert_eq!(registry.count(), 0);
    }

    #[tokio::test]
    async fn a_session_cut_before_it_waits_is_woken_at_once() {
        let registry = Arc::new(Registry::new());
        let peer = "127.0.0.1:5000".parse().unwrap();
        let mut m = Member::enter(&registry, peer, "p".into(), "vol");
        assert_eq!(registry.cut_export("vol"), 1);
        tokio::time::timeout(Duration::from_secs(5), m.cut())
            .await
            .expect("woken");
        assert!(m.conn.fenced());
    }
}
