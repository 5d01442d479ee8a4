//! Whether a file lives on a file system other hosts share, where the
//! lock braid takes on an image (`lock.rs`) holds on this host only: a
//! `braid serve` (or a qemu, a mount) on another host of the same NFS
//! export does not see it, and both write.
//!
//! Told from `statfs`'s file system type for the kernel's network and
//! cluster file systems, and, for FUSE, from the mount's subtype in
//! `/proc/self/mountinfo` (`fuse.glusterfs`, `fuse.sshfs`, ...). A FUSE
//! file system of another subtype cannot be told apart from a local one.

use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Kernel file systems whose files other hosts reach: `statfs` magic
/// numbers (linux/magic.h and the file systems' own headers) and names.
const KERNEL: &[(i64, &str)] = &[
    (0x6969, "NFS"),
    (0x517b, "SMB"),
    (0xff53_4d42, "CIFS/SMB"),
    (0xfe53_4d42, "SMB3"),
    (0x00c3_6400, "CephFS"),
    (0x5346_414f, "AFS"),
    (0x6b41_4653, "AFS"),
    (0x0102_1997, "9p"),
    (0x0bd0_0bd0, "Lustre"),
    (0x4750_4653, "GPFS"),
    (0x1983_0326, "BeeGFS"),
    (0x7461_636f, "OCFS2"),
    (0x0116_1970, "GFS2"),
    (0x7375_7245, "Coda"),
];

const FUSE_MAGIC: i64 = 0x6573_5546;

/// FUSE subtypes of network file systems.
const FUSE: &[&str] = &[
    "glusterfs",
    "sshfs",
    "ceph-fuse",
    "ceph",
    "s3fs",
    "rclone",
    "gcsfuse",
    "juicefs",
    "mfs",
    "lizardfs",
    "seaweedfs",
    "objectivefs",
    "davfs",
];

/// The name of the shared file system `path` lives on, or `None` for a
/// local one (or one braid cannot tell, see the module's note).
///
/// # Errors
///
/// `path` cannot be examined.
pub fn network_fs(path: &Path) -> io::Result<Option<String>> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))?;
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: a NUL-terminated path; statfs fills the struct on success,
    // and it is read only then.
    if unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statfs returned 0, so the struct is filled.
    // f_type is an i64 here and an i32 on 32-bit targets.
    #[allow(clippy::unnecessary_cast)]
    let magic = unsafe { st.assume_init() }.f_type as i64;
    let fuse = || -> io::Result<Option<String>> {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(path)?.dev();
        let info = std::fs::read_to_string("/proc/self/mountinfo")?;
        Ok(fuse_subtype(&info, libc::major(dev), libc::minor(dev)))
    };
    classify(magic, fuse)
}

/// The shared file system a `statfs` type names; for FUSE, the subtype
/// `fuse` finds, when it is a network one's.
fn classify(
    magic: i64,
    fuse: impl FnOnce() -> io::Result<Option<String>>,
) -> io::Result<Option<String>> {
    let magic = magic & 0xffff_ffff;
    if let Some((_, name)) = KERNEL.iter().find(|(m, _)| *m == magic) {
        return Ok(Some((*name).to_owned()));
    }
    if magic != FUSE_MAGIC {
        return Ok(None);
    }
    Ok(fuse()?
        .filter(|sub| FUSE.contains(&sub.as_str()))
        .map(|sub| format!("FUSE {sub}")))
}

/// The subtype (`fuse.SUBTYPE`) of the mount of device `major:minor` in
/// `/proc/self/mountinfo`'s text.
fn fuse_subtype(mountinfo: &str, major: u32, minor: u32) -> Option<String> {
    let dev = format!("{major}:{minor}");
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split(' ');
        if fields.nth(2)? != dev {
            return None;
        }
        let (_, after) = line.split_once(" - ")?;
        let fstype = after.split(' ').next()?;
        fstype.strip_prefix("fuse.").map(str::to_owned)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
98 22 0:52 / /mnt/gv0 rw,nosuid,nodev shared:40 - fuse.glusterfs gfs1:/gv0 rw,user_id=0
99 22 0:53 / /mnt/power rw,nosuid,nodev shared:41 - fuse braid-powercut rw,user_id=0
100 22 0:54 / /mnt/bind rw shared:42 - fuse.bindfs bindfs rw";

    #[test]
    fn network_file_systems_are_told_by_type_and_fuse_ones_by_subtype() {
        let none = || Ok(None);
        assert_eq!(classify(0x6969, none).unwrap().as_deref(), Some("NFS"));
        assert_eq!(
            classify(0xff53_4d42_u32 as i32 as i64, none)
                .unwrap()
                .as_deref(),
            Some("CIFS/SMB"),
            "a magic that reads negative as the C long"
        );
        assert_eq!(classify(0xef53, none).unwrap(), None, "ext4");
        let sub = |s: &'static str| move || Ok(Some(s.to_owned()));
        assert_eq!(
            classify(FUSE_MAGIC, sub("glusterfs")).unwrap().as_deref(),
            Some("FUSE glusterfs")
        );
        assert_eq!(classify(FUSE_MAGIC, sub("bindfs")).unwrap(), None);
        assert_eq!(fuse_subtype(MOUNTINFO, 0, 52).as_deref(), Some("glusterfs"));
        assert_eq!(fuse_subtype(MOUNTINFO, 0, 53), None, "a plain fuse mount");
        assert_eq!(fuse_subtype(MOUNTINFO, 0, 54).as_deref(), Some("bindfs"));
        assert_eq!(fuse_subtype(MOUNTINFO, 253, 0), None);
    }

    #[test]
    fn a_local_file_is_not_on_a_network_file_system() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(network_fs(dir.path()).unwrap(), None);
    }
}
