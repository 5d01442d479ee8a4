//! The daemons' HTTP listener (`--http`, `--http-token`): the console and
//! the Prometheus scrape of `braid-console`, fed from what `braid serve`
//! and `braid attach` already know (their control socket's status, their
//! metrics, their volumes' timelines), its actions carried out by the
//! control socket's own handler.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Context, Result};
use braid_console::{EventView, Source};
use tokio::sync::broadcast;
use tracing::{info, warn};

use crate::cli::UsageError;
use crate::control;
use crate::ctl::{Ack, Request};

/// `--http` and `--http-token`, checked.
#[derive(Clone, Debug)]
pub struct Http {
    pub addr: SocketAddr,
    pub token: Option<String>,
}

/// Reads the flags (or their TOML keys); `None` when no listener is asked.
///
/// # Errors
///
/// A malformed address, a token file that cannot be read or is empty, or
/// a token without a listener.
pub fn settings(addr: Option<&str>, token: Option<&Path>) -> Result<Option<Http>> {
    let Some(addr) = addr else {
        if let Some(t) = token {
            return Err(UsageError(format!(
                "--http-token {}: without --http there is no console to guard; add --http ADDR:PORT",
                t.display()
            ))
            .into());
        }
        return Ok(None);
    };
    let addr: SocketAddr = addr.parse().map_err(|_| {
        UsageError(format!(
            "--http {addr:?}: expected ADDR:PORT, e.g. 127.0.0.1:9810"
        ))
    })?;
    let token = token.map(read_token).transpose()?;
    Ok(Some(Http { addr, token }))
}

/// The token: the file's first line, at least 16 characters.
fn read_token(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the console token {}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_owned();
    if token.len() < 16 {
        return Err(UsageError(format!(
            "{}: the token must be at least 16 characters on its first line (e.g. `openssl rand \
             -hex 16 > {}`)",
            path.display(),
            path.display()
        ))
        .into());
    }
    if let Ok(meta) = std::fs::metadata(path) {
        use std::os::unix::fs::PermissionsExt;
        if meta.permissions().mode() & 0o077 != 0 {
            warn!(
                "{} can be read by other users; chmod 600 it",
                path.display()
            );
        }
    }
    Ok(token)
}

/// Starts the listener with `source`; timeline events come from `events`.
///
/// # Errors
///
/// The address cannot be bound.
pub async fn start(
    http: &Http,
    tls: Option<Arc<rustls::ServerConfig>>,
    source: Arc<dyn Source>,
    events: broadcast::Sender<EventView>,
) -> Result<()> {
    let tls = tls.map(|c| {
        // Browsers ask for h2 first; this listener speaks HTTP/1.1.
        let mut c = (*c).clone();
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(c)
    });
    let settings = braid_console::Settings {
        addr: http.addr,
        token: http.token.clone(),
        tls,
        events,
    };
    let l = braid_console::listen(settings, source).await?;
    let scheme = if l.tls { "https" } else { "http" };
    info!(
        "console on {scheme}://{}/ and metrics on {scheme}://{}/metrics",
        l.addr, l.addr
    );
    match (&http.token, l.addr.ip().is_loopback()) {
        (None, true) => {
            info!("console actions are off (start with --http-token FILE to allow them)")
        }
        (None, false) => warn!(
            "--http {} is not a loopback address and there is no --http-token: the console's \
             pages are refused to every client (metrics are still served); give a token file",
            l.addr
        ),
        (Some(_), _) => {
            info!("console actions allowed with the token (X-Braid-Token header); each is logged")
        }
    }
    Ok(())
}

/// A volume's or the server's event as the console shows it.
pub fn event_view(scope: &str, ev: &braid_initiator::TimelineEvent) -> EventView {
    EventView {
        scope: scope.to_owned(),
        seq: ev.seq,
        at_ms: ev
            .at
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64,
        kind: ev.kind.name().to_owned(),
        path: ev.path,
        text: ev.text.clone(),
        took_ms: ev.took.map(|d: Duration| d.as_millis() as u64),
    }
}

/// Carries out an action through the control socket's `handler`, exactly
/// as `braid policy`, `braid path` and `braid alua` do.
pub fn act(handler: &control::Handler, req: Request, done: String) -> Result<String, String> {
    let answer = handler(req);
    match serde_json::from_value::<Ack>(answer) {
        Ok(a) if a.ok => Ok(a.config.map_or(done, |c| format!("set: {c}"))),
        Ok(a) => Err(a.error.unwrap_or_else(|| "refused".into())),
        Err(e) => Err(format!("unexpected answer: {e}")),
    }
}
