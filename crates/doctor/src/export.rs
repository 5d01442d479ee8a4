//! What an export stands on: the file system holding a file export (and
//! whether it can keep a FLUSH's promise at all), or the block device of a
//! device export, and the devices under either.

use std::path::Path;

use crate::block::{self, BlockDev};
use crate::finding::{Finding, Fix, Severity, Subject};
use crate::parse;
use crate::root::Root;

/// An export as `braid serve` is given it: `NAME=SOURCE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportRef {
    pub name: String,
    /// A file, a block device, or `mem:SIZE` / `memory`.
    pub source: String,
}

impl std::str::FromStr for ExportRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, source) = s
            .split_once('=')
            .filter(|(n, s)| !n.is_empty() && !s.is_empty())
            .ok_or_else(|| format!("export {s:?}: expected NAME=SOURCE, e.g. vol=/srv/disk.img"))?;
        Ok(Self {
            name: name.to_owned(),
            source: source.to_owned(),
        })
    }
}

/// The export's backing finding and the block device under it, if any.
pub fn check(root: &Root, e: &ExportRef) -> (Finding, Option<BlockDev>) {
    let subject = Subject::Export(e.name.clone());
    if e.source.starts_with("mem:") || e.source.starts_with("memory") {
        let f = Finding::new(
            "export-backing",
            Severity::Warn,
            subject,
            "a memory volume lives only as long as braid serve runs: everything written to it \
             is gone when it stops",
        )
        .read("export source", e.source.clone())
        .fix(Fix::Manual(format!(
            "serve a file or a block device as {} for data that must outlive the process",
            e.name
        )));
        return (f, None);
    }
    let path = resolve(root, &e.source);
    if path.starts_with("/dev/") {
        let dev = device_of_node(root, &path);
        let f = match &dev {
            Some(d) => Finding::ok(
                "export-backing",
                subject,
                format!(
                    "block device {}: no file system between braid and the disk",
                    d.name
                ),
            )
            .read("export source", path.clone()),
            None => Finding::new(
                "export-backing",
                Severity::Warn,
                subject,
                format!("{path} is not a block device this host has"),
            )
            .read("export source", path.clone()),
        };
        return (f, dev);
    }
    let mountinfo_path = "/proc/self/mountinfo";
    let mounts = parse::mountinfo(&root.read_raw(mountinfo_path).unwrap_or_default());
    let Some(m) = parse::mount_of(&mounts, &path) else {
        let f = Finding::new(
            "export-backing",
            Severity::Warn,
            subject,
            format!("no mount holds {path}; cannot tell what it is stored on"),
        )
        .read(mountinfo_path, "no mount point above it");
        return (f, None);
    };
    let line = format!(
        "{} {} {} {} {}",
        m.mount_point, m.fstype, m.source, m.options, m.super_options
    );
    let dev = block::by_number(root, m.dev.0, m.dev.1).or_else(|| {
        m.source
            .strip_prefix("/dev/")
            .and_then(|n| block::by_name(root, n.rsplit('/').next().unwrap_or(n)))
    });
    let mut f = Finding::ok(
        "export-backing",
        subject,
        format!(
            "{path} is on {} ({}), which flushes to its disk on FLUSH",
            m.fstype, m.source
        ),
    )
    .read("export source", path.clone())
    .read(mountinfo_path, line);
    if matches!(m.fstype.as_str(), "tmpfs" | "ramfs") {
        f.severity = Severity::Fail;
        f.why = format!(
            "{path} is on {}: it lives in memory only, so a reboot or power cut loses the \
             volume, and every FLUSH braid acknowledges promises a durability it cannot keep",
            m.fstype
        );
        f = f.fix(Fix::Manual(format!(
            "move {path} to a file system on a disk (or serve a block device) and serve it from \
             there"
        )));
    } else if m.has_option("nobarrier") || m.has_option("barrier=0") {
        f.severity = Severity::Fail;
        f.why = format!(
            "{} is mounted without barriers: the file system never asks the disk to empty its \
             cache, so a FLUSH braid acknowledges can be lost at power failure",
            m.mount_point
        );
        f = f.fix(Fix::Run(format!(
            "mount -o remount,barrier {}",
            m.mount_point
        )));
    }
    (f, dev)
}

/// The path as the kernel resolves it (symlinks followed) on a live host;
/// under a captured tree, as given.
fn resolve(root: &Root, source: &str) -> String {
    if root.is_host() {
        if let Ok(p) = std::fs::canonicalize(source) {
            return p.display().to_string();
        }
    }
    source.to_owned()
}

/// The block device behind a device node: by its device number on a live
/// host, by name under a captured tree.
fn device_of_node(root: &Root, path: &str) -> Option<BlockDev> {
    if root.is_host() {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let meta = std::fs::metadata(path).ok()?;
        if meta.file_type().is_block_device() {
            let rdev = meta.rdev();
            return block::by_number(root, libc::major(rdev), libc::minor(rdev));
        }
        return None;
    }
    let name = Path::new(path).file_name()?.to_str()?;
    block::by_name(root, name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_refs_parse() {
        let e: ExportRef = "vol=/srv/v.img".parse().unwrap();
        assert_eq!((e.name.as_str(), e.source.as_str()), ("vol", "/srv/v.img"));
        assert!("vol".parse::<ExportRef>().is_err());
        assert!("=x".parse::<ExportRef>().is_err());
    }

    #[test]
    fn memory_exports_warn() {
        let (f, dev) = check(
            &Root::at("/nonexistent"),
            &ExportRef {
                name: "m".into(),
                source: "mem:1GiB".into(),
            },
        );
        assert_eq!(f.severity, Severity::Warn);
        assert!(dev.is_none());
    }
}
