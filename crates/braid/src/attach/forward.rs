//! A multipath volume as the storage behind an export of braid's NBD
//! target: how `braid attach` serves a volume to the kernel, qemu or any
//! local NBD client. Requests arrive already checked by the target and
//! go through the volume's engine unchanged.

use std::sync::Arc;

use braid_proto::{Errno, Request, TransmissionFlags};
use braid_store::{Forward, ForwardFuture, Forwarded};
use bytes::Bytes;

use braid_initiator::Volume;

/// The volume as the target's forwarded storage.
pub struct VolumeForward(pub Arc<Volume>);

impl std::fmt::Debug for VolumeForward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "volume {:?}", self.0.info().export)
    }
}

impl Forward for VolumeForward {
    fn size(&self) -> u64 {
        self.0.info().size
    }

    fn flags(&self) -> TransmissionFlags {
        // What the export behind offers, less what only concerns how it
        // answers its own clients.
        let keep = TransmissionFlags::READ_ONLY
            | TransmissionFlags::SEND_FLUSH
            | TransmissionFlags::SEND_FUA
            | TransmissionFlags::ROTATIONAL
            | TransmissionFlags::SEND_TRIM
            | TransmissionFlags::SEND_WRITE_ZEROES
            | TransmissionFlags::CAN_MULTI_CONN
            | TransmissionFlags::SEND_CACHE
            | TransmissionFlags::SEND_FAST_ZERO;
        TransmissionFlags(self.0.info().flags.0 & keep)
    }

    fn block_status(&self) -> bool {
        self.0.info().block_status
    }

    fn min_block(&self) -> u32 {
        self.0.info().min_block
    }

    fn preferred_block(&self) -> u32 {
        self.0.info().preferred_block
    }

    fn max_payload(&self) -> u32 {
        self.0.info().max_payload
    }

    fn forward(&self, req: &Request, payload: Option<Bytes>) -> ForwardFuture {
        let vol = self.0.clone();
        let req = *req;
        Box::pin(async move {
            let Some(op) = req.command.op() else {
                return Err((Errno::Inval, "not a forwarded command".into()));
            };
            let done = vol
                .submit(
                    op,
                    req.offset,
                    u64::from(req.length),
                    req.flags.flags(),
                    payload,
                )
                .await
                .map_err(|e| (Errno::from_kind(e.kind()), e.to_string()))?;
            Ok(Forwarded {
                data: done.data,
                extents: done
                    .status
                    .into_iter()
                    .flat_map(|s| s.extents)
                    .map(|e| (e.length, e.flags))
                    .collect(),
            })
        })
    }
}
