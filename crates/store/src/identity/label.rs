//! What a file's identity attribute says, and how braid tells the file it
//! was written on from a copy of it.
//!
//! `cp -a`, `rsync -aX`, `tar --xattrs` and backups copy extended
//! attributes, so an identity kept only as a UUID in `user.braid.volume`
//! would make a copy report the original's identity: an initiator sent to
//! the wrong host would combine two different disks as paths of one. So
//! the attribute also records which file it was written on (a
//! [`Binding`]: device, inode and, where the file system keeps one, the
//! birth time) and the path it was served by, for messages:
//!
//! ```text
//! 1f0c...-uuid dev=8:1 ino=1234 born=1767225600.123456789 path=/srv/vol.img
//! ```
//!
//! A copy is a new file: another inode, or another birth time (which no
//! tool can set), so it does not match. The device number is compared
//! only where no birth time is known: a reboot may give a file system
//! another one (a dm device's minor), and the birth time alone then
//! tells the same file.

use std::path::Path;

use uuid::Uuid;

/// Where a file is: what a copy of it does not keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The file system's device, major and minor.
    pub dev: (u32, u32),
    pub ino: u64,
    /// Birth time (seconds, nanoseconds) where the file system keeps it.
    pub born: Option<(i64, u32)>,
}

impl Binding {
    /// The binding of the file at `path` now.
    ///
    /// # Errors
    ///
    /// `path` cannot be examined.
    pub fn of(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        let born = meta
            .created()
            .ok()
            .map(|t| match t.duration_since(std::time::UNIX_EPOCH) {
                Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
                Err(before) => (-(before.duration().as_secs() as i64), 0),
            });
        Ok(Self {
            dev: (libc::major(meta.dev()), libc::minor(meta.dev())),
            ino: meta.ino(),
            born,
        })
    }

    /// Whether `now` is the file this binding was recorded for.
    pub fn same_file(&self, now: &Binding) -> bool {
        if self.ino != now.ino {
            return false;
        }
        match (self.born, now.born) {
            (Some(a), Some(b)) => a == b,
            _ => self.dev == now.dev,
        }
    }

    /// `dev=MAJ:MIN ino=N[ born=S.NNNNNNNNN]`.
    pub fn encode(&self) -> String {
        let mut s = format!("dev={}:{} ino={}", self.dev.0, self.dev.1, self.ino);
        if let Some((secs, nanos)) = self.born {
            s.push_str(&format!(" born={secs}.{nanos:09}"));
        }
        s
    }

    /// Reads [`Self::encode`]'s fields from `fields` (others are skipped).
    fn parse<'a>(fields: impl Iterator<Item = &'a str>) -> Option<Self> {
        let (mut dev, mut ino, mut born) = (None, None, None);
        for f in fields {
            match f.split_once('=') {
                Some(("dev", v)) => {
                    let (a, b) = v.split_once(':')?;
                    dev = Some((a.parse().ok()?, b.parse().ok()?));
                }
                Some(("ino", v)) => ino = Some(v.parse().ok()?),
                Some(("born", v)) => {
                    let (s, n) = v.split_once('.')?;
                    born = Some((s.parse().ok()?, n.parse().ok()?));
                }
                _ => {}
            }
        }
        Some(Self {
            dev: dev?,
            ino: ino?,
            born,
        })
    }

    /// How a message names the file: `device 8:1, inode 1234`.
    pub fn describe(&self) -> String {
        format!("device {}:{}, inode {}", self.dev.0, self.dev.1, self.ino)
    }

    /// The state directory's key for an identity kept for this file
    /// (`file:dev=... ino=...`), when it may not be written into the file.
    pub fn key(&self) -> String {
        format!("file:{}", self.encode())
    }

    /// The binding a state directory key names, if it names one.
    pub fn from_key(key: &str) -> Option<Self> {
        Self::parse(key.strip_prefix("file:")?.split(' '))
    }
}

/// The value of a file's identity attribute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    pub id: Uuid,
    /// The file it was written on and the path it was served by; `None`
    /// in a label an older braid wrote (a bare UUID).
    pub bound: Option<(Binding, String)>,
}

impl Label {
    /// Parses an attribute's value; `None` when it holds no UUID.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim_end_matches(['\0', '\n']);
        let (head, path) = match text.split_once(" path=") {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        };
        let mut fields = head.split(' ');
        let id = Uuid::parse_str(fields.next()?.trim()).ok()?;
        let bound = Binding::parse(fields).map(|b| {
            (
                b,
                path.map(super::unescape)
                    .unwrap_or_default()
                    .unwrap_or_default(),
            )
        });
        Some(Self { id, bound })
    }

    /// The attribute's value.
    pub fn encode(&self) -> String {
        match &self.bound {
            None => self.id.to_string(),
            Some((b, path)) => format!("{} {} path={}", self.id, b.encode(), super::escape(path)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_round_trips_and_an_old_bare_uuid_still_reads() {
        let id = Uuid::parse_str("1f0c5a2e-6f0b-4d53-a0d4-1c2b3d4e5f60").unwrap();
        let b = Binding {
            dev: (8, 1),
            ino: 1234,
            born: Some((1_767_225_600, 123_456_789)),
        };
        let l = Label {
            id,
            bound: Some((b.clone(), "/srv/a b\nc.img".into())),
        };
        let text = l.encode();
        assert_eq!(
            text,
            "1f0c5a2e-6f0b-4d53-a0d4-1c2b3d4e5f60 dev=8:1 ino=1234 \
             born=1767225600.123456789 path=/srv/a b\\nc.img"
        );
        assert_eq!(Label::parse(&text), Some(l));
        assert_eq!(
            Label::parse("1f0c5a2e-6f0b-4d53-a0d4-1c2b3d4e5f60\n"),
            Some(Label { id, bound: None })
        );
        assert_eq!(Label::parse("not a uuid dev=1:2 ino=3"), None);
        assert_eq!(Binding::from_key(&b.key()), Some(b));
    }

    #[test]
    fn a_copy_is_another_file_and_a_renumbered_device_is_not() {
        let b = |dev: u32, ino, born| Binding {
            dev: (dev, 0),
            ino,
            born,
        };
        let t = Some((1_767_225_600, 5));
        assert!(b(8, 10, t).same_file(&b(8, 10, t)));
        assert!(!b(8, 10, t).same_file(&b(8, 11, t)), "another inode");
        assert!(
            !b(8, 10, t).same_file(&b(9, 10, Some((1_767_225_601, 0)))),
            "another file system's inode 10, born later"
        );
        assert!(
            b(8, 10, t).same_file(&b(253, 10, t)),
            "a device renumbered at boot, same file"
        );
        assert!(
            !b(8, 10, None).same_file(&b(9, 10, None)),
            "no birth time: device"
        );
        assert!(b(8, 10, None).same_file(&b(8, 10, t)));
    }

    #[test]
    fn a_file_and_its_copy_have_different_bindings() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.img");
        std::fs::write(&a, b"x").unwrap();
        let c = dir.path().join("c.img");
        std::fs::copy(&a, &c).unwrap();
        let ba = Binding::of(&a).unwrap();
        assert!(ba.same_file(&Binding::of(&a).unwrap()));
        assert!(!ba.same_file(&Binding::of(&c).unwrap()));
        let moved = dir.path().join("moved.img");
        std::fs::rename(&a, &moved).unwrap();
        assert!(
            ba.same_file(&Binding::of(&moved).unwrap()),
            "a rename is the same file"
        );
    }
}
