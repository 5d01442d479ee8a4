//! A logical unit's write cache setting (the caching mode page's WCE),
//! and keeping an initiator's choice of it across restarts.
//!
//! Off by default: VMware ESXi never sends SYNCHRONIZE CACHE, so with a
//! cache a power cut would take writes it was told were done. Off, every
//! write reaches stable storage before GOOD. The operator turns it on per
//! export for initiators that flush (Linux, Windows), and an initiator may
//! turn it on or off with MODE SELECT, as Windows' "write caching" switch
//! does. That choice is kept in the state directory under the volume's
//! identity, written durably (synced, renamed, directory synced) on a
//! blocking thread before MODE SELECT is answered. It also records the
//! operator's setting it was made under: once the operator changes that,
//! the newer word is the operator's.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// One unit's write cache.
#[derive(Debug)]
pub(crate) struct WriteCache {
    on: AtomicBool,
    /// The operator's setting (`--iscsi-write-cache`).
    default: bool,
    /// Where an initiator's choice is kept; `None`: in memory only.
    file: Option<PathBuf>,
    /// One change at a time, so the file and the setting agree.
    changing: tokio::sync::Mutex<()>,
}

/// Where the setting came from, for the log at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The operator's setting (or the default, off).
    Operator,
    /// An initiator's MODE SELECT, kept from an earlier run.
    Initiator,
}

impl WriteCache {
    /// The setting for a unit whose operator setting is `default`, with an
    /// initiator's earlier choice read from `file` when it was made under
    /// the same operator setting.
    ///
    /// # Errors
    ///
    /// The file could not be read, or is not what braid writes.
    pub fn load(file: Option<PathBuf>, default: bool) -> io::Result<(Self, Origin)> {
        let saved = match &file {
            None => None,
            Some(p) => match std::fs::read_to_string(p) {
                Ok(text) => Some(parse(&text).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "{}: expected `write_cache on|off` and `operator on|off`; fix or \
                             remove the file",
                            p.display()
                        ),
                    )
                })?),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(e),
            },
        };
        let (on, origin) = match saved {
            Some((on, under)) if under == default => (on, Origin::Initiator),
            _ => (default, Origin::Operator),
        };
        let cache = Self {
            on: AtomicBool::new(on),
            default,
            file,
            changing: tokio::sync::Mutex::new(()),
        };
        Ok((cache, origin))
    }

    /// Whether writes may be answered from the cache (WCE).
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// Sets WCE to `on` as an initiator asked, durably first; returns
    /// whether it changed.
    ///
    /// # Errors
    ///
    /// Keeping the choice failed: nothing changed.
    pub async fn set(&self, on: bool) -> io::Result<bool> {
        let _one = self.changing.lock().await;
        if self.on() == on {
            return Ok(false);
        }
        if let Some(file) = self.file.clone() {
            let default = self.default;
            tokio::task::spawn_blocking(move || keep(&file, on, default))
                .await
                .map_err(io::Error::other)??;
        }
        self.on.store(on, Ordering::Release);
        Ok(true)
    }
}

fn word(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// `(write cache, operator setting)` from the file's text.
fn parse(text: &str) -> Option<(bool, bool)> {
    let (mut on, mut under) = (None, None);
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let (k, v) = line.split_once(' ')?;
        let v = match v.trim() {
            "on" => true,
            "off" => false,
            _ => return None,
        };
        match k {
            "write_cache" => on = Some(v),
            "operator" => under = Some(v),
            _ => return None,
        }
    }
    Some((on?, under?))
}

/// Keeps the choice in `path`, durably.
fn keep(path: &Path, on: bool, default: bool) -> io::Result<()> {
    let text = format!(
        "# the write cache an iSCSI initiator chose by MODE SELECT, and the operator's \
         setting it was chosen under\nwrite_cache {}\noperator {}\n",
        word(on),
        word(default)
    );
    super::durable::replace(path, text.as_bytes(), || ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_initiators_choice_outlives_a_restart_until_the_operator_changes_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("write-cache").join("vol");
        let (c, origin) = WriteCache::load(Some(file.clone()), false).unwrap();
        assert!(!c.on() && origin == Origin::Operator);
        assert!(c.set(true).await.unwrap());
        assert!(!c.set(true).await.unwrap(), "no change, nothing to keep");
        let (c, origin) = WriteCache::load(Some(file.clone()), false).unwrap();
        assert!(c.on() && origin == Origin::Initiator, "kept");
        let (c, origin) = WriteCache::load(Some(file.clone()), true).unwrap();
        assert!(
            c.on() && origin == Origin::Operator,
            "the operator's newer word"
        );
        assert!(c.set(false).await.unwrap());
        let (c, _) = WriteCache::load(Some(file.clone()), true).unwrap();
        assert!(!c.on());
        // A choice that cannot be kept is not made.
        let blocked = dir.path().join("not-a-dir");
        let (c, _) = WriteCache::load(Some(blocked.join("vol")), false).unwrap();
        std::fs::write(&blocked, b"").unwrap();
        assert!(c.set(true).await.is_err());
        assert!(!c.on(), "unchanged when it could not be kept");
        std::fs::write(&file, "write_cache maybe\n").unwrap();
        let e = WriteCache::load(Some(file), true).unwrap_err();
        assert!(e.to_string().contains("fix or remove"), "{e}");
    }
}
