//! The executor: where a block operation meets storage, for every front
//! end. [`submit`] runs a job on any [`Storage`]; on a backend of this
//! host ([`run`]) it chooses the thread (inline for memory, a blocking thread for
//! files and devices), holds a write's range in the export's range lock
//! beside every other writer, passes FUA through, and is the one place a
//! storage error becomes a [`braid_block::ErrorKind`], the "storage lost"
//! one included (`ESHUTDOWN`: this server may no longer use the storage,
//! see [`Backend`]).
//!
//! Front ends map their commands to a [`Job`] and the errors back to their
//! wire in one place each; what they keep for themselves is how replies are
//! built (NBD's zero-copy replies, iSCSI's data-in PDUs).

use std::io;
use std::sync::Arc;

use braid_block::{Error, ErrorKind, Flags, Op};
use bytes::Bytes;

use crate::backend::{Backend, Extent, ZeroError};
use crate::export::Export;
use crate::rangelock::RangeLock;
use crate::storage::{Abilities, Done, Finished, OnHost, Storage, Submitted};

pub use crate::storage::Job;

/// The bytes an operation moves: where a READ puts them, what a WRITE
/// writes.
#[derive(Debug)]
pub enum Data<'a> {
    None,
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

/// What a successful operation found: the allocation of a BLOCK STATUS
/// (empty when the backend cannot tell, which means all data).
pub type Found = Vec<Extent>;

/// Runs `job` on the storage of `export`, whatever kind it is; WRITE data
/// comes as `payload`. On a backend of this host it runs inline where
/// calls cannot block (so a front end that polls it once finds it done),
/// otherwise on a blocking thread.
pub fn submit(export: &Arc<Export>, job: Job, payload: Option<Bytes>) -> Submitted {
    if let Some(answer) = answered_here(export, &job) {
        return Box::pin(std::future::ready(answer));
    }
    export.storage.submit(&export.writes, job, payload)
}

/// [`submit`], telling `done` the result from whichever task finishes
/// the job (see [`Storage::start`]); `piped`: the front end can splice
/// READ data from a pipe (see [`Storage::start_piped`]).
pub fn start(export: &Arc<Export>, job: Job, payload: Option<Bytes>, piped: bool, done: Finished) {
    match answered_here(export, &job) {
        Some(answer) => done(answer),
        None if piped => export
            .storage
            .start_piped(&export.writes, job, payload, done),
        None => export.storage.start(&export.writes, job, payload, done),
    }
}

/// The answer to a job that no storage is asked: a BLOCK STATUS of
/// nothing, or of storage that knows no allocation.
fn answered_here(export: &Export, job: &Job) -> Option<Result<Done, Error>> {
    if job.op != Op::BlockStatus {
        return None;
    }
    if job.len == 0 {
        return Some(Err(Error::new(
            ErrorKind::Invalid,
            "block status of length 0",
        )));
    }
    // Nothing known: all data, which is always a correct answer.
    (!export.storage.abilities().block_status).then(|| Ok(Done::default()))
}

/// Runs `job` on `backend`, the storage of `export`, on the calling
/// thread ([`run_on_its_thread`] chooses the thread).
///
/// # Errors
///
/// The storage's error, as a block error whose message names the
/// operation and its offset.
pub fn run(
    export: &Export,
    backend: &dyn Backend,
    job: Job,
    data: Data<'_>,
) -> Result<Found, Error> {
    run_locked(&export.writes, backend, job, data)
}

/// [`run`], with writes holding their range in `writes`.
fn run_locked(
    writes: &RangeLock,
    backend: &dyn Backend,
    job: Job,
    data: Data<'_>,
) -> Result<Found, Error> {
    let Job {
        op,
        offset,
        len,
        flags,
    } = job;
    let fua = flags.fua();
    // Writes hold their range beside each other, but never while an iSCSI
    // COMPARE AND WRITE holds it.
    let _range = op.is_write().then(|| writes.shared(offset, len));
    let failed = |e: io::Error| error(op.name(), offset, &e);
    match (op, data) {
        (Op::Read, Data::Read(buf)) => backend.read_at(buf, offset).map_err(failed)?,
        (Op::Write, Data::Write(buf)) => backend.write_at(buf, offset, fua).map_err(failed)?,
        (Op::Flush, _) => backend.flush().map_err(|e| error("flush", 0, &e))?,
        (Op::Trim, _) => backend.trim(offset, len, fua).map_err(failed)?,
        (Op::WriteZeroes, _) => {
            let may_trim = !flags.contains(Flags::NO_HOLE);
            let fast = flags.contains(Flags::FAST_ZERO);
            match backend.zero(offset, len, may_trim, fast, fua) {
                Ok(()) => {}
                Err(ZeroError::NotFast) => {
                    return Err(Error::new(
                        ErrorKind::NotSupported,
                        "fast zeroing is not possible here; write the zeroes instead",
                    ))
                }
                Err(ZeroError::Io(e)) => return Err(failed(e)),
            }
        }
        (Op::Cache, _) => backend.cache(offset, len).map_err(failed)?,
        (Op::BlockStatus, _) => {
            if len == 0 {
                return Err(Error::new(ErrorKind::Invalid, "block status of length 0"));
            }
            if backend.caps().extents {
                return backend.extents(offset, len).map_err(failed);
            }
        }
        (Op::Read | Op::Write, _) => {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("{} at offset {offset} without its data", op.name()),
            ))
        }
    }
    Ok(Vec::new())
}

/// Runs `f` where calls on `backend` belong: inline when they cannot
/// block, otherwise on a blocking thread, off the async threads.
pub async fn run_on_its_thread<B, T>(
    backend: B,
    f: impl FnOnce(&dyn Backend) -> T + Send + 'static,
) -> T
where
    B: AsRef<dyn Backend> + Send + 'static,
    T: Send + 'static,
{
    if backend.as_ref().blocking() {
        tokio::task::spawn_blocking(move || f(backend.as_ref()))
            .await
            .expect("a storage call panicked")
    } else {
        f(backend.as_ref())
    }
}

impl Storage for OnHost {
    fn size(&self) -> u64 {
        self.0.size()
    }

    fn abilities(&self) -> Abilities {
        let caps = self.0.caps();
        Abilities {
            read_only: false,
            flush: true,
            fua: true,
            trim: caps.trim,
            write_zeroes: true,
            fast_zero: true,
            cache: true,
            block_status: caps.extents,
            rotational: caps.rotational,
            multi_conn: true,
        }
    }

    fn failed(&self) -> bool {
        self.0.failed()
    }

    fn backend(&self) -> Option<&Arc<dyn Backend>> {
        Some(&self.0)
    }

    fn submit(&self, writes: &Arc<RangeLock>, job: Job, payload: Option<Bytes>) -> Submitted {
        let writes = writes.clone();
        let backend = self.0.clone();
        Box::pin(run_on_its_thread(backend, move |b| match job.op {
            Op::Read => {
                let mut buf = vec![0u8; job.len as usize];
                run_locked(&writes, b, job, Data::Read(&mut buf))?;
                Ok(Done {
                    data: vec![(0, Bytes::from(buf))],
                    ..Done::default()
                })
            }
            Op::Write => {
                let data = payload.unwrap_or_default();
                run_locked(&writes, b, job, Data::Write(&data))?;
                Ok(Done::default())
            }
            _ => run_locked(&writes, b, job, Data::None).map(|extents| Done {
                extents,
                ..Done::default()
            }),
        }))
    }
}

/// Whether `e` says the storage is lost to this server (see [`Backend`]):
/// every front end then leaves the operation unanswered and closes its
/// connection, so that the client takes it for a failed path, fences it
/// and goes elsewhere, rather than for a bad medium or an operation that
/// never ran.
pub fn lost(e: &Error) -> bool {
    e.kind == ErrorKind::ShuttingDown
}

/// The one place a storage error becomes a block error: `what` at
/// `offset` failed with `e`.
pub fn error(what: &str, offset: u64, e: &io::Error) -> Error {
    Error::new(kind(e), format!("{what} at offset {offset}: {e}"))
}

/// The kind of a storage error, from its OS error number.
pub fn kind(e: &io::Error) -> ErrorKind {
    match e.raw_os_error() {
        Some(libc::EPERM | libc::EACCES | libc::EROFS) => ErrorKind::ReadOnly,
        Some(libc::ENOMEM) => ErrorKind::NoMemory,
        Some(libc::EINVAL | libc::ERANGE) => ErrorKind::Invalid,
        Some(libc::EFBIG | libc::ENOSPC | libc::EDQUOT) => ErrorKind::NoSpace,
        Some(libc::EOVERFLOW) => ErrorKind::OutOfRange,
        Some(libc::EOPNOTSUPP) => ErrorKind::NotSupported,
        // See `Backend`: the storage is lost to this server; the client
        // must fence this connection and go elsewhere.
        Some(libc::ESHUTDOWN) => ErrorKind::ShuttingDown,
        _ => ErrorKind::Io,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::FileBackend;
    use std::sync::Arc;

    fn export() -> (Export, Arc<dyn Backend>) {
        let b: Arc<dyn Backend> = Arc::new(FileBackend::memory(1 << 20).unwrap());
        let e = Export::local("m", "", b.clone(), false, uuid::Uuid::nil());
        (e, b)
    }

    #[test]
    fn a_write_reads_back_and_a_read_without_a_buffer_is_refused() {
        let (e, b) = export();
        let w = Job::new(Op::Write, 5, 3).with(Flags::FUA);
        run(&e, b.as_ref(), w, Data::Write(b"abc")).unwrap();
        let mut buf = [0u8; 5];
        run(
            &e,
            b.as_ref(),
            Job::new(Op::Read, 4, 5),
            Data::Read(&mut buf),
        )
        .unwrap();
        assert_eq!(&buf, b"\0abc\0");
        let refused = run(&e, b.as_ref(), Job::new(Op::Read, 0, 5), Data::None).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::Invalid);
    }

    #[test]
    fn storage_errors_keep_their_kind_and_say_where() {
        let lost = error(
            "write",
            4096,
            &io::Error::from_raw_os_error(libc::ESHUTDOWN),
        );
        assert_eq!(lost.kind, ErrorKind::ShuttingDown);
        assert!(lost.message.starts_with("write at offset 4096: "), "{lost}");
        for (os, want) in [
            (libc::ENOSPC, ErrorKind::NoSpace),
            (libc::EDQUOT, ErrorKind::NoSpace),
            (libc::EROFS, ErrorKind::ReadOnly),
            (libc::EOPNOTSUPP, ErrorKind::NotSupported),
            (libc::EIO, ErrorKind::Io),
            (libc::ENXIO, ErrorKind::Io),
        ] {
            assert_eq!(kind(&io::Error::from_raw_os_error(os)), want, "{os}");
        }
        assert_eq!(kind(&io::Error::other("no number")), ErrorKind::Io);
    }

    #[test]
    fn block_status_of_nothing_is_invalid() {
        let (e, b) = export();
        let r = run(&e, b.as_ref(), Job::new(Op::BlockStatus, 0, 0), Data::None);
        assert_eq!(r.unwrap_err().kind, ErrorKind::Invalid);
    }
}
