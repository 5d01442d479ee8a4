//! The control socket of a running `braid serve` or `braid attach`: one
//! JSON request per line, one JSON answer per line. `braid status`,
//! `braid policy` and `braid path` are its clients.
//!
//! Sockets live in one directory (`/run/braid/ctl` for root, else under
//! `$XDG_RUNTIME_DIR`), named `<role>-<pid>.sock`, so the clients find
//! every running braid without being told where.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, warn};

use crate::ctl::{Ack, Request, Status};

/// Where control sockets are kept.
pub fn dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/run/braid/ctl");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("braid/ctl"),
        None => std::env::temp_dir().join(format!("braid-{}/ctl", unsafe { libc::geteuid() })),
    }
}

/// The default socket of this process in `role` (`serve`, `attach`).
pub fn default_path(role: &str) -> PathBuf {
    dir().join(format!("{role}-{}.sock", std::process::id()))
}

/// Answers one request (with a [`crate::ctl`] answer, as JSON).
pub type Handler = Arc<dyn Fn(Request) -> Value + Send + Sync>;

/// A bound control socket, removed when dropped.
pub struct ControlSocket {
    path: PathBuf,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds the control socket at `path` and serves it until the task ends.
///
/// # Errors
///
/// The directory cannot be made or the socket cannot be bound.
pub fn serve(path: &Path, handler: Handler) -> Result<ControlSocket> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)
        .with_context(|| format!("binding the control socket {}", path.display()))?;
    set_mode(path, 0o600);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                if let Err(e) = answer(stream, handler).await {
                    debug!("control client: {e}");
                }
            });
        }
    });
    Ok(ControlSocket {
        path: path.to_owned(),
    })
}

pub fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        warn!("cannot set permissions of {}: {e}", path.display());
    }
}

async fn answer(stream: UnixStream, handler: Handler) -> std::io::Result<()> {
    let (rd, mut wr) = stream.into_split();
    let mut lines = BufReader::new(rd.take(1 << 20)).lines();
    while let Some(line) = lines.next_line().await? {
        let reply = match serde_json::from_str::<Request>(&line) {
            Ok(req) => handler(req),
            Err(e) => {
                serde_json::to_value(Ack::refused(format!("bad request: {e}"))).unwrap_or_default()
            }
        };
        let mut out = serde_json::to_vec(&reply).unwrap_or_default();
        out.push(b'\n');
        wr.write_all(&out).await?;
    }
    Ok(())
}

use tokio::io::AsyncReadExt as _;

/// Sends one request to the socket at `path` and returns the answer.
///
/// # Errors
///
/// Cannot connect (the process is gone), or the answer is not the
/// expected one.
pub async fn request<T: DeserializeOwned>(path: &Path, req: &Request) -> Result<T> {
    let run = async {
        let mut s = UnixStream::connect(path).await?;
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        s.write_all(&line).await?;
        let mut rd = BufReader::new(s);
        let mut answer = String::new();
        rd.read_line(&mut answer).await?;
        Ok::<T, anyhow::Error>(serde_json::from_str(&answer)?)
    };
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .with_context(|| format!("{}: no answer within 5 s", path.display()))?
        .with_context(|| format!("asking {}", path.display()))
}

/// Every control socket in the directory that answers; stale ones (of
/// processes that are gone) are removed.
pub async fn discover() -> Vec<(PathBuf, Status)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir()) else {
        return out;
    };
    let mut paths: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "sock"))
        .collect();
    paths.sort();
    for p in paths {
        match request::<Status>(&p, &Request::Status).await {
            Ok(v) => out.push((p, v)),
            Err(_) => {
                if UnixStream::connect(&p).await.is_err() {
                    let _ = std::fs::remove_file(&p);
                }
            }
        }
    }
    out
}

/// The control socket of the process that has `volume` attached.
///
/// # Errors
///
/// No running attach has it, or several do.
pub async fn find_volume(volume: &str) -> Result<PathBuf> {
    let mut found = Vec::new();
    for (path, status) in discover().await {
        let has = matches!(&status, Status::Attach { volumes, .. }
            if volumes.iter().any(|v| v.name == volume));
        if has {
            found.push(path);
        }
    }
    match found.len() {
        0 => bail!(
            "no running braid attach has a volume named {volume:?}; `braid status` lists what is attached"
        ),
        1 => Ok(found.remove(0)),
        _ => bail!("several processes have a volume named {volume:?}: {found:?}"),
    }
}

/// The control socket of the serve that has iSCSI portal `portal`.
///
/// # Errors
///
/// No running serve has it.
pub async fn find_iscsi_portal(portal: &str) -> Result<PathBuf> {
    let mut known = Vec::new();
    for (path, status) in discover().await {
        if let Status::Serve {
            front_ends:
                crate::ctl::FrontEndStatus {
                    iscsi: Some(iscsi), ..
                },
            ..
        } = &status
        {
            for p in &iscsi.portals {
                if p.portal == portal {
                    return Ok(path);
                }
                known.push(p.portal.clone());
            }
        }
    }
    if known.is_empty() {
        bail!("no running braid serve has iSCSI portals (braid serve --iscsi starts them)");
    }
    bail!(
        "no running braid serve has iSCSI portal {portal}; the portals are {}",
        known.join(", ")
    )
}
