//! Finding a target's portals from one address: a discovery session asks
//! SendTargets, and every address the answer gives for the target is
//! probed in parallel with a short timeout. Portals that do not answer (a
//! NAS's link-local addresses, NICs on networks this host cannot reach)
//! are left out with a note; the open is never held up longer than one
//! probe.
//!
//! Also here: the exchange of PDUs on a session with no SCSI traffic of
//! its own (discovery, and a fence's reinstating session).

use std::net::SocketAddr;
use std::time::Duration;

use braid_iscsi::initiator::login::Kind;
use braid_iscsi::initiator::sendtargets::{self, Discovered, SEND_TARGETS_ALL};
use braid_iscsi::initiator::session::{Event, Session};
use braid_iscsi::initiator::wire;
use braid_iscsi::pdu::{Framer, Pdu};
use braid_iscsi::Digests;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::open::SessionConfig;
use crate::conn::{self, ConnectError, Local, Stream};
use crate::uri::Endpoint;

/// How long a portal from a SendTargets answer has to accept a TCP
/// connection before it is left out.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The portals of a target, as discovery found them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Portals {
    /// Reachable portals, the one asked first.
    pub reachable: Vec<SocketAddr>,
    /// Addresses left out, each with why.
    pub left_out: Vec<(String, String)>,
    /// The target was not in the answer at all.
    pub unlisted: bool,
}

/// Asks `portal` for every portal of `cfg.target` and probes them.
///
/// # Errors
///
/// The discovery session could not be opened or answered nonsense.
pub async fn portals(
    portal: SocketAddr,
    local: &Local,
    cfg: &SessionConfig,
    timeout: Duration,
) -> Result<Portals, ConnectError> {
    let found = send_targets(portal, local, cfg, timeout).await?;
    let Some(target) = found.into_iter().find(|t| t.name == cfg.target) else {
        return Ok(Portals {
            reachable: vec![portal],
            unlisted: true,
            ..Portals::default()
        });
    };
    let mut out = Portals {
        reachable: vec![portal],
        ..Portals::default()
    };
    let mut probes = tokio::task::JoinSet::new();
    for a in target.addresses {
        let text = a.to_string();
        let port = a.port.unwrap_or(super::DEFAULT_PORT);
        probes.spawn(async move {
            let addr = match tokio::net::lookup_host((a.host.as_str(), port)).await {
                Ok(mut addrs) => addrs.next(),
                Err(e) => return (text, Err(format!("cannot resolve: {e}"))),
            };
            let Some(addr) = addr else {
                return (text, Err("no address".to_owned()));
            };
            let dial =
                tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await;
            let r = match dial {
                Ok(Ok(_)) => Ok(addr),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer in {PROBE_TIMEOUT:?}")),
            };
            (text, r)
        });
    }
    let mut answered = Vec::new();
    while let Some(done) = probes.join_next().await {
        match done {
            Ok((_, Ok(addr))) => answered.push(addr),
            Ok((text, Err(why))) => out.left_out.push((text, why)),
            Err(e) => out.left_out.push(("?".into(), e.to_string())),
        }
    }
    answered.sort();
    for a in answered {
        if !out.reachable.contains(&a) {
            out.reachable.push(a);
        }
    }
    out.left_out.sort();
    Ok(out)
}

/// A discovery session's SendTargets=All answer.
///
/// # Errors
///
/// As [`portals`].
pub async fn send_targets(
    portal: SocketAddr,
    local: &Local,
    cfg: &SessionConfig,
    timeout: Duration,
) -> Result<Vec<Discovered>, ConnectError> {
    let endpoint = portal.to_string();
    let mut stream = conn::dial(&Endpoint::Tcp(portal), local, timeout).await?;
    let login = cfg.login(cfg.next_isid(), Kind::Discovery, rand::random());
    let (logged_in, mut leftover) =
        super::login::login(&mut stream, login, &endpoint, timeout).await?;
    let mut s = Session::new(&logged_in);
    let itt = s.text(Bytes::from_static(SEND_TARGETS_ALL));
    let p = logged_in.params;
    let digests = Digests {
        header: p.header_digest,
        data: p.data_digest,
    };
    let text = tokio::time::timeout(
        timeout,
        exchange(
            &mut stream,
            &mut s,
            &mut leftover,
            digests,
            p.max_recv_data,
            |e| match e {
                Event::Text { itt: t, data } if t == itt => Some(data),
                _ => None,
            },
        ),
    )
    .await
    .map_err(|_| ConnectError::Timeout(endpoint.clone()))?
    .map_err(|e| ConnectError::Other(format!("{endpoint}: SendTargets: {e}")))?;
    s.logout();
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        send_all(&mut stream, &mut s, digests),
    )
    .await;
    sendtargets::parse(&text).map_err(|e| ConnectError::Other(format!("{endpoint}: {e}")))
}

/// Sends what `s` has queued and reads until `want` picks an event;
/// what arrives past it stays in `buf`.
pub(super) async fn exchange<T>(
    stream: &mut Box<dyn Stream>,
    s: &mut Session,
    buf: &mut BytesMut,
    digests: Digests,
    max_recv: u32,
    want: impl Fn(Event) -> Option<T>,
) -> Result<T, String> {
    let mut framer = Framer::new(max_recv as usize);
    framer.set(digests, max_recv as usize);
    loop {
        send_all(stream, s, digests).await?;
        while let Some(pdu) = framer.next(buf).map_err(|e| e.to_string())? {
            s.receive(pdu).map_err(|e| e.to_string())?;
            while let Some(e) = s.poll_event() {
                if let Some(t) = want(e) {
                    return Ok(t);
                }
            }
        }
        send_all(stream, s, digests).await?;
        if stream.read_buf(buf).await.map_err(|e| e.to_string())? == 0 {
            return Err("the target closed the connection".into());
        }
    }
}

async fn send_all(stream: &mut Box<dyn Stream>, s: &mut Session, d: Digests) -> Result<(), String> {
    let pdus: Vec<Pdu> = std::iter::from_fn(|| s.poll_transmit()).collect();
    for p in pdus {
        let parts = wire::parts(&p, d);
        for piece in [&parts.head[..], &parts.data[..], parts.tail()] {
            stream.write_all(piece).await.map_err(|e| e.to_string())?;
        }
    }
    stream.flush().await.map_err(|e| e.to_string())
}
