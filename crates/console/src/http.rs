//! The listener: accepts (with TLS when configured), speaks HTTP/1.1
//! through hyper, routes, guards, and streams updates to open pages.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONNECTION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, Semaphore};
use tracing::{debug, info, warn};

use crate::{Action, Error, EventView, Guard, Settings, Source, ASSETS};

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// At most this many connections at once (pages, scrapes, streams).
const MAX_CONNECTIONS: usize = 64;
/// The largest action body read.
const MAX_ACTION: usize = 4096;
/// How often an open page is sent the figures: twice a second, so a
/// change shows within about half a second beyond the rates' own window.
const PUSH_EVERY: Duration = Duration::from_millis(500);

/// A started listener.
#[derive(Debug)]
pub struct Listening {
    pub addr: SocketAddr,
    pub tls: bool,
}

struct Ctx {
    source: Arc<dyn Source>,
    guard: Guard,
    events: broadcast::Sender<EventView>,
}

/// Binds `settings.addr` and serves until the process ends.
///
/// # Errors
///
/// The address cannot be bound.
pub async fn listen(settings: Settings, source: Arc<dyn Source>) -> Result<Listening, Error> {
    let addr = settings.addr;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let addr = listener.local_addr().unwrap_or(addr);
    let tls = settings.tls.map(tokio_rustls::TlsAcceptor::from);
    let ctx = Arc::new(Ctx {
        source,
        guard: Guard::new(settings.token, addr.ip().is_loopback(), tls.is_some()),
        events: settings.events,
    });
    let listening = Listening {
        addr,
        tls: tls.is_some(),
    };
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let (stream, peer) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    debug!("http accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let ctx = ctx.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let _permit = permit;
                match tls {
                    Some(acceptor) => {
                        let shake =
                            tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream));
                        match shake.await {
                            Ok(Ok(s)) => connection(TokioIo::new(s), ctx, peer).await,
                            Ok(Err(e)) => debug!(%peer, "http TLS handshake: {e}"),
                            Err(_) => debug!(%peer, "http TLS handshake timed out"),
                        }
                    }
                    None => connection(TokioIo::new(stream), ctx, peer).await,
                }
            });
        }
    });
    Ok(listening)
}

async fn connection<I>(io: I, ctx: Arc<Ctx>, peer: SocketAddr)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let ctx = ctx.clone();
        async move { Ok::<_, Infallible>(route(req, &ctx, peer).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .serve_connection(io, service)
        .await;
    if let Err(e) = served {
        debug!(%peer, "http: {e}");
    }
}

fn full(status: StatusCode, kind: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).boxed());
    *r.status_mut() = status;
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(kind) {
        h.insert(CONTENT_TYPE, v);
    }
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    r
}

fn text(status: StatusCode, msg: impl std::fmt::Display) -> Response<Body> {
    full(status, "text/plain; charset=utf-8", format!("{msg}\n"))
}

fn json(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    full(status, "application/json", v.to_string())
}

/// The page's own rules for what it may load and where it may post.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; frame-ancestors 'none'; form-action 'none'; base-uri 'none'";

async fn route(req: Request<Incoming>, ctx: &Ctx, peer: SocketAddr) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().map(str::to_owned);
    let method = req.method().clone();
    let read = || ctx.guard.read(req.headers(), query.as_deref());
    match (&method, path.as_str()) {
        (&Method::GET, "/metrics") => {
            // Closed after each scrape, as the responder before this one
            // did: scrapers and the tests that read to the end rely on it.
            let mut r = match ctx.source.metrics() {
                Ok(t) => full(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    t,
                ),
                Err(e) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("encoding the metrics failed: {e}"),
                ),
            };
            r.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            r
        }
        (&Method::GET, "/") => match read() {
            Ok(()) => {
                let snap = ctx.source.snapshot();
                let mut r = full(
                    StatusCode::OK,
                    "text/html; charset=utf-8",
                    crate::render(&snap, ctx.guard.actions_on()),
                );
                let h = r.headers_mut();
                h.insert("content-security-policy", HeaderValue::from_static(CSP));
                h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
                r
            }
            Err(d) => text(d.status(), d),
        },
        (&Method::GET, "/api/snapshot") => match read() {
            Ok(()) => json(
                StatusCode::OK,
                &serde_json::to_value(ctx.source.snapshot()).unwrap_or_default(),
            ),
            Err(d) => text(d.status(), d),
        },
        (&Method::GET, "/events") => match read() {
            Ok(()) => push(ctx),
            Err(d) => text(d.status(), d),
        },
        (&Method::POST, "/api/action") => action(req, ctx, peer).await,
        (&Method::GET, "/favicon.ico") => text(StatusCode::NO_CONTENT, ""),
        (&Method::GET, p) => match ASSETS.iter().find(|(at, _, _)| *at == p) {
            Some((_, kind, body)) => {
                let mut r = full(StatusCode::OK, kind, *body);
                r.headers_mut()
                    .insert(CACHE_CONTROL, HeaderValue::from_static("max-age=3600"));
                r
            }
            None => text(
                StatusCode::NOT_FOUND,
                "not here: the console is at /, the Prometheus scrape at /metrics",
            ),
        },
        _ => text(
            StatusCode::METHOD_NOT_ALLOWED,
            "the console reads with GET and acts with POST /api/action",
        ),
    }
}

async fn action(req: Request<Incoming>, ctx: &Ctx, peer: SocketAddr) -> Response<Body> {
    if let Err(d) = ctx.guard.action(req.headers()) {
        warn!(%peer, "console action refused: {d}");
        return json(
            d.status(),
            &serde_json::json!({"ok": false, "error": d.to_string()}),
        );
    }
    let body = match Limited::new(req.into_body(), MAX_ACTION).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return json(
                StatusCode::BAD_REQUEST,
                &serde_json::json!({"ok": false, "error": format!("reading the action: {e}")}),
            )
        }
    };
    let action: Action = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            warn!(%peer, "console action refused: not an action: {e}");
            return json(
                StatusCode::BAD_REQUEST,
                &serde_json::json!({"ok": false, "error": format!("not an action: {e}")}),
            );
        }
    };
    match ctx.source.act(&action) {
        Ok(done) => {
            info!(%peer, ?action, "console action: {done}");
            json(
                StatusCode::OK,
                &serde_json::json!({"ok": true, "done": done}),
            )
        }
        Err(e) => {
            warn!(%peer, ?action, "console action failed: {e}");
            json(
                StatusCode::CONFLICT,
                &serde_json::json!({"ok": false, "error": e}),
            )
        }
    }
}

/// The push stream: the figures and parts every [`PUSH_EVERY`], and at
/// once after each timeline event.
fn push(ctx: &Ctx) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    let source = ctx.source.clone();
    let actions = ctx.guard.actions_on();
    let mut events = Some(ctx.events.subscribe());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let event = async {
                match events.as_mut() {
                    Some(rx) => Some(rx.recv().await),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tick.tick() => {}
                got = event => {
                    if let Some(Err(broadcast::error::RecvError::Closed)) = got {
                        events = None;
                    }
                }
            }
            let snap = source.snapshot();
            let data = crate::update(&snap, actions);
            let frame = Bytes::from(format!("event: update\ndata: {data}\n\n"));
            // A page that left (or stopped reading) ends its stream.
            if tx.send(frame).await.is_err() {
                return;
            }
        }
    });
    let mut r = Response::new(BodyExt::boxed(Push(rx)));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// A body fed by the push task.
struct Push(mpsc::Receiver<Bytes>);

impl hyper::body::Body for Push {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}
