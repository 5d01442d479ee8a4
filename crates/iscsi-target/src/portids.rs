//! The portals' tags (portal group, relative target port and target port
//! group), kept by address in the state directory (`iscsi-ports`), so
//! that a restart with `--listen` in another order, or another address,
//! leaves each portal its tag: saved reservations name the relative port,
//! and initiators remember the port groups.

use std::io;
use std::net::SocketAddr;
use std::path::Path;

use braid_scsi::ports::{PortIds, PortTable};

/// The file's name in the state directory.
const FILE: &str = "iscsi-ports";

/// The table of `addrs`, tagged as `state_dir` kept them (new addresses
/// given new tags, saved before any is used); without a state directory,
/// tagged from 1 in their order. `offset` is added to every tag (a Ceph
/// gateway's range among its image's gateways).
///
/// # Errors
///
/// The file could not be read, is not what braid writes, or the new tags
/// could not be saved.
pub(crate) fn table(
    state_dir: Option<&Path>,
    addrs: &[SocketAddr],
    offset: u16,
) -> io::Result<PortTable> {
    let Some(dir) = state_dir else {
        let tagged: Vec<(SocketAddr, u16)> = addrs.iter().copied().zip(1..).collect();
        return shifted(&tagged, offset);
    };
    let path = dir.join(FILE);
    let invalid = |e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: {e}; fix the file, or remove it to number the iSCSI portals again in \
                 --listen order (saved reservations then follow that order)",
                path.display()
            ),
        )
    };
    let mut ids = match std::fs::read_to_string(&path) {
        Ok(text) => PortIds::load(&text).map_err(|e| invalid(&e))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => PortIds::default(),
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("reading {}: {e}", path.display()),
            ))
        }
    };
    let (tags, new) = ids.assign(addrs).map_err(|e| invalid(&e))?;
    if new {
        super::durable::replace(&path, ids.save().as_bytes(), || ()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "saving the iSCSI portals' tags in {}: {e} (choose a writable --state-dir)",
                    path.display()
                ),
            )
        })?;
    }
    let tagged: Vec<(SocketAddr, u16)> = addrs.iter().copied().zip(tags).collect();
    shifted(&tagged, offset)
}

/// The table of `tagged`, every tag moved up by `offset`.
fn shifted(tagged: &[(SocketAddr, u16)], offset: u16) -> io::Result<PortTable> {
    let moved: Option<Vec<(SocketAddr, u16)>> = tagged
        .iter()
        .map(|(a, t)| t.checked_add(offset).map(|t| (*a, t)))
        .collect();
    let moved = moved.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("iSCSI portal tags from {offset} on pass 65535: serve fewer portals"),
        )
    })?;
    Ok(PortTable::tagged(&moved))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_kept_by_address_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.0.0.1:3260".parse().unwrap(),
            "127.0.0.2:3260".parse().unwrap(),
        );
        let tags = |t: &PortTable| t.iter().map(|p| (p.addr, p.tag)).collect::<Vec<_>>();
        let first = table(Some(dir.path()), &[a, b], 0).unwrap();
        assert_eq!(tags(&first), [(a, 1), (b, 2)]);
        let again = table(Some(dir.path()), &[b, a], 0).unwrap();
        assert_eq!(tags(&again), [(b, 2), (a, 1)]);
        std::fs::write(dir.path().join(FILE), "1 nowhere\n").unwrap();
        let e = table(Some(dir.path()), &[a], 0).unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
        assert_eq!(tags(&table(None, &[b, a], 0).unwrap()), [(b, 1), (a, 2)]);
        assert_eq!(
            tags(&table(None, &[b, a], 256).unwrap()),
            [(b, 257), (a, 258)],
            "a gateway's range"
        );
        std::fs::remove_file(dir.path().join(FILE)).unwrap();
        let moved = table(Some(dir.path()), &[a, b], 512).unwrap();
        assert_eq!(tags(&moved), [(a, 513), (b, 514)]);
        assert!(table(None, &[a, b], u16::MAX).is_err());
    }
}
