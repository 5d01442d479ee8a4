//! The bounds a server keeps on what its clients may hold.

use std::time::Duration;

/// Bounds on what clients may hold, so that one that floods or stalls is
/// cut off without hurting the others.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The handshake must finish within this, or the connection is closed.
    pub handshake_timeout: Duration,
    /// A connection with nothing in flight that sends no request for this
    /// long is closed; `None` never closes idle connections.
    pub idle_timeout: Option<Duration>,
    /// A connection whose socket takes no byte of what waits to be sent
    /// for this long is closed: a client that never reads its replies
    /// would otherwise hold their data, and the server-wide budget with
    /// it, for as long as it stays connected. `None`: never.
    pub send_timeout: Option<Duration>,
    /// Requests in flight per connection; beyond it the reader waits.
    pub max_requests: usize,
    /// Payload bytes in flight per connection (WRITE data read, READ data
    /// not yet sent); beyond it the reader waits.
    pub max_bytes: usize,
    /// Payload bytes in flight on the whole server, across connections.
    pub max_total_bytes: usize,
    /// Connections at once, in total; more are closed at accept.
    pub max_connections: usize,
    /// Connections at once from one client address.
    pub max_connections_per_client: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: None,
            send_timeout: Some(Duration::from_secs(60)),
            max_requests: 256,
            max_bytes: 128 << 20,
            max_total_bytes: 1 << 30,
            max_connections: 1024,
            max_connections_per_client: 128,
        }
    }
}
