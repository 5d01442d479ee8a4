//! The signals that stop `braid serve` and `braid attach` cleanly, and
//! SIGHUP, which asks `braid attach` to re-read its configuration.

use anyhow::{Context, Result};
use tracing::info;

/// SIGINT and SIGTERM, caught from the moment this is made: install it
/// before anything that takes time, so an early signal still stops braid
/// cleanly instead of killing it.
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

/// What a signal asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT or SIGTERM, named.
    Stop(&'static str),
    /// SIGHUP.
    Reload,
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
            hup: signal(SignalKind::hangup()).context("catching SIGHUP")?,
        })
    }

    /// The next signal.
    pub async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::Stop("SIGINT"),
            _ = self.term.recv() => Signal::Stop("SIGTERM"),
            _ = self.hup.recv() => Signal::Reload,
        }
    }

    /// Waits for SIGINT or SIGTERM, then stops `stop` (before logging, so
    /// a logging failure cannot keep braid running). SIGHUP, which would
    /// otherwise end the process, only says that nothing reloads here.
    pub async fn stop_on_signal(mut self, stop: braid_nbd_target::StopHandle) {
        let which = loop {
            match self.next().await {
                Signal::Stop(which) => break which,
                Signal::Reload => info!(
                    "SIGHUP: braid serve does not re-read its configuration; restart it to \
                     apply changes"
                ),
            }
        };
        stop.stop();
        crate::notify::stopping();
        info!("{which}: stopping");
    }
}
