//! A READ reply's payload off the connection into a pooled buffer: what
//! the reply reader already holds, then the rest, read straight into the
//! buffer when it is long.

use std::io;

use bytes::Bytes;
use tokio::io::{AsyncBufRead, AsyncRead, AsyncReadExt, BufReader};

/// A payload remainder at least this long is read from the socket into
/// the payload's buffer directly; a shorter one through the reader's
/// buffer, so that the same read takes in the replies behind it.
const DIRECT: usize = 16 * 1024;

/// Reads an `n`-byte payload into a pooled buffer (no page faults or
/// zeroing per chunk). What the reader's buffer already holds is copied
/// over; a long rest is read from the socket straight into the payload's
/// buffer, not into the reader's first, which would copy it twice.
pub(super) async fn read_bytes<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    n: usize,
) -> Result<Bytes, String> {
    let mut buf = braid_pool::Pool::global().get(n);
    let have = rd.buffer().len().min(n);
    buf[..have].copy_from_slice(&rd.buffer()[..have]);
    std::pin::Pin::new(&mut *rd).consume(have);
    read_rest(rd, &mut buf[have..]).await?;
    Ok(buf.into_bytes())
}

/// Fills `rest` from the reader, whose buffer holds none of it.
pub(super) async fn read_rest<R: AsyncRead + Unpin>(
    rd: &mut BufReader<R>,
    rest: &mut [u8],
) -> Result<(), String> {
    let read = if rest.len() >= DIRECT {
        rd.get_mut().read_exact(rest).await
    } else {
        rd.read_exact(rest).await
    };
    read.map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            "the server closed the connection mid-reply".to_string()
        } else {
            format!("read failed: {e}")
        }
    })?;
    Ok(())
}
