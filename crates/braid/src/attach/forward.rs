//! A multipath volume as the storage behind an export: how `braid attach`
//! serves a volume to the kernel, qemu or any local NBD client (and any
//! front end of the store could serve it the same way). Requests arrive
//! already checked by the front end and go through the volume's engine
//! unchanged.

use std::sync::Arc;

use braid_proto::TransmissionFlags;
use braid_store::exec::Job;
use braid_store::rangelock::RangeLock;
use braid_store::{Abilities, Done, Finished, Geometry, Storage, Submitted};
use bytes::Bytes;

use braid_initiator::{Finish, IoError, Request, Volume};

/// The volume as the storage behind an export.
pub struct VolumeForward(pub Arc<Volume>);

impl std::fmt::Debug for VolumeForward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "volume {:?}", self.0.info().export)
    }
}

impl Storage for VolumeForward {
    fn size(&self) -> u64 {
        self.0.info().size
    }

    /// What the export behind offers, less what only concerns how it
    /// answers its own clients.
    fn abilities(&self) -> Abilities {
        let info = self.0.info();
        let has = |f: u16| info.flags.0 & f != 0;
        Abilities {
            read_only: has(TransmissionFlags::READ_ONLY),
            flush: has(TransmissionFlags::SEND_FLUSH),
            fua: has(TransmissionFlags::SEND_FUA),
            trim: has(TransmissionFlags::SEND_TRIM),
            write_zeroes: has(TransmissionFlags::SEND_WRITE_ZEROES),
            fast_zero: has(TransmissionFlags::SEND_FAST_ZERO),
            cache: has(TransmissionFlags::SEND_CACHE),
            block_status: info.block_status,
            rotational: has(TransmissionFlags::ROTATIONAL),
            multi_conn: has(TransmissionFlags::CAN_MULTI_CONN),
        }
    }

    fn geometry(&self) -> Geometry {
        let info = self.0.info();
        Geometry {
            min_block: info.min_block,
            preferred_block: info.preferred_block,
            max_payload: info.max_payload,
        }
    }

    fn unflushed(&self) -> bool {
        self.0.unflushed()
    }

    fn submit(&self, _writes: &Arc<RangeLock>, job: Job, payload: Option<Bytes>) -> Submitted {
        let vol = self.0.clone();
        Box::pin(async move { done(vol.submit(request(job, payload)).await) })
    }

    /// The reply leaves from the path reader that completed the request:
    /// no task waits for it here.
    fn start(&self, _writes: &Arc<RangeLock>, job: Job, payload: Option<Bytes>, tell: Finished) {
        let finish = Finish::new(move |result| tell(done(result)));
        self.0.start(request(job, payload), finish);
    }

    /// As [`Self::start`], and the pieces of a READ that a path answered
    /// whole may come back in pipes, spliced from the path's socket.
    fn start_piped(
        &self,
        _writes: &Arc<RangeLock>,
        job: Job,
        payload: Option<Bytes>,
        tell: Finished,
    ) {
        let finish = Finish::piped(move |result| tell(done(result)));
        self.0.start(request(job, payload), finish);
    }
}

/// The store's job as the volume's request.
fn request(job: Job, write: Option<Bytes>) -> Request {
    Request {
        op: job.op,
        offset: job.offset,
        len: job.len,
        flags: job.flags,
        write,
    }
}

/// What the volume brought back, in the store's terms.
fn done(result: Result<braid_initiator::Done, IoError>) -> Result<Done, braid_block::Error> {
    let done = result.map_err(|e| braid_block::Error::new(e.kind(), e.to_string()))?;
    Ok(Done {
        data: done.data,
        extents: done.extents,
        piped: done.piped,
    })
}
