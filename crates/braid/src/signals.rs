//! The signals that stop `braid serve` and `braid attach` cleanly.

use anyhow::{Context, Result};
use tracing::info;

/// SIGINT and SIGTERM, caught from the moment this is made: install it
/// before anything that takes time, so an early signal still stops braid
/// cleanly instead of killing it.
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    /// # Errors
    ///
    /// The handlers cannot be installed.
    pub fn install() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            int: signal(SignalKind::interrupt()).context("catching SIGINT")?,
            term: signal(SignalKind::terminate()).context("catching SIGTERM")?,
        })
    }

    /// Waits for either signal, then stops `stop` (before logging, so a
    /// logging failure cannot keep braid running).
    pub async fn stop_on_signal(mut self, stop: braid_target::StopHandle) {
        let which = tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
        };
        stop.stop();
        crate::notify::stopping();
        info!("{which}: stopping");
    }
}
