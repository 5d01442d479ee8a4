//! Volume identities (`x-braid:volume=<uuid>`): the stable name of an
//! export's data, like a LUN's WWID.
//!
//! An identity travels with the data, never with the path it is served
//! by (`key::DataKey`): a file keeps it in an extended attribute
//! (`user.braid.volume`), so renaming the file keeps it and two files whose
//! names are swapped each keep their own; where the file system keeps no
//! extended attributes, the state directory keeps it under the file's
//! device and inode; a block device is known by its own WWID, serial or dm
//! uuid, so a disk that comes back under another `/dev/sdX` name after a
//! reboot keeps its identity and a different disk under the old name does
//! not inherit it. The state directory's `identities` file (one
//! `uuid<TAB>key` line each, escaped) holds what the data cannot. Lines
//! of older versions, keyed by the source's path, are moved onto the data
//! the first time that path is served.
//!
//! Memory volumes get a fresh identity each run, as their data does not
//! survive either. An identity can be set explicitly (`--volume-id`), for
//! example so that two storage heads in front of the same shared LUN report
//! one volume.

mod key;
pub mod label;

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use uuid::Uuid;

use label::{Binding, Label};

/// What the caller knows of an export whose identity it asks.
#[derive(Clone, Copy, Debug)]
pub struct Want<'a> {
    /// The export's name, for messages.
    pub export: &'a str,
    /// Served read-only: the file is not written.
    pub read_only: bool,
    /// The identity the user gave (`--volume-id`).
    pub explicit: Option<Uuid>,
}

/// Says loudly that `path` carries an identity recorded for another file
/// (a copy, a restored backup), and what it is served as instead.
fn copy_found(path: &Path, now: &Binding, copied: &Label, id: Uuid, want: Want<'_>) {
    let was = match &copied.bound {
        Some((b, p)) if p.is_empty() => b.describe(),
        Some((b, p)) => format!("{p}, {}", b.describe()),
        None => String::from("another file"),
    };
    let (export, old) = (want.export, copied.id);
    if want.explicit == Some(old) {
        tracing::warn!(
            "{} ({}) carries volume identity {old} recorded for another file ({was}): a copy \
             or a restored backup, which --volume-id {export}={old} serves as that volume; \
             serve the original nowhere else",
            path.display(),
            now.describe(),
        );
    } else if id != old {
        tracing::warn!(
            "{} ({}) carries volume identity {old} recorded for another file ({was}): a copy \
             or a restored backup, so it is served as a new volume, {id}, which initiators \
             will not take for the original. If it is the original disk, restored with the \
             original gone, serve it with --volume-id {export}={old}",
            path.display(),
            now.describe(),
        );
    }
}

/// The file of known identities.
#[derive(Debug)]
pub struct IdentityStore {
    file: PathBuf,
    entries: Vec<(Uuid, String)>,
}

impl IdentityStore {
    /// Opens (or prepares to create) `<dir>/identities`.
    ///
    /// # Errors
    ///
    /// Reading an existing file failed, or a line in it is not
    /// `uuid<TAB>path` (the message names the line).
    pub fn open(dir: &Path) -> io::Result<Self> {
        let file = dir.join("identities");
        let mut entries = Vec::new();
        match fs::read_to_string(&file) {
            Ok(text) => {
                for (n, line) in text.lines().enumerate() {
                    if line.trim().is_empty() || line.starts_with('#') {
                        continue;
                    }
                    let parsed = line
                        .split_once('\t')
                        .and_then(|(id, src)| Some((Uuid::parse_str(id).ok()?, unescape(src)?)));
                    match parsed {
                        Some(entry) => entries.push(entry),
                        None => {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!(
                                    "{}:{}: expected `uuid<TAB>path`; fix or remove the line",
                                    file.display(),
                                    n + 1
                                ),
                            ))
                        }
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(Self { file, entries })
    }

    /// The identity of the data at `path`, served as export `want.export`:
    /// the one given (`--volume-id`), else the one the data keeps, else a
    /// new one, made durable before this returns. A file served read-only
    /// is not written: its identity is kept here instead.
    ///
    /// # Errors
    ///
    /// `path` cannot be examined, or keeping a new identity failed.
    pub fn resolve(&mut self, path: &Path, want: Want<'_>) -> io::Result<Uuid> {
        let legacy = self.take_by_path(path);
        match key::DataKey::of(path)? {
            key::DataKey::Xattr(file) => self.resolve_file(&file, want, legacy),
            key::DataKey::Store(k) => {
                let kept = self
                    .entries
                    .iter()
                    .find(|(_, e)| *e == k)
                    .map(|(id, _)| *id);
                let id = want
                    .explicit
                    .or(kept)
                    .or(legacy)
                    .unwrap_or_else(Uuid::new_v4);
                if kept != Some(id) || legacy.is_some() {
                    self.entries.retain(|(_, e)| *e != k);
                    self.entries.push((id, k));
                    self.save()?;
                }
                Ok(id)
            }
        }
    }

    /// [`Self::resolve`] for a file that takes extended attributes.
    fn resolve_file(
        &mut self,
        path: &Path,
        want: Want<'_>,
        legacy: Option<Uuid>,
    ) -> io::Result<Uuid> {
        let now = Binding::of(path)?;
        // The file's own label, or one copied from another file.
        let (own, copied) = match key::get_label(path)? {
            Some(l) if l.bound.as_ref().is_none_or(|(b, _)| b.same_file(&now)) => (Some(l), None),
            Some(l) => (None, Some(l)),
            None => (None, None),
        };
        let kept_at = self
            .entries
            .iter()
            .position(|(_, k)| Binding::from_key(k).is_some_and(|b| b.same_file(&now)));
        let kept = kept_at.map(|i| self.entries[i].0);
        let id = want
            .explicit
            .or(own.as_ref().map(|l| l.id))
            .or(kept)
            .or(legacy)
            .unwrap_or_else(Uuid::new_v4);
        if let Some(c) = &copied {
            copy_found(path, &now, c, id, want);
        }
        let mut dirty = legacy.is_some();
        let label = Label {
            id,
            bound: Some((now.clone(), canonical_key(path))),
        };
        let write = !want.read_only && own.as_ref() != Some(&label);
        match write.then(|| key::set_label(path, &label)) {
            Some(Err(e)) if !key::unsupported(&e) => return Err(e),
            // Written (or already there): the file carries it.
            Some(Ok(())) | None if !want.read_only => {
                if let Some(i) = kept_at {
                    self.entries.remove(i);
                    dirty = true;
                }
            }
            // Read-only, or a file we may not label after all: what the
            // file says of itself stands, anything else is kept here by
            // the file's binding.
            _ => {
                if own.as_ref().map(|l| l.id) != Some(id) && kept != Some(id) {
                    if let Some(i) = kept_at {
                        self.entries.remove(i);
                    }
                    self.entries.push((id, now.key()));
                    dirty = true;
                }
            }
        }
        if dirty {
            self.save()?;
        }
        Ok(id)
    }

    /// Removes and returns an identity an older braid kept under `path`'s
    /// canonical name (keys that are absolute paths).
    fn take_by_path(&mut self, path: &Path) -> Option<Uuid> {
        let old = canonical_key(path);
        let at = self.entries.iter().position(|(_, k)| *k == old)?;
        Some(self.entries.remove(at).0)
    }

    pub fn path(&self) -> &Path {
        &self.file
    }

    fn save(&self) -> io::Result<()> {
        let dir = self.file.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir)?;
        let tmp = self.file.with_extension("tmp");
        let mut f = fs::File::create(&tmp)?;
        writeln!(
            f,
            "# braid volume identities the data cannot keep itself: uuid<TAB>key \
             (inode:DEV:INO, disk:..., devnum:MAJ:MIN). Keep with the data's host."
        )?;
        for (id, key) in &self.entries {
            writeln!(f, "{id}\t{}", escape(key))?;
        }
        f.sync_all()?;
        fs::rename(&tmp, &self.file)?;
        // The rename is durable only once the directory is.
        fs::File::open(dir)?.sync_all()
    }
}

/// Paths may hold any byte but NUL; the file is line-based, so the line
/// and field separators (and the escape itself) are written escaped.
fn escape(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next()? {
            '\\' => '\\',
            'n' => '\n',
            't' => '\t',
            'r' => '\r',
            _ => return None,
        });
    }
    Some(out)
}

fn canonical_key(path: &Path) -> String {
    fs::canonicalize(path)
        .unwrap_or_else(|_| path.to_owned())
        .display()
        .to_string()
}

/// The default state directory: `/var/lib/braid` for root,
/// `$XDG_STATE_HOME/braid` or `~/.local/state/braid` otherwise.
pub fn default_state_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/braid");
    }
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("braid");
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".local/state/braid"),
        None => PathBuf::from(".braid-state"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rw() -> Want<'static> {
        Want {
            export: "vol",
            read_only: false,
            explicit: None,
        }
    }

    fn ro() -> Want<'static> {
        Want {
            read_only: true,
            ..rw()
        }
    }

    #[test]
    fn identities_survive_reopening_and_differ_per_source() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.img");
        let b = dir.path().join("b.img");
        fs::write(&a, b"").unwrap();
        fs::write(&b, b"").unwrap();
        let mut store = IdentityStore::open(dir.path()).unwrap();
        let ia = store.resolve(&a, rw()).unwrap();
        let ib = store.resolve(&b, rw()).unwrap();
        assert_ne!(ia, ib);
        let mut again = IdentityStore::open(dir.path()).unwrap();
        assert_eq!(again.resolve(&a, rw()).unwrap(), ia);
        // The same file by another path is the same data.
        let via_dot = dir.path().join(".").join("a.img");
        assert_eq!(again.resolve(&via_dot, rw()).unwrap(), ia);
        let chosen = Uuid::new_v4();
        let given = Want {
            explicit: Some(chosen),
            ..rw()
        };
        assert_eq!(again.resolve(&b, given).unwrap(), chosen);
        let mut third = IdentityStore::open(dir.path()).unwrap();
        assert_eq!(third.resolve(&b, rw()).unwrap(), chosen);
    }

    #[test]
    fn a_copy_is_a_new_volume_unless_told_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.img");
        fs::write(&a, b"data").unwrap();
        let mut store = IdentityStore::open(dir.path()).unwrap();
        let ia = store.resolve(&a, rw()).unwrap();
        // A copy that keeps extended attributes, as cp -a does.
        let copy = dir.path().join("copy.img");
        fs::copy(&a, &copy).unwrap();
        let label = key::get_label(&a).unwrap().unwrap();
        key::set_label(&copy, &label).unwrap();
        let ic = store.resolve(&copy, rw()).unwrap();
        assert_ne!(ic, ia, "the copy is another volume");
        assert_eq!(store.resolve(&copy, rw()).unwrap(), ic, "and stays one");
        assert_eq!(store.resolve(&a, rw()).unwrap(), ia);
        // A restored backup the user says is the original.
        let restored = dir.path().join("restored.img");
        fs::copy(&a, &restored).unwrap();
        key::set_label(&restored, &label).unwrap();
        let told = Want {
            explicit: Some(ia),
            ..rw()
        };
        assert_eq!(store.resolve(&restored, told).unwrap(), ia);
        assert_eq!(store.resolve(&restored, rw()).unwrap(), ia, "kept");
    }

    #[test]
    fn a_read_only_file_is_not_written_and_keeps_its_identity_here() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.img");
        fs::write(&a, b"data").unwrap();
        let id = IdentityStore::open(dir.path())
            .unwrap()
            .resolve(&a, ro())
            .unwrap();
        assert_eq!(
            key::get_label(&a).unwrap(),
            None,
            "nothing written to the file"
        );
        let mut again = IdentityStore::open(dir.path()).unwrap();
        assert_eq!(
            again.resolve(&a, ro()).unwrap(),
            id,
            "kept in the state directory"
        );
        // Served writable later, the file takes it over.
        assert_eq!(again.resolve(&a, rw()).unwrap(), id);
        assert_eq!(key::get_label(&a).unwrap().map(|l| l.id), Some(id));
        assert!(
            again.entries.is_empty(),
            "no longer kept here: {:?}",
            again.entries
        );
        assert_eq!(
            again.resolve(&a, ro()).unwrap(),
            id,
            "the file's own label stands"
        );
    }

    #[test]
    fn odd_file_names_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("a\nb\tc\\d.img");
        fs::write(&odd, b"").unwrap();
        let mut store = IdentityStore::open(dir.path()).unwrap();
        let id = store.resolve(&odd, ro()).unwrap();
        let plain = dir.path().join("plain.img");
        fs::write(&plain, b"").unwrap();
        let other = store.resolve(&plain, rw()).unwrap();
        let mut again = IdentityStore::open(dir.path()).unwrap();
        assert_eq!(again.resolve(&odd, ro()).unwrap(), id);
        assert_eq!(again.resolve(&plain, rw()).unwrap(), other);
        assert_eq!(unescape(&escape("x\\n\n")).as_deref(), Some("x\\n\n"));
        assert_eq!(unescape("bad\\q"), None);
    }

    #[test]
    fn a_damaged_file_is_reported_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("identities"), "# ok\nnot-a-uuid\t/x\n").unwrap();
        let e = IdentityStore::open(dir.path()).unwrap_err();
        assert!(e.to_string().contains("identities:2"), "{e}");
    }
}
