//! Where a validated request goes once its payload is in: submitted to
//! storage with no backend on this host (a multipath volume), held for a
//! test, answered at once from memory,
//! started on an asynchronous backend, or run as a job (inline for memory,
//! on a blocking thread for files); and the per-connection counters its
//! reply adds to.

use braid_pool::Buf;
use braid_proto::{Command, Errno, Request};
use braid_store::exec;
use tracing::warn;

use super::writer::{Outgoing, Permits};
use super::{execute, forwarded, Reader, Reply};
use braid_store::registry::Conn;

impl Reader {
    pub(super) fn dispatch(&self, req: Request, payload: Option<Buf>, permits: Permits) {
        let conn = &self.conn;
        conn.begin();
        let Some(backend) = self.export.storage.backend().cloned() else {
            return self.submit(req, payload, permits);
        };
        if conn.held() {
            // Test hook (Registry::hold): wait off the reader, then run.
            let blocking = self.blocking();
            let held = conn.clone();
            let job = self.job(req, payload, permits);
            tokio::spawn(async move {
                held.wait_unheld().await;
                if blocking {
                    tokio::task::spawn_blocking(job);
                } else {
                    job();
                }
            });
            return;
        }
        if backend.blocking() {
            // Cached data needs no blocking thread: answer it here.
            if !conn.fenced() {
                if let Some(reply) = execute::try_read_now(backend.as_ref(), &self.style, &req) {
                    count(conn, &req, &reply);
                    let _ = self.tx.send(Outgoing {
                        reply,
                        _permits: permits,
                    });
                    conn.end();
                    return;
                }
            }
        }
        let (req, payload, permits) = if backend.blocking() && !conn.fenced() {
            match self.start(&backend, req, payload, permits) {
                Ok(()) => return,
                Err(back) => back,
            }
        } else {
            (req, payload, permits)
        };
        let job = self.job(req, payload, permits);
        if self.blocking() {
            tokio::task::spawn_blocking(job);
        } else {
            job();
        }
    }

    fn blocking(&self) -> bool {
        self.export.storage.backend().is_some_and(|b| b.blocking())
    }

    /// Starts `req` through the executor on storage that has no backend on
    /// this host (a multipath volume); its reply is built and queued by
    /// whichever task finishes it (the volume's path reader), with no task
    /// of its own waiting per request.
    fn submit(&self, req: Request, payload: Option<Buf>, permits: Permits) {
        let (conn, export, style, tx) = (
            self.conn.clone(),
            self.export.clone(),
            self.style.clone(),
            self.tx.clone(),
        );
        let go = move || {
            if conn.fenced() {
                conn.end();
                return;
            }
            let answer = move |reply: Reply| {
                count(&conn, &req, &reply);
                let _ = tx.send(Outgoing {
                    reply,
                    _permits: permits,
                });
                conn.end();
            };
            match execute::job(&req) {
                Some(job) => exec::start(
                    &export,
                    job,
                    payload.map(Buf::into_bytes),
                    style.zero_copy,
                    Box::new(move |done| answer(forwarded::reply(&style, &req, done))),
                ),
                None => answer(execute::error_reply(
                    &style,
                    req.cookie,
                    Errno::Inval,
                    "unknown command",
                )),
            }
        };
        if self.conn.held() {
            // Test hook (Registry::hold): wait off the reader, then start.
            let held = self.conn.clone();
            tokio::spawn(async move {
                held.wait_unheld().await;
                go();
            });
        } else {
            go();
        }
    }

    /// The work of one request: run it unless fenced, send the reply.
    fn job(
        &self,
        req: Request,
        payload: Option<Buf>,
        permits: Permits,
    ) -> impl FnOnce() + Send + 'static {
        let conn = self.conn.clone();
        let export = self.export.clone();
        let style = self.style.clone();
        let tx = self.tx.clone();
        move || {
            // A fence that arrived before this request started drops it.
            if !conn.fenced() {
                let Some(backend) = export.storage.backend() else {
                    unreachable!("storage without a backend here is submitted above");
                };
                // Only FLUSH latency is recorded: a clock read per READ
                // and WRITE showed in the 4 KiB profile for nothing.
                let started = (req.command == Command::Flush).then(std::time::Instant::now);
                let reply = execute::execute(&export, backend, &style, &req, payload);
                if reply.cut {
                    warn!(
                        "{} lost its storage (ESHUTDOWN): closing the connection unanswered \
                         so that the client fails over",
                        export.name
                    );
                    conn.cut();
                    conn.end();
                    return;
                }
                if let Some(started) = started {
                    conn.stats.flush_latency.record(started.elapsed());
                }
                count(&conn, &req, &reply);
                let _ = tx.send(Outgoing {
                    reply,
                    _permits: permits,
                });
            }
            conn.end();
        }
    }
}

pub(super) fn count(conn: &Conn, req: &Request, reply: &Reply) {
    use std::sync::atomic::Ordering::Relaxed;
    let s = &conn.stats;
    if !reply.ok {
        s.errors.fetch_add(1, Relaxed);
        return;
    }
    match req.command {
        Command::Read => {
            s.reads.fetch_add(1, Relaxed);
            s.read_bytes.fetch_add(u64::from(req.length), Relaxed);
        }
        Command::Write => {
            s.writes.fetch_add(1, Relaxed);
            s.written_bytes.fetch_add(u64::from(req.length), Relaxed);
        }
        _ => {
            s.others.fetch_add(1, Relaxed);
        }
    }
}
