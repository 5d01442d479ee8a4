//! Replies for storage with no backend on this host (a multipath volume):
//! what the executor brought back, encoded for this connection
//! (structured or simple, DF, contexts).

use braid_proto::reply::encode;
use braid_proto::{CmdFlags, Command, Errno, Request};
use bytes::{Bytes, BytesMut};

use braid_store::Done;

use super::execute::{block_status_reply, error_reply, ok_reply, Reply, ReplyStyle, ZeroCopy};

/// Builds the reply to `req` from what the executor brought back. An
/// error keeps its kind as NBD's errno, storage lost (ESHUTDOWN) included:
/// the volume behind has already failed over where it could.
pub(crate) fn reply(
    style: &ReplyStyle,
    req: &Request,
    result: Result<Done, braid_block::Error>,
) -> Reply {
    let done = match result {
        Ok(done) => done,
        Err(e) => return error_reply(style, req.cookie, Errno::from_kind(e.kind), &e.message),
    };
    match req.command {
        Command::Read => match done.piped {
            Some(piped) => read_piped(style, req, piped),
            None => read(style, req, done.data),
        },
        Command::BlockStatus => block_status_reply(style, req, &done.extents),
        _ => ok_reply(style, req.cookie),
    }
}

/// A READ whose data waits in a pipe: its header, then the pipe spliced
/// into the socket by the writer (copied out first for a writer that
/// cannot splice).
fn read_piped(style: &ReplyStyle, req: &Request, piped: braid_pool::Piped) -> Reply {
    if piped.len() != req.length as usize {
        return error_reply(
            style,
            req.cookie,
            Errno::Io,
            "the volume returned a short read",
        );
    }
    if !style.zero_copy {
        return match piped.into_bytes() {
            Ok(data) => read(style, req, vec![(0, data)]),
            Err(e) => error_reply(style, req.cookie, Errno::Io, &e.to_string()),
        };
    }
    let mut head = Vec::with_capacity(28);
    header(style, req, &mut head);
    Reply {
        parts: vec![Bytes::from(head)],
        file: Some(ZeroCopy::Pipe(piped)),
        ok: true,
        cut: false,
    }
}

/// The header of a READ reply sent whole, in one data chunk.
fn header(style: &ReplyStyle, req: &Request, head: &mut Vec<u8>) {
    if style.structured {
        encode::offset_data_header(head, req.cookie, req.offset, req.length, true);
    } else {
        encode::simple(head, req.cookie, None);
    }
}

fn read(style: &ReplyStyle, req: &Request, data: Vec<(u64, Bytes)>) -> Reply {
    let covered: u64 = data.iter().map(|(_, b)| b.len() as u64).sum();
    if covered != u64::from(req.length) {
        return error_reply(
            style,
            req.cookie,
            Errno::Io,
            "the volume returned a short read",
        );
    }
    if req.length == 0 {
        return ok_reply(style, req.cookie);
    }
    let one_chunk = !style.structured || req.flags.has(CmdFlags::DF) || data.len() <= 1;
    let mut parts = Vec::with_capacity(data.len() * 2);
    if one_chunk {
        let body = if data.len() == 1 {
            data.into_iter().next().map(|(_, b)| b).unwrap_or_default()
        } else {
            let mut b = BytesMut::with_capacity(req.length as usize);
            for (_, piece) in data {
                b.extend_from_slice(&piece);
            }
            b.freeze()
        };
        let mut head = Vec::with_capacity(28);
        header(style, req, &mut head);
        parts.push(Bytes::from(head));
        parts.push(body);
    } else {
        // One data chunk per piece: the pieces go out as they came in,
        // without being copied into one buffer.
        let n = data.len();
        for (i, (at, piece)) in data.into_iter().enumerate() {
            let mut head = Vec::with_capacity(28);
            encode::offset_data_header(
                &mut head,
                req.cookie,
                req.offset + at,
                piece.len() as u32,
                i + 1 == n,
            );
            parts.push(Bytes::from(head));
            parts.push(piece);
        }
    }
    Reply {
        parts,
        file: None,
        ok: true,
        cut: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::reply::{OffsetData, ReplyHeader};
    use braid_proto::Cookie;

    fn req(flags: u16) -> Request {
        Request {
            flags: CmdFlags(flags),
            command: Command::Read,
            cookie: Cookie(4),
            offset: 1000,
            length: 6,
        }
    }

    fn pieces() -> Vec<(u64, Bytes)> {
        vec![
            (0, Bytes::from_static(b"abc")),
            (3, Bytes::from_static(b"def")),
        ]
    }

    fn flatten(r: &Reply) -> Vec<u8> {
        r.parts.iter().flat_map(|p| p.iter().copied()).collect()
    }

    #[test]
    fn pieces_become_data_chunks_at_their_offsets() {
        let style = ReplyStyle {
            structured: true,
            contexts: vec![],
            zero_copy: false,
        };
        let r = read(&style, &req(0), pieces());
        assert_eq!(r.parts.len(), 4);
        let ReplyHeader::Chunk(c) = ReplyHeader::decode(&r.parts[0]).unwrap() else {
            panic!()
        };
        assert!(!c.done());
        assert_eq!(
            OffsetData::decode(r.parts[0][20..28].try_into().unwrap()).offset,
            1000
        );
        let ReplyHeader::Chunk(c) = ReplyHeader::decode(&r.parts[2]).unwrap() else {
            panic!()
        };
        assert!(c.done());
        assert_eq!(
            OffsetData::decode(r.parts[2][20..28].try_into().unwrap()).offset,
            1003
        );
    }

    #[test]
    fn df_and_simple_replies_get_one_body() {
        let structured = ReplyStyle {
            structured: true,
            contexts: vec![],
            zero_copy: false,
        };
        let r = read(&structured, &req(CmdFlags::DF), pieces());
        assert_eq!(r.parts.len(), 2);
        assert_eq!(&flatten(&r)[28..], b"abcdef");
        let simple = ReplyStyle {
            structured: false,
            contexts: vec![],
            zero_copy: false,
        };
        let r = read(&simple, &req(0), pieces());
        assert_eq!(&flatten(&r)[16..], b"abcdef");
    }

    #[test]
    fn short_reads_are_errors() {
        let style = ReplyStyle {
            structured: true,
            contexts: vec![],
            zero_copy: false,
        };
        let r = read(&style, &req(0), vec![(0, Bytes::from_static(b"abc"))]);
        assert!(!r.ok);
    }
}
