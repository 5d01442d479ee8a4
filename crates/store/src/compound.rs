//! The executor's compound operations: those that read and write one
//! range as a whole (iSCSI's COMPARE AND WRITE, ORWRITE and WRITE AND
//! VERIFY), so that they too meet storage only here, with the range lock
//! held as they need it and errors mapped in the one place
//! ([`crate::exec::error`]).

use std::sync::Arc;

use braid_block::{Error, ErrorKind, Flags, Op};
use bytes::Bytes;

use crate::exec::{self, error, Job};
use crate::export::Export;

/// What a read-modify-write step decided on the data it read: write the
/// (changed) data back, or leave the medium as it is; with what to
/// report either way.
#[derive(Debug, PartialEq, Eq)]
pub enum Change<T> {
    Write(T),
    Keep(T),
}

/// Whether a read and the write that follows it can be made atomic here:
/// every writer of the storage comes through this server's range lock. Not
/// so where other gateways write the same image (`peers`), nor for
/// storage reached elsewhere, whose other clients this lock cannot hold
/// off.
pub fn atomic(export: &Export) -> bool {
    export.peers.is_none() && export.storage.backend().is_some()
}

/// Reads `[offset, offset + len)` with the range held alone, lets `change`
/// look at (and change) the data, and writes it back when it says so,
/// before the range is released: no other write of any protocol lands in
/// between. Always on a blocking thread, since the lock may wait for
/// writers of the range to finish.
///
/// # Errors
///
/// `NotSupported` where it cannot be atomic (see [`atomic`]); the
/// storage's error otherwise.
pub async fn read_modify_write<T: Send + 'static>(
    export: &Arc<Export>,
    offset: u64,
    len: usize,
    fua: bool,
    change: impl FnOnce(&mut [u8]) -> Change<T> + Send + 'static,
) -> Result<T, Error> {
    let backend =
        match export.storage.backend() {
            Some(b) if atomic(export) => b.clone(),
            _ => return Err(Error::new(
                ErrorKind::NotSupported,
                "a read and its write cannot be made atomic here: other servers write this storage",
            )),
        };
    let export = export.clone();
    tokio::task::spawn_blocking(move || {
        let range = export.writes.exclusive(offset, len as u64);
        let mut now = vec![0u8; len];
        backend
            .read_at(&mut now, offset)
            .map_err(|e| error("read", offset, &e))?;
        match change(&mut now) {
            Change::Keep(t) => Ok(t),
            Change::Write(t) => {
                range.checkpoint();
                backend
                    .write_at(&now, offset, fua)
                    .map_err(|e| error("write", offset, &e))?;
                Ok(t)
            }
        }
    })
    .await
    .expect("a read-modify-write panicked")
}

/// Whether a compare-and-write can be atomic here: every writer comes
/// through this server's range lock ([`atomic`]), or the storage does it
/// as one operation of its own, which other servers' writes cannot split
/// (a Ceph image's gateways).
pub fn compares_and_writes(export: &Export) -> bool {
    atomic(export)
        || export
            .storage
            .backend()
            .is_some_and(|b| b.compares_and_writes())
}

/// Writes `data` at `offset` if the medium there equals `cmp` (as long),
/// atomically: with the range held alone where this server's lock is
/// enough ([`read_modify_write`]), else as the storage's own operation
/// (still inside the range lock, so this server's other writers of the
/// range wait for it). `None` when written, else the first byte (from
/// `offset`) that differed.
///
/// # Errors
///
/// `NotSupported` where it cannot be atomic ([`compares_and_writes`]);
/// the storage's error otherwise.
pub async fn compare_and_write(
    export: &Arc<Export>,
    offset: u64,
    cmp: Vec<u8>,
    data: Vec<u8>,
    fua: bool,
) -> Result<Option<u64>, Error> {
    if atomic(export) {
        let n = cmp.len();
        return read_modify_write(export, offset, n, fua, move |now| {
            match first_difference(now, &cmp) {
                Some(at) => Change::Keep(Some(at as u64)),
                None => {
                    now.copy_from_slice(&data[..n]);
                    Change::Write(None)
                }
            }
        })
        .await;
    }
    let backend = match export.storage.backend() {
        Some(b) if b.compares_and_writes() => b.clone(),
        _ => {
            return Err(Error::new(
                ErrorKind::NotSupported,
                "a compare-and-write cannot be made atomic here: other servers write this \
                 storage, and it has no such operation of its own",
            ))
        }
    };
    let export = export.clone();
    exec::run_on_its_thread(backend, move |b| {
        let _range = export.writes.exclusive(offset, cmp.len() as u64);
        b.compare_and_write(&cmp, &data, offset, fua)
            .map_err(|e| error("compare and write", offset, &e))
    })
    .await
}

/// Writes `data` at `offset` through to stable storage, reads it back and
/// compares: the first byte that differs, if one does.
///
/// # Errors
///
/// The storage's error.
pub async fn write_and_verify(
    export: &Arc<Export>,
    offset: u64,
    data: Bytes,
) -> Result<Option<usize>, Error> {
    let len = data.len() as u64;
    let Some(backend) = export.storage.backend().cloned() else {
        // Elsewhere: the write, then the read, each through the storage.
        let write = Job::new(Op::Write, offset, len).with(Flags::FUA);
        exec::submit(export, write, Some(data.clone())).await?;
        let back = exec::submit(export, Job::new(Op::Read, offset, len), None).await?;
        let mut at = 0;
        for (_, piece) in back.data {
            if let Some(d) = first_difference(&piece, &data[at..]) {
                return Ok(Some(at + d));
            }
            at += piece.len();
        }
        return Ok((at != data.len()).then_some(at));
    };
    let export = export.clone();
    exec::run_on_its_thread(backend, move |b| {
        // Held over both, so no COMPARE AND WRITE lands between the write
        // and the read that checks it.
        let _range = export.writes.shared(offset, len);
        b.write_at(&data, offset, true)
            .map_err(|e| error("write", offset, &e))?;
        let mut back = vec![0u8; data.len()];
        b.read_at(&mut back, offset)
            .map_err(|e| error("read", offset, &e))?;
        Ok(first_difference(&back, &data))
    })
    .await
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, FileBackend};

    fn export() -> Arc<Export> {
        let b: Arc<dyn Backend> = Arc::new(FileBackend::memory(1 << 16).unwrap());
        Arc::new(Export::local("m", "", b, false, uuid::Uuid::nil()))
    }

    #[tokio::test]
    async fn a_change_is_written_back_and_a_keep_is_not() {
        let e = export();
        let w = read_modify_write(&e, 10, 4, false, |d| {
            d.copy_from_slice(b"abcd");
            Change::Write(1)
        });
        assert_eq!(w.await.unwrap(), 1);
        let k = read_modify_write(&e, 10, 4, false, |d| {
            assert_eq!(d, b"abcd");
            d.copy_from_slice(b"zzzz");
            Change::Keep(2)
        });
        assert_eq!(k.await.unwrap(), 2);
        let mut back = [0u8; 4];
        e.storage.backend().unwrap().read_at(&mut back, 10).unwrap();
        assert_eq!(&back, b"abcd");
        let v = write_and_verify(&e, 0, Bytes::from_static(b"xyz"));
        assert_eq!(v.await.unwrap(), None);
    }
}
