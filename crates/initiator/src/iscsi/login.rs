//! Running a login over a stream: `braid-iscsi`'s initiator login fed
//! with Login Responses until the connection is in full feature phase.

use std::time::Duration;

use braid_iscsi::initiator::login::{InitiatorLogin, LoggedIn, LoginConfig, Step};
use braid_iscsi::initiator::wire;
use braid_iscsi::pdu::{Framer, Pdu};
use braid_iscsi::Digests;
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::conn::{ConnectError, Stream};

/// Login PDUs carry at most this much text each way until the login says
/// otherwise (RFC 7143's default MaxRecvDataSegmentLength).
const LOGIN_DATA: usize = 8192;

/// Logs in over `stream`; returns what the login settled and any bytes
/// read past it.
///
/// # Errors
///
/// [`ConnectError::Login`] when the target refuses or breaks the login,
/// [`ConnectError::Io`] or [`ConnectError::Closed`] when the stream
/// fails, [`ConnectError::Timeout`] past `timeout`.
pub async fn login(
    stream: &mut Box<dyn Stream>,
    cfg: LoginConfig,
    endpoint: &str,
    timeout: Duration,
) -> Result<(LoggedIn, BytesMut), ConnectError> {
    let run = async {
        let mut login = InitiatorLogin::new(cfg);
        let framer = Framer::new(LOGIN_DATA);
        let mut buf = BytesMut::with_capacity(LOGIN_DATA);
        let mut next = login.start();
        loop {
            send(stream, &next, endpoint).await?;
            let resp = loop {
                match framer.next(&mut buf) {
                    Ok(Some(p)) => break p,
                    Ok(None) => {}
                    Err(e) => {
                        return Err(ConnectError::Other(format!("{endpoint}: login: {e}")));
                    }
                }
                let n = stream
                    .read_buf(&mut buf)
                    .await
                    .map_err(|source| ConnectError::Io {
                        endpoint: endpoint.to_owned(),
                        source,
                    })?;
                if n == 0 {
                    return Err(ConnectError::Closed(endpoint.to_owned()));
                }
            };
            match login.handle(&resp) {
                Ok(Step::Send(p)) => next = p,
                Ok(Step::Done(done)) => return Ok((*done, buf)),
                Ok(Step::Redirect { address, .. }) => {
                    return Err(ConnectError::Other(format!(
                        "{endpoint}: the target sends this login to {address}; name that portal \
                         with --portal"
                    )))
                }
                Err(source) => {
                    return Err(ConnectError::Login {
                        endpoint: endpoint.to_owned(),
                        source,
                    })
                }
            }
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| ConnectError::Timeout(endpoint.to_owned()))?
}

async fn send(stream: &mut Box<dyn Stream>, pdu: &Pdu, endpoint: &str) -> Result<(), ConnectError> {
    let p = wire::parts(pdu, Digests::default());
    let bytes = [&p.head[..], &p.data[..], p.tail()].concat();
    let io = |source| ConnectError::Io {
        endpoint: endpoint.to_owned(),
        source,
    };
    stream.write_all(&bytes).await.map_err(io)?;
    stream.flush().await.map_err(io)
}
