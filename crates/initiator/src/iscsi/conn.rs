//! One iSCSI session at work (braid runs one connection per session): a
//! writer task that sends PDUs in batches, with data never copied; a
//! reader task that cuts what arrives into PDUs and hands them to the
//! sans-IO [`Session`]; and the carrying out of what the session reports.
//!
//! The engine's chunks become SCSI commands here ([`Conn::send`]); its
//! probes become NOP-Out pings, so a path's liveness is the session's,
//! not one command's. READ data is held per command until its status is
//! GOOD, so a command sent again (after a unit attention, say) never
//! delivers data twice. What a status means is decided without I/O, in
//! `braid_iscsi::initiator::verdict`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use braid_block::Error;
use braid_iscsi::initiator::sense::{Attention, Verdict};
use braid_iscsi::initiator::session::{AsyncEvent, Command, Event, Outcome, Session, TaskFunction};
use braid_iscsi::initiator::unit::AccessState;
use braid_iscsi::initiator::wire::{self, Parts};
use braid_iscsi::initiator::LoggedIn;
use braid_iscsi::pdu::Framer;
use braid_iscsi::Digests;
use braid_proto::Cookie;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{info, Instrument};

use braid_iscsi::initiator::verdict::{self, Next};

use super::chunk;
use crate::conn::{Stream, Wire};
use crate::engine::SendChunk;
use crate::sink::Sink;

/// What commands need to know of the unit.
#[derive(Clone, Copy, Debug)]
pub struct UnitIo {
    pub lun: u64,
    pub block_size: u32,
}

/// The answer to a command braid sends for itself (INQUIRY, RTPG, ...).
#[derive(Clone, Debug)]
pub struct Answer {
    pub outcome: Outcome,
    pub data: Bytes,
}

/// Who waits for a task.
enum Waiter {
    Chunk(Pending),
    /// An engine probe, sent as a NOP-Out ping.
    Ping(Cookie),
    Call {
        tx: oneshot::Sender<Answer>,
        data: Vec<(u32, Bytes)>,
    },
    Management(oneshot::Sender<u8>),
    Logout(oneshot::Sender<u8>),
}

/// An engine chunk as a SCSI command, kept to be sent again if needed.
pub(super) struct Pending {
    pub cookie: Cookie,
    /// Absolute volume offset of the command's first byte.
    pub base: u64,
    pub cmd: Command,
    pub attempts: u32,
    pub data: Vec<(u32, Bytes)>,
}

struct State {
    session: Session,
    waiters: HashMap<u32, Waiter>,
    replies: Option<Arc<dyn Sink>>,
    gone: Option<String>,
}

struct Inner {
    state: Mutex<State>,
    tx: mpsc::UnboundedSender<Parts>,
    digests: Digests,
    pub unit: Mutex<UnitIo>,
    /// The unit attention of a LOGICAL UNIT RESET this initiator's own
    /// fence sent is owed to this session: the first reset it hears is
    /// that one, which lost nothing, not a restart.
    owed_reset: AtomicBool,
}

/// What the reader does once the session's lock is released.
enum Deferred {
    Data(Cookie, u64, Bytes),
    Done(Cookie, Option<Error>),
    Elsewhere(Cookie, AccessState),
    Attention(Attention),
    Again(Pending, Duration),
    Lost(String),
}

/// A running session.
pub struct Conn {
    inner: Arc<Inner>,
    reader: JoinHandle<()>,
    writer: Option<JoinHandle<()>>,
    socket: Option<std::os::fd::OwnedFd>,
    pub logged_in: LoggedIn,
}

impl Conn {
    /// Starts the tasks of a logged-in connection. Replies to engine
    /// chunks go nowhere until [`Self::attach`].
    pub fn start(
        stream: Box<dyn Stream>,
        leftover: BytesMut,
        logged_in: LoggedIn,
        unit: UnitIo,
    ) -> Self {
        let p = logged_in.params;
        let digests = Digests {
            header: p.header_digest,
            data: p.data_digest,
        };
        let socket = crate::conn::dup_socket(stream.as_ref());
        let (rd, wr) = tokio::io::split(stream);
        let (tx, rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                session: Session::new(&logged_in),
                waiters: HashMap::new(),
                replies: None,
                gone: None,
            }),
            tx,
            digests,
            unit: Mutex::new(unit),
            owed_reset: AtomicBool::new(false),
        });
        let mut framer = Framer::new(p.max_recv_data as usize);
        framer.set(digests, p.max_recv_data as usize);
        let writer = tokio::spawn(write_loop(wr, rx, Arc::downgrade(&inner)).in_current_span());
        let reader =
            tokio::spawn(read_loop(rd, leftover, framer, Arc::downgrade(&inner)).in_current_span());
        Self {
            inner,
            reader,
            writer: Some(writer),
            socket,
            logged_in,
        }
    }

    /// Replies to engine chunks go to `replies` from now on.
    pub fn attach(&self, replies: Arc<dyn Sink>) {
        let gone = {
            let mut st = self.inner.lock();
            st.replies = Some(replies.clone());
            st.gone.clone()
        };
        if let Some(reason) = gone {
            replies.lost(reason);
        }
    }

    /// Sends an engine chunk: a SCSI command, or a ping for a probe.
    /// `false` if the connection is gone.
    pub fn send(&self, s: &SendChunk, payload: Option<Bytes>) -> bool {
        let unit = *self.inner.unit.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = self.inner.lock();
        if st.gone.is_some() {
            return false;
        }
        if s.req.is_none() {
            let itt = st.session.ping();
            st.waiters.insert(itt, Waiter::Ping(s.cookie));
        } else {
            let Some(cmd) = chunk::command(s, payload, unit.lun, unit.block_size) else {
                return false;
            };
            let itt = st.session.submit(cmd.clone());
            st.waiters.insert(
                itt,
                Waiter::Chunk(Pending {
                    cookie: s.cookie,
                    base: s.offset,
                    cmd,
                    attempts: 0,
                    data: Vec::new(),
                }),
            );
        }
        self.inner.flush(&mut st);
        true
    }

    /// Sends a command for braid itself and waits for its answer.
    ///
    /// # Errors
    ///
    /// The connection ended or `timeout` passed.
    pub async fn call(&self, cmd: Command, timeout: Duration) -> Result<Answer, String> {
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.inner.lock();
            if let Some(why) = &st.gone {
                return Err(why.clone());
            }
            let itt = st.session.submit(cmd);
            st.waiters.insert(
                itt,
                Waiter::Call {
                    tx,
                    data: Vec::new(),
                },
            );
            self.inner.flush(&mut st);
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(a)) => Ok(a),
            Ok(Err(_)) => Err(self
                .inner
                .lock()
                .gone
                .clone()
                .unwrap_or_else(|| "the connection ended".into())),
            Err(_) => Err(format!("no answer in {timeout:?}")),
        }
    }

    /// Sends a task management request and waits for its response code
    /// (0: function complete).
    ///
    /// # Errors
    ///
    /// The connection ended or `timeout` passed.
    pub async fn manage(&self, f: TaskFunction, timeout: Duration) -> Result<u8, String> {
        let (tx, rx) = oneshot::channel();
        {
            let lun = self
                .inner
                .unit
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .lun;
            let mut st = self.inner.lock();
            let itt =
                st.session
                    .task_management(f, lun, braid_iscsi::initiator::session::RESERVED_TAG);
            st.waiters.insert(itt, Waiter::Management(tx));
            self.inner.flush(&mut st);
        }
        tokio::time::timeout(timeout, rx)
            .await
            .map_err(|_| format!("no answer to {f:?} in {timeout:?}"))?
            .map_err(|_| "the connection ended".to_owned())
    }

    /// Logs out (bounded by `timeout`); the target then closes.
    pub async fn logout(&self, timeout: Duration) {
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.inner.lock();
            if st.gone.is_some() {
                return;
            }
            let itt = st.session.logout();
            st.waiters.insert(itt, Waiter::Logout(tx));
            self.inner.flush(&mut st);
        }
        let _ = tokio::time::timeout(timeout, rx).await;
    }

    /// The next reset this session hears is the one a fence of this
    /// initiator is about to send (tgt's LOGICAL UNIT RESET).
    pub fn owe_reset(&self) {
        self.inner.owed_reset.store(true, Ordering::Release);
    }

    /// The LUN field the session's commands carry.
    pub fn lun(&self) -> u64 {
        self.inner
            .unit
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .lun
    }

    /// The unit's logical block size, once READ CAPACITY has told it.
    pub fn set_block_size(&self, block_size: u32) {
        self.inner
            .unit
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .block_size = block_size;
    }

    /// The kernel's figures of the connection.
    pub fn wire(&self) -> Option<Wire> {
        crate::conn::tcp_info(std::os::fd::AsRawFd::as_raw_fd(self.socket.as_ref()?))
    }

    /// Commands the target accepts now beyond those sent.
    pub fn window(&self) -> u32 {
        self.inner.lock().session.window()
    }

    /// Drops the connection at once.
    pub fn abort(&self) {
        self.reader.abort();
        if let Some(w) = &self.writer {
            w.abort();
        }
    }

    /// Logs out, bounded, then drops the connection.
    pub async fn finish(mut self, timeout: Duration) {
        self.logout(timeout).await;
        if let Some(w) = self.writer.take() {
            w.abort();
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.abort();
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands what the session wants sent to the writer.
    fn flush(&self, st: &mut State) {
        while let Some(p) = st.session.poll_transmit() {
            let _ = self.tx.send(wire::parts(&p, self.digests));
        }
    }

    /// Sends a chunk's command again, as a new task.
    fn again(&self, mut p: Pending) {
        let mut st = self.lock();
        if st.gone.is_some() {
            return;
        }
        p.attempts += 1;
        p.data.clear();
        let itt = st.session.submit(p.cmd.clone());
        st.waiters.insert(itt, Waiter::Chunk(p));
        self.flush(&mut st);
    }

    /// Takes the session's events and decides what follows from each;
    /// the caller carries it out once the lock is released.
    fn events(&self, st: &mut State, out: &mut Vec<Deferred>) {
        while let Some(e) = st.session.poll_event() {
            match e {
                Event::Data { itt, offset, data } => match st.waiters.get_mut(&itt) {
                    Some(Waiter::Chunk(p)) => p.data.push((offset, data)),
                    Some(Waiter::Call { data: d, .. }) => d.push((offset, data)),
                    _ => {}
                },
                Event::Complete { itt, outcome } => match st.waiters.remove(&itt) {
                    Some(Waiter::Chunk(p)) => out.extend(chunk_done(p, outcome)),
                    Some(Waiter::Call { tx, data }) => {
                        let _ = tx.send(Answer {
                            outcome,
                            data: join(data),
                        });
                    }
                    _ => {}
                },
                Event::Pong { itt } => {
                    if let Some(Waiter::Ping(cookie)) = st.waiters.remove(&itt) {
                        out.push(Deferred::Done(cookie, None));
                    }
                }
                Event::TaskManagement { itt, response } => {
                    if let Some(Waiter::Management(tx)) = st.waiters.remove(&itt) {
                        let _ = tx.send(response);
                    }
                }
                Event::Logout { itt, response } => {
                    if let Some(Waiter::Logout(tx)) = st.waiters.remove(&itt) {
                        let _ = tx.send(response);
                    }
                }
                Event::Text { .. } => {}
                Event::Async(a) => out.extend(async_event(a)),
            }
        }
    }

    /// The connection ended: every waiter learns it.
    fn end(&self, reason: String) -> Vec<Deferred> {
        let mut st = self.lock();
        if st.gone.is_some() {
            return Vec::new();
        }
        st.gone = Some(reason.clone());
        // Dropping the senders wakes the calls; chunks are the engine's to
        // move once it hears the path was lost.
        st.waiters.clear();
        vec![Deferred::Lost(reason)]
    }

    fn carry_out(self: &Arc<Self>, deferred: Vec<Deferred>) {
        if deferred.is_empty() {
            return;
        }
        let replies = self.lock().replies.clone();
        for d in deferred {
            match (d, &replies) {
                (Deferred::Again(p, delay), _) => {
                    let weak = Arc::downgrade(self);
                    tokio::spawn(
                        async move {
                            tokio::time::sleep(delay).await;
                            if let Some(inner) = weak.upgrade() {
                                inner.again(p);
                            }
                        }
                        .in_current_span(),
                    );
                }
                (_, None) => {}
                (Deferred::Data(c, off, data), Some(r)) => r.data(c, Some(off), data),
                (Deferred::Done(c, e), Some(r)) => r.done(c, e),
                (Deferred::Elsewhere(c, s), Some(r)) => r.elsewhere(c, chunk::access(s)),
                (Deferred::Attention(Attention::Reset), Some(_))
                    if self.owed_reset.swap(false, Ordering::AcqRel) =>
                {
                    info!("the unit was reset by this volume's own fence (29h): nothing to replay");
                }
                (Deferred::Attention(a), Some(r)) => {
                    if let Some(s) = chunk::signal_of(a) {
                        r.signal(s);
                    }
                }
                (Deferred::Lost(why), Some(r)) => r.lost(why),
            }
        }
    }
}

/// What follows from a chunk's outcome.
fn chunk_done(p: Pending, o: Outcome) -> Vec<Deferred> {
    match verdict::judge(&p.cmd, p.attempts, &o) {
        Next::Good => {
            let mut out: Vec<Deferred> = p
                .data
                .into_iter()
                .map(|(off, d)| Deferred::Data(p.cookie, p.base + u64::from(off), d))
                .collect();
            out.push(Deferred::Done(p.cookie, None));
            out
        }
        Next::Fail(kind, why) => vec![Deferred::Done(p.cookie, Some(Error::new(kind, why)))],
        Next::Again(delay, attention) => {
            let mut out: Vec<Deferred> = attention.into_iter().map(Deferred::Attention).collect();
            out.push(Deferred::Again(p, delay));
            out
        }
        Next::Elsewhere(state) => vec![Deferred::Elsewhere(p.cookie, state)],
    }
}

/// What an asynchronous message asks of the path.
fn async_event(a: AsyncEvent) -> Option<Deferred> {
    match a {
        AsyncEvent::Scsi { sense, .. } => match sense.map(|s| s.verdict()) {
            Some(Verdict::Attention(att)) => Some(Deferred::Attention(att)),
            _ => None,
        },
        // The path ends and comes back in a new session: what was in
        // flight goes elsewhere meanwhile.
        AsyncEvent::LogoutRequested { .. } => {
            Some(Deferred::Lost("the target asked for a logout".into()))
        }
        AsyncEvent::Dropping { .. } => Some(Deferred::Lost(
            "the target announced it drops the connection".into(),
        )),
        AsyncEvent::Other(_) => None,
    }
}

/// A command's Data-In pieces as one buffer (they arrive in order).
fn join(mut data: Vec<(u32, Bytes)>) -> Bytes {
    if data.len() == 1 {
        return data.pop().expect("one piece").1;
    }
    let mut b = BytesMut::new();
    for (_, d) in data {
        b.extend_from_slice(&d);
    }
    b.freeze()
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<Parts>,
    inner: Weak<Inner>,
) {
    let result: std::io::Result<()> = async {
        let mut batch: Vec<Parts> = Vec::with_capacity(braid_pool::BATCH);
        let mut pace = braid_pool::Pace::new();
        while braid_pool::next_batch(&mut rx, &mut batch).await {
            let slices: Vec<&[u8]> = batch
                .iter()
                .flat_map(|p| [&p.head[..], &p.data[..], p.tail()])
                .filter(|s| !s.is_empty())
                .collect();
            braid_pool::write_all_vectored(&mut wr, &slices, &mut pace, None).await?;
            batch.clear();
        }
        wr.shutdown().await
    }
    .await;
    if let (Err(e), Some(inner)) = (result, inner.upgrade()) {
        let d = inner.end(format!("write failed: {e}"));
        inner.carry_out(d);
    }
}

async fn read_loop<R: AsyncRead + Unpin>(
    mut rd: R,
    mut buf: BytesMut,
    framer: Framer,
    inner: Weak<Inner>,
) {
    let reason = loop {
        let Some(this) = inner.upgrade() else { return };
        let mut deferred = Vec::new();
        let failed = {
            let mut st = this.lock();
            let mut failed = None;
            loop {
                match framer.next(&mut buf) {
                    Ok(Some(pdu)) => {
                        if let Err(e) = st.session.receive(pdu) {
                            failed = Some(e.to_string());
                            break;
                        }
                        this.events(&mut st, &mut deferred);
                        this.flush(&mut st);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        failed = Some(format!("iSCSI framing: {e}"));
                        break;
                    }
                }
            }
            failed
        };
        this.carry_out(deferred);
        if let Some(why) = failed {
            break why;
        }
        drop(this);
        if buf.capacity() - buf.len() < 64 * 1024 {
            buf.reserve(256 * 1024);
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) => break "the target closed the connection".to_owned(),
            Ok(_) => {}
            Err(e) => break format!("read failed: {e}"),
        }
    };
    if let Some(inner) = inner.upgrade() {
        let d = inner.end(reason);
        inner.carry_out(d);
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "iscsi::Conn(isid {})", self.logged_in.isid)
    }
}
