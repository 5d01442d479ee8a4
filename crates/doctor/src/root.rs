//! Reading `/sys` and `/proc`, rooted at `/` on a live host or at a
//! directory holding a captured tree (`--root DIR`, the test fixtures).
//!
//! Every read names the file as the kernel does (`/sys/block/md0/md/level`)
//! whatever the root, because that is what a finding's evidence cites and
//! what a fix writes to. A file that is missing or unreadable (a down
//! interface's `speed` answers EINVAL) reads as `None`: the check that
//! wanted it says what it could not see.

use std::path::{Path, PathBuf};

/// Where `/sys` and `/proc` are read from.
#[derive(Clone, Debug)]
pub struct Root {
    dir: PathBuf,
}

impl Root {
    /// This host's own `/sys` and `/proc`.
    pub fn host() -> Self {
        Self { dir: "/".into() }
    }

    /// A captured tree: `DIR/sys/...`, `DIR/proc/...`.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// Whether this is the live host (fixes and probes make sense only
    /// there).
    pub fn is_host(&self) -> bool {
        self.dir == Path::new("/")
    }

    /// The file's text with surrounding white space trimmed, or `None`.
    pub fn read(&self, path: &str) -> Option<String> {
        self.read_raw(path).map(|s| s.trim().to_owned())
    }

    /// The file's text as it is.
    pub fn read_raw(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.real(path)).ok()
    }

    /// The file parsed as a number.
    pub fn number<T: std::str::FromStr>(&self, path: &str) -> Option<T> {
        self.read(path)?.parse().ok()
    }

    /// The names in a directory, sorted; empty when it is missing.
    pub fn list(&self, dir: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.real(dir))
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// Whether the path exists (a file, a directory or a link).
    pub fn exists(&self, path: &str) -> bool {
        self.real(path).symlink_metadata().is_ok()
    }

    /// Where `path` really is under this root.
    pub fn real(&self, path: &str) -> PathBuf {
        self.dir.join(path.trim_start_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixture_root_reads_under_its_directory_by_kernel_names() {
        let dir = std::env::temp_dir().join(format!("braid-doctor-root-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sys/class/net/eth0")).unwrap();
        std::fs::write(dir.join("sys/class/net/eth0/speed"), "1000\n").unwrap();
        std::fs::create_dir_all(dir.join("sys/class/net/eth1")).unwrap();
        let root = Root::at(&dir);
        assert!(!root.is_host());
        assert_eq!(
            root.read("/sys/class/net/eth0/speed").as_deref(),
            Some("1000")
        );
        assert_eq!(root.number::<u32>("/sys/class/net/eth0/speed"), Some(1000));
        assert_eq!(root.read("/sys/class/net/eth0/duplex"), None);
        assert_eq!(root.list("/sys/class/net"), ["eth0", "eth1"]);
        assert!(root.list("/nowhere").is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(Root::host().is_host());
    }
}
