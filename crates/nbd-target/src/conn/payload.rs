//! WRITE payloads off the socket: read whole into one buffer (a write is
//! applied only once all of it has arrived, so a client that vanishes half
//! way through changes nothing), or read and dropped after a refusal.

use braid_pool::{Buf, Pool};
use bytes::{Buf as _, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Reads a `len`-byte payload, starting with what `buf` already holds.
pub(super) async fn read_payload<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    len: usize,
) -> std::io::Result<Buf> {
    // The length was checked against the maximum payload and its bytes
    // taken from the connection's and the server's budgets: the buffer is
    // bounded before it is taken.
    let mut payload = Pool::global().get(len);
    let have = buf.len().min(len);
    payload[..have].copy_from_slice(&buf[..have]);
    buf.advance(have);
    rd.read_exact(&mut payload[have..]).await?;
    Ok(payload)
}

/// Reads and drops `len` payload bytes, starting with what `buf` holds.
pub(super) async fn discard<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    mut len: u64,
) -> std::io::Result<()> {
    let have = (buf.len() as u64).min(len) as usize;
    buf.advance(have);
    len -= have as u64;
    let mut sink = [0u8; 16 * 1024];
    while len > 0 {
        let n = (len as usize).min(sink.len());
        rd.read_exact(&mut sink[..n]).await?;
        len -= n as u64;
    }
    Ok(())
}
