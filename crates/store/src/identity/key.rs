//! What names an export's data, independent of the path it is served by:
//! for a file, an extended attribute on the file itself (or, where the file
//! system keeps none, its device and inode); for a block device, the
//! device's own stable identity from sysfs (WWID, serial, dm uuid), as
//! `/dev/disk/by-id` names disks.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::label::Label;

/// The extended attribute a file's identity is kept in.
pub const XATTR: &str = "user.braid.volume";

/// Where an identity lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataKey {
    /// In the file's own extended attribute: it moves with the file.
    Xattr(PathBuf),
    /// In the state directory, under this key (`inode:DEV:INO`,
    /// `disk:wwid:...`, `devnum:MAJ:MIN`).
    Store(String),
}

impl DataKey {
    /// What names the data at `path`. Files get [`DataKey::Xattr`] when
    /// their file system takes user extended attributes (tested by
    /// reading one), else their inode; block devices their stable id.
    ///
    /// # Errors
    ///
    /// `path` cannot be examined.
    pub fn of(path: &Path) -> io::Result<Self> {
        let meta = std::fs::metadata(path)?;
        if meta.file_type().is_block_device() {
            return Ok(Self::Store(block_key(meta.rdev())));
        }
        match get_label(path) {
            Ok(_) => Ok(Self::Xattr(path.to_owned())),
            Err(e) if unsupported(&e) => {
                Ok(Self::Store(format!("inode:{}:{}", meta.dev(), meta.ino())))
            }
            Err(e) => Err(e),
        }
    }
}

/// What `path`'s identity attribute says, if it has one that braid can
/// read (see [`super::label`]).
///
/// # Errors
///
/// The attribute cannot be read for another reason than its absence.
pub fn get_label(path: &Path) -> io::Result<Option<Label>> {
    let c = cpath(path)?;
    let name = CString::new(XATTR).expect("no NUL in the name");
    // A label with a long path can outgrow a first guess: ask its size
    // then (ERANGE), a few times at most as it may change under us.
    let mut buf = vec![0u8; 512];
    for _ in 0..4 {
        // SAFETY: both strings are NUL-terminated; buf is writable for
        // its length, which is passed.
        let n = unsafe {
            libc::getxattr(
                c.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n >= 0 {
            let text = String::from_utf8_lossy(&buf[..n as usize]);
            return Ok(Label::parse(&text));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENODATA) => return Ok(None),
            Some(libc::ERANGE) => {
                // SAFETY: a size query: no buffer is written.
                let size =
                    unsafe { libc::getxattr(c.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
                if size < 0 {
                    return Err(io::Error::last_os_error());
                }
                buf = vec![0u8; size as usize + 64];
            }
            _ => return Err(e),
        }
    }
    Err(io::Error::other(format!(
        "{}: its {XATTR} attribute keeps changing size",
        path.display()
    )))
}

/// Keeps `label` in `path`'s extended attribute and makes it durable
/// (the file's metadata synced) before returning: an identity is
/// announced only once a power cut cannot take it back.
///
/// # Errors
///
/// The file system refuses (see [`unsupported`]) or the file is not
/// writable by us, or the sync failed.
pub fn set_label(path: &Path, label: &Label) -> io::Result<()> {
    let c = cpath(path)?;
    let name = CString::new(XATTR).expect("no NUL in the name");
    let value = label.encode();
    // SAFETY: both strings are NUL-terminated; value is readable for its
    // length, which is passed.
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    std::fs::File::open(path)?.sync_all()
}

/// Whether an xattr error means "this file system keeps none".
pub fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTSUP) | Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::EROFS)
    )
}

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

/// The stable key of block device `rdev`: the disk's WWID, serial or dm
/// uuid from sysfs (with the partition number for a partition), or, when
/// the device has none, its device number (which a reboot may give to
/// another disk: the log says so).
fn block_key(rdev: u64) -> String {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let sys = Path::new("/sys/dev/block").join(format!("{major}:{minor}"));
    block_key_in(&sys).unwrap_or_else(|| {
        tracing::warn!(
            "block device {major}:{minor} has no WWID, serial or dm uuid in sysfs: its identity \
             is kept by device number, which another disk may have after a reboot; set it with \
             --volume-id to be sure"
        );
        format!("devnum:{major}:{minor}")
    })
}

/// The key from a `/sys/dev/block/MAJ:MIN` directory (or a copy of one).
pub fn block_key_in(sys: &Path) -> Option<String> {
    let dir = std::fs::canonicalize(sys).unwrap_or_else(|_| sys.to_owned());
    let partition = read(&dir.join("partition"));
    let disk = match partition {
        Some(_) => dir.parent()?.to_owned(),
        None => dir,
    };
    let id = [
        ("wwid", disk.join("wwid")),
        ("wwid", disk.join("device/wwid")),
        ("dm", disk.join("dm/uuid")),
        ("serial", disk.join("serial")),
        ("serial", disk.join("device/serial")),
    ]
    .into_iter()
    .find_map(|(kind, p)| read(&p).map(|v| format!("disk:{kind}:{v}")))?;
    Some(match partition {
        Some(n) => format!("{id}:part{n}"),
        None => id,
    })
}

fn read(p: &Path) -> Option<String> {
    let v = std::fs::read_to_string(p).ok()?;
    let v = v.trim();
    (!v.is_empty()).then(|| v.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sysfs(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (name, text) in files {
            let p = d.path().join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        d
    }

    #[test]
    fn a_disk_is_named_by_its_own_identity_and_a_partition_by_its_disks() {
        let nvme = sysfs(&[("nvme0n1/wwid", "eui.0025388b91b2a0a1\n")]);
        assert_eq!(
            block_key_in(&nvme.path().join("nvme0n1")).as_deref(),
            Some("disk:wwid:eui.0025388b91b2a0a1")
        );
        let scsi = sysfs(&[
            ("sdb/device/wwid", "naa.5000c500a1b2c3d4"),
            ("sdb/sdb2/partition", "2\n"),
        ]);
        assert_eq!(
            block_key_in(&scsi.path().join("sdb/sdb2")).as_deref(),
            Some("disk:wwid:naa.5000c500a1b2c3d4:part2")
        );
        let dm = sysfs(&[("dm-3/dm/uuid", "LVM-abc123"), ("dm-3/serial", "ignored")]);
        assert_eq!(
            block_key_in(&dm.path().join("dm-3")).as_deref(),
            Some("disk:dm:LVM-abc123")
        );
        let virtio = sysfs(&[("vda/serial", "BRAID-DISK-7")]);
        assert_eq!(
            block_key_in(&virtio.path().join("vda")).as_deref(),
            Some("disk:serial:BRAID-DISK-7")
        );
        let none = sysfs(&[("loop0/size", "0")]);
        assert_eq!(block_key_in(&none.path().join("loop0")), None);
    }

    #[test]
    fn a_files_identity_lives_in_its_extended_attribute() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("a.img");
        std::fs::write(&f, b"x").unwrap();
        assert_eq!(get_label(&f).unwrap(), None);
        assert_eq!(DataKey::of(&f).unwrap(), DataKey::Xattr(f.clone()));
        let b = super::super::label::Binding::of(&f).unwrap();
        let long = format!("/srv/{}", "x".repeat(2000));
        let label = Label {
            id: uuid::Uuid::new_v4(),
            bound: Some((b, long)),
        };
        set_label(&f, &label).unwrap();
        let moved = dir.path().join("b.img");
        std::fs::rename(&f, &moved).unwrap();
        assert_eq!(
            get_label(&moved).unwrap(),
            Some(label),
            "past a first guess of its size"
        );
    }
}
