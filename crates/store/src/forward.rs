//! Exports whose requests are carried out elsewhere, asynchronously: what
//! `braid attach` serves, with a multipath volume behind it. The target's
//! front end (handshake, validation, replies) is the same as for local
//! backends; only the execution differs.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;

use braid_proto::{Errno, Request, TransmissionFlags};
use bytes::Bytes;

/// What a forwarded request returns.
#[derive(Debug, Default)]
pub struct Forwarded {
    /// READ data as (offset within the request, bytes), in order, covering
    /// the request exactly.
    pub data: Vec<(u64, Bytes)>,
    /// `base:allocation` extents for BLOCK_STATUS, from the request's offset.
    pub extents: Vec<(u32, u32)>,
}

/// A boxed future of a forwarded request.
pub type ForwardFuture = Pin<Box<dyn Future<Output = Result<Forwarded, (Errno, String)>> + Send>>;

/// Storage reached through another NBD export.
pub trait Forward: Send + Sync + Debug {
    fn size(&self) -> u64;
    /// The flags of the export behind: what may be offered to clients.
    fn flags(&self) -> TransmissionFlags;
    /// `base:allocation` can be answered.
    fn block_status(&self) -> bool;
    fn min_block(&self) -> u32;
    fn preferred_block(&self) -> u32;
    fn max_payload(&self) -> u32;
    /// Carries out one validated request; WRITE data comes as `payload`.
    fn forward(&self, req: &Request, payload: Option<Bytes>) -> ForwardFuture;
}
