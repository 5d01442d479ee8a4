//! READs and WRITEs on a backend with asynchronous I/O (librbd's aio):
//! started from the reader with no thread waiting for them, and answered
//! from the backend's completion. On a blocking thread each request cost
//! a wake-up to start it, librbd's own wait inside the synchronous call and
//! a wake-up to end it.
//!
//! What the synchronous path guarantees holds here too: a request begins
//! (counted in flight, so a fence's drain waits for it) before it starts
//! and ends only once its completion has answered; a WRITE holds its range
//! beside other writers until then; a backend that lost the storage
//! (`ESHUTDOWN`) gets the connection closed unanswered.

use std::io;
use std::sync::Arc;

use braid_pool::{Buf, Pool};
use braid_proto::{Command, Request};
use tokio::sync::mpsc;
use tracing::warn;

use super::dispatch::count;
use super::execute::{self, ReplyStyle};
use super::writer::{Outgoing, Permits};
use super::Reader;
use crate::backend::{Backend, Done};
use crate::export::Export;
use braid_store::registry::Conn;

/// What a started request needs to answer from another thread.
struct Answer {
    conn: Arc<Conn>,
    export: Arc<Export>,
    style: Arc<ReplyStyle>,
    tx: mpsc::UnboundedSender<Outgoing>,
}

/// A range of the export's writers held until dropped (see
/// [`braid_store::rangelock::RangeLock::try_shared`]).
struct Held {
    export: Arc<Export>,
    id: u64,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.export.writes.release(self.id);
    }
}

impl Reader {
    /// Starts `req` if it is a READ or a WRITE the backend can start
    /// (where it declines after all, a blocking thread runs it), and
    /// `finish` answers it. Gives the request back otherwise, or when a
    /// COMPARE AND WRITE holds or waits for its range (the caller runs it
    /// the synchronous way, which waits). The caller has begun it on the
    /// connection; `finish` ends it.
    pub(super) fn start(
        &self,
        backend: &Arc<dyn Backend>,
        req: Request,
        payload: Option<Buf>,
        permits: Permits,
    ) -> Result<(), (Request, Option<Buf>, Permits)> {
        match (req.command, payload) {
            (Command::Read, None) if req.length > 0 && backend.can_start_read() => {
                let buf = Pool::global().get(req.length as usize);
                let done = finish(self.answer(), req, permits, None);
                if let Err((mut buf, done)) = backend.start_read(buf, req.offset, done) {
                    let b = backend.clone();
                    tokio::task::spawn_blocking(move || {
                        let r = b.read_at(&mut buf, req.offset);
                        done(buf, r);
                    });
                }
                Ok(())
            }
            (Command::Write, Some(data)) if backend.can_start_write(req.flags.fua()) => {
                let writes = &self.export.writes;
                let Some(id) = writes.try_shared(req.offset, u64::from(req.length)) else {
                    return Err((req, Some(data), permits));
                };
                let held = Held {
                    export: self.export.clone(),
                    id,
                };
                let fua = req.flags.fua();
                let done = finish(self.answer(), req, permits, Some(held));
                if let Err((data, done)) = backend.start_write(data, req.offset, fua, done) {
                    let b = backend.clone();
                    tokio::task::spawn_blocking(move || {
                        let r = b.write_at(&data, req.offset, fua);
                        done(data, r);
                    });
                }
                Ok(())
            }
            (_, payload) => Err((req, payload, permits)),
        }
    }

    /// Built only for a request that starts: the file backends' requests
    /// pay for none of these copies.
    fn answer(&self) -> Answer {
        Answer {
            conn: self.conn.clone(),
            export: self.export.clone(),
            style: self.style.clone(),
            tx: self.tx.clone(),
        }
    }
}

/// The answer to a started request, run once it is over.
fn finish(a: Answer, req: Request, permits: Permits, held: Option<Held>) -> Done {
    Box::new(move |data: Buf, result: io::Result<()>| {
        // The write is over: its range is free for a COMPARE AND WRITE.
        drop(held);
        let reply = execute::data_reply(&a.style, &req, data, result);
        if reply.cut {
            warn!(
                "{} lost its storage (ESHUTDOWN): closing the connection unanswered \
                 so that the client fails over",
                a.export.name
            );
            a.conn.cut();
        } else {
            count(&a.conn, &req, &reply);
            let _ = a.tx.send(Outgoing {
                reply,
                _permits: permits,
            });
        }
        a.conn.end();
    })
}
