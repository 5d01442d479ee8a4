//! The one trait every kind of storage behind an export implements: a
//! backend on this host ([`OnHost`]: a file, a block device, memory, an
//! RBD image) or storage reached elsewhere (the multipath volume `braid
//! attach` serves). The executor ([`crate::exec::submit`]) drives it, so
//! every front end serves every kind of storage, in the protocol-neutral
//! words of `braid-block`.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use braid_block::{Error, Flags, Op};
use bytes::Bytes;

use crate::backend::{Backend, Extent};
use crate::rangelock::RangeLock;

/// One operation on a range of an export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Job {
    pub op: Op,
    pub offset: u64,
    pub len: u64,
    pub flags: Flags,
}

impl Job {
    pub fn new(op: Op, offset: u64, len: u64) -> Self {
        Self {
            op,
            offset,
            len,
            flags: Flags::empty(),
        }
    }

    #[must_use]
    pub fn with(self, flags: Flags) -> Self {
        Self {
            flags: self.flags.with(flags),
            ..self
        }
    }
}

/// What a storage can carry out, as a front end offers it to its clients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Abilities {
    /// The storage itself refuses writes (beside an export's own
    /// `read_only`).
    pub read_only: bool,
    pub flush: bool,
    pub fua: bool,
    pub trim: bool,
    pub write_zeroes: bool,
    /// WRITE_ZEROES may be asked to fail rather than be slow.
    pub fast_zero: bool,
    pub cache: bool,
    /// Allocation is known (holes and zeroes); without it every range is
    /// reported as data, which is always correct.
    pub block_status: bool,
    pub rotational: bool,
    /// One object serves every connection, so a flush on any connection
    /// covers writes completed on all of them.
    pub multi_conn: bool,
}

/// The block sizes a storage works in, and the largest payload it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub min_block: u32,
    pub preferred_block: u32,
    pub max_payload: u32,
}

impl Geometry {
    /// Storage on this host: every byte is addressable (no
    /// read-modify-write), 4 KiB preferred, no limit of its own on a
    /// payload (front ends keep theirs).
    pub const ON_HOST: Self = Self {
        min_block: 1,
        preferred_block: 4096,
        max_payload: u32::MAX,
    };
}

/// What a job returns.
#[derive(Debug, Default)]
pub struct Done {
    /// READ data as (offset within the job, bytes), in order, covering
    /// the job exactly.
    pub data: Vec<(u64, Bytes)>,
    /// The allocation a BLOCK STATUS found, from the job's offset (empty
    /// when unknown, which means all data).
    pub extents: Vec<Extent>,
    /// Pieces of a READ's data in pipes instead of `data`, as (offset
    /// within the job, pipes), in order: only ever from
    /// [`Storage::start_piped`], to a front end that can splice them.
    /// With `data` they cover the job exactly.
    pub piped: Vec<(u64, braid_pool::Piped)>,
}

/// A job under way.
pub type Submitted = Pin<Box<dyn Future<Output = Result<Done, Error>> + Send>>;

/// Told a started job's result, once, by whichever task finished it.
pub type Finished = Box<dyn FnOnce(Result<Done, Error>) + Send>;

/// Where an export's operations are carried out.
///
/// An error of kind [`braid_block::ErrorKind::ShuttingDown`] means this
/// server lost the right to use the storage (see [`Backend`]): front ends
/// must not answer it as an ordinary failure.
pub trait Storage: Send + Sync + Debug {
    /// Size in bytes, fixed while served.
    fn size(&self) -> u64;

    fn abilities(&self) -> Abilities;

    fn geometry(&self) -> Geometry {
        Geometry::ON_HOST
    }

    /// Whether the storage failed a cache flush and fails every FLUSH and
    /// FUA write since (see `backend/durable.rs`).
    fn failed(&self) -> bool {
        false
    }

    /// Whether a FLUSH now could make durable anything that is not
    /// already, or has a failure to report: a server that stops skips its
    /// last FLUSH of storage that says no (a multipath volume whose target
    /// is gone would hold the stop until its no-path timeout for a FLUSH
    /// that covers nothing). Storage that cannot tell says yes.
    fn unflushed(&self) -> bool {
        true
    }

    /// The backend on this host behind it, if there is one: its
    /// synchronous calls let front ends answer without a task or a copy
    /// (NBD's in-reader reads, `sendfile` replies, librbd's asynchronous
    /// starts), still through [`crate::exec::run`].
    fn backend(&self) -> Option<&Arc<dyn Backend>> {
        None
    }

    /// Carries out one validated job; WRITE data comes as `payload`.
    /// `writes` is the export's range lock, which writes on this host hold
    /// while they run.
    fn submit(&self, writes: &Arc<RangeLock>, job: Job, payload: Option<Bytes>) -> Submitted;

    /// Carries out one job as [`Self::submit`] does, and tells `done` its
    /// result from whichever task finishes it. Storage whose jobs end on
    /// tasks of its own (a multipath volume's path readers) answers from
    /// there, so that a front end keeps no task waiting per job; the
    /// default waits for [`Self::submit`] on a task.
    fn start(&self, writes: &Arc<RangeLock>, job: Job, payload: Option<Bytes>, done: Finished) {
        let job = self.submit(writes, job, payload);
        tokio::spawn(async move { done(job.await) });
    }

    /// [`Self::start`] for a front end that can splice READ data from a
    /// pipe into its socket: a READ's data may then come back as
    /// [`Done::piped`]. Storage that has no pipes starts the job as usual.
    fn start_piped(
        &self,
        writes: &Arc<RangeLock>,
        job: Job,
        payload: Option<Bytes>,
        done: Finished,
    ) {
        self.start(writes, job, payload, done);
    }
}

/// A backend on this host as storage (the executor carries out its jobs,
/// see `exec.rs`).
#[derive(Debug, Clone)]
pub struct OnHost(pub Arc<dyn Backend>);
