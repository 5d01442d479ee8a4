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

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use uuid::Uuid;

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

    /// The identity of the data at `path`, made and saved if new.
    ///
    /// # Errors
    ///
    /// `path` cannot be examined, or saving a new identity failed.
    pub fn identity(&mut self, path: &Path) -> io::Result<Uuid> {
        match key::DataKey::of(path)? {
            key::DataKey::Xattr(file) => {
                if let Some(id) = key::get_xattr(&file)? {
                    return Ok(id);
                }
                let (id, moved) = match self.take_by_path(path) {
                    Some(id) => (id, true),
                    None => (Uuid::new_v4(), false),
                };
                self.keep(path, &file, id)?;
                if moved {
                    self.save()?;
                }
                Ok(id)
            }
            key::DataKey::Store(k) => {
                if let Some((id, _)) = self.entries.iter().find(|(_, e)| *e == k) {
                    return Ok(*id);
                }
                let id = self.take_by_path(path).unwrap_or_else(Uuid::new_v4);
                self.entries.push((id, k));
                self.save()?;
                Ok(id)
            }
        }
    }

    /// Records an identity given by the user for the data at `path`.
    ///
    /// # Errors
    ///
    /// `path` cannot be examined, or saving failed.
    pub fn set(&mut self, path: &Path, id: Uuid) -> io::Result<()> {
        let moved = self.take_by_path(path).is_some();
        match key::DataKey::of(path)? {
            key::DataKey::Xattr(file) => {
                self.keep(path, &file, id)?;
                if moved {
                    self.save()?;
                }
                Ok(())
            }
            key::DataKey::Store(k) => {
                self.entries.retain(|(_, e)| *e != k);
                self.entries.push((id, k));
                self.save()
            }
        }
    }

    /// Writes `id` into `file`'s extended attribute, or, where that is
    /// refused after all (a file we may not label), keeps it by inode.
    fn keep(&mut self, path: &Path, file: &Path, id: Uuid) -> io::Result<()> {
        match key::set_xattr(file, id) {
            Ok(()) => Ok(()),
            Err(e) if key::unsupported(&e) => {
                use std::os::unix::fs::MetadataExt;
                let meta = fs::metadata(path)?;
                let k = format!("inode:{}:{}", meta.dev(), meta.ino());
                self.entries.retain(|(_, e)| *e != k);
                self.entries.push((id, k));
                self.save()
            }
            Err(e) => Err(e),
        }
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
        fs::rename(&tmp, &self.file)
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

    #[test]
    fn identities_survive_reopening_and_differ_per_source() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.img");
        let b = dir.path().join("b.img");
        fs::write(&a, b"").unwrap();
        fs::write(&b, b"").unwrap();
        let mut store = IdentityStore::open(dir.path()).unwrap();
        let ia = store.identity(&a).unwrap();
        let ib = store.identity(&b).unwrap();
        assert_ne!(ia, ib);
        let mut again = IdentityStore::open(dir.path()).unwrap();
        assert_eq!(again.identity(&a).unwrap(), ia);
        // The same file by another path is the same data.
        let via_dot = dir.path().join(".").join("a.img");
        assert_eq!(again.identity(&via_dot).unwrap(), ia);
        let chosen = Uuid::new_v4();
        again.set(&b, chosen).unwrap();
        assert_eq!(
            IdentityStore::open(dir.path())
                .unwrap()
                .identity(&b)
                .unwrap(),
            chosen
        );
    }

    #[test]
    fn odd_file_names_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("a\nb\tc\\d.img");
        fs::write(&odd, b"").unwrap();
        let mut store = IdentityStore::open(dir.path()).unwrap();
        let id = store.identity(&odd).unwrap();
        let plain = dir.path().join("plain.img");
        fs::write(&plain, b"").unwrap();
        let other = store.identity(&plain).unwrap();
        let mut again = IdentityStore::open(dir.path()).unwrap();
        assert_eq!(again.identity(&odd).unwrap(), id);
        assert_eq!(again.identity(&plain).unwrap(), other);
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
