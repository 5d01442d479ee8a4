//! braid's HTTP listener: one per daemon, for the live console (`/`), its
//! push stream (`/events`, server-sent events), guarded actions
//! (`/api/action`), a JSON snapshot (`/api/snapshot`) and the Prometheus
//! scrape (`/metrics`), over hyper, with TLS when the daemon has a
//! certificate.
//!
//! It knows nothing of initiators or targets: the daemon hands it a
//! [`Source`] that fills the typed [`model`] from what it already has,
//! and a broadcast of timeline events to push as they happen. Pages are
//! rendered here, on the server, for the first paint and for every update
//! alike; the page's script only swaps the parts and feeds the charts
//! (uPlot, vendored under `assets/` with its licence).

mod attach;
mod doctor;
mod fmt;
mod guard;
mod http;
pub mod model;
mod page;
mod serve;

use std::net::SocketAddr;
use std::sync::Arc;

pub use doctor::doctor_page;
pub use guard::{Denied, Guard, TOKEN_HEADER};
pub use http::{listen, Listening};
pub use model::{Action, EventView, Snapshot};
pub use page::KINDS;

/// Where the console's figures come from, and where its actions go.
pub trait Source: Send + Sync + 'static {
    /// The daemon now.
    fn snapshot(&self) -> Snapshot;
    /// The Prometheus scrape, in the OpenMetrics text format.
    ///
    /// # Errors
    ///
    /// The figures could not be encoded.
    fn metrics(&self) -> Result<String, String>;
    /// Carries out an operator's action (the same code as the command
    /// line's); `Ok` says what was done.
    ///
    /// # Errors
    ///
    /// Why it was refused, for the operator.
    fn act(&self, action: &Action) -> Result<String, String>;
}

/// How the listener is set up.
pub struct Settings {
    pub addr: SocketAddr,
    /// The token of `--http-token`: actions are off without it, and on a
    /// non-loopback address it also guards reading.
    pub token: Option<String>,
    /// Serve HTTPS with this configuration.
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    /// Timeline events as they happen, pushed at once to every open page.
    pub events: tokio::sync::broadcast::Sender<EventView>,
}

/// Why the listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding the HTTP address {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The whole page for `snap`.
pub fn render(snap: &Snapshot, actions: bool) -> String {
    match snap {
        Snapshot::Attach(v) => page::shell(
            "braid attach",
            "attach",
            Some(v.pid),
            actions,
            &attach::layout(v),
            &attach::body(v, actions),
        ),
        Snapshot::Serve(v) => page::shell(
            "braid serve",
            "serve",
            Some(v.pid),
            actions,
            &serve::layout(v),
            &serve::body(v, actions),
        ),
    }
}

/// What one push carries for `snap`, as JSON.
pub fn update(snap: &Snapshot, actions: bool) -> String {
    let (layout, parts) = match snap {
        Snapshot::Attach(v) => (attach::layout(v), attach::parts(v, actions)),
        Snapshot::Serve(v) => (serve::layout(v), serve::parts(v, actions)),
    };
    let u = page::Update {
        layout,
        snapshot: snap,
        parts,
    };
    serde_json::to_string(&u).unwrap_or_default()
}

/// The page's assets, embedded: (path, content type, bytes).
pub const ASSETS: &[(&str, &str, &str)] = &[
    (
        "/assets/console.css",
        "text/css; charset=utf-8",
        include_str!("../assets/console.css"),
    ),
    (
        "/assets/console.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/console.js"),
    ),
    (
        "/assets/uPlot.iife.min.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/uPlot.iife.min.js"),
    ),
    (
        "/assets/uPlot.min.css",
        "text/css; charset=utf-8",
        include_str!("../assets/uPlot.min.css"),
    ),
    (
        "/assets/uPlot.LICENSE",
        "text/plain; charset=utf-8",
        include_str!("../assets/uPlot.LICENSE"),
    ),
];
