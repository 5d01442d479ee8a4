//! Replies for storage with no backend on this host (a multipath volume):
//! what the executor brought back, encoded for this connection
//! (structured or simple, DF, contexts).

use braid_proto::reply::encode;
use braid_proto::{CmdFlags, Command, Errno, Request};
use bytes::{Bytes, BytesMut};

use braid_store::Done;

use super::execute::{
    block_status_reply, error_reply, ok_reply, Piece, Reply, ReplyStyle, ZeroCopy,
};

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
        Command::Read if done.piped.is_empty() => read(style, req, done.data),
        Command::Read => read_piped(style, req, done.data, done.piped),
        Command::BlockStatus => block_status_reply(style, req, &done.extents),
        _ => ok_reply(style, req.cookie),
    }
}

/// A READ some of whose pieces wait in pipes: the headers and the pieces
/// in bytes go out with `writev`, the pipes are spliced into the socket by
/// the writer (copied out first for a writer that cannot splice). The
/// chunks are those [`read`] makes of the same pieces.
fn read_piped(
    style: &ReplyStyle,
    req: &Request,
    mut data: Vec<(u64, Bytes)>,
    piped: Vec<(u64, braid_pool::Piped)>,
) -> Reply {
    if !style.zero_copy {
        for (at, p) in piped {
            match p.into_bytes() {
                Ok(bytes) => data.push((at, bytes)),
                Err(e) => return error_reply(style, req.cookie, Errno::Io, &e.to_string()),
            }
        }
        data.sort_by_key(|(at, _)| *at);
        return read(style, req, data);
    }
    let mut pieces: Vec<(u64, usize, Piece)> = data
        .into_iter()
        .map(|(at, b)| (at, b.len(), Piece::Mem(b)))
        .chain(
            piped
                .into_iter()
                .map(|(at, p)| (at, p.len(), Piece::Pipe(p))),
        )
        .collect();
    pieces.sort_by_key(|(at, _, _)| *at);
    let mut end = 0u64;
    for (at, len, _) in &pieces {
        if *at != end {
            break;
        }
        end += *len as u64;
    }
    if end != u64::from(req.length) {
        return error_reply(
            style,
            req.cookie,
            Errno::Io,
            "the volume returned a short read",
        );
    }
    let one_chunk = !style.structured || req.flags.has(CmdFlags::DF) || pieces.len() <= 1;
    let mut head = Vec::with_capacity(28);
    let mut rest = Vec::with_capacity(pieces.len() * 2);
    if one_chunk {
        header(style, req, &mut head);
        rest.extend(pieces.into_iter().map(|(_, _, p)| p));
    } else {
        let n = pieces.len();
        for (i, (at, len, piece)) in pieces.into_iter().enumerate() {
            let mut h = Vec::with_capacity(28);
            encode::offset_data_header(&mut h, req.cookie, req.offset + at, len as u32, i + 1 == n);
            if i == 0 {
                head = h;
            } else {
                rest.push(Piece::Mem(Bytes::from(h)));
            }
            rest.push(piece);
        }
    }
    Reply {
        parts: vec![Bytes::from(head)],
        file: Some(ZeroCopy::Pieces(rest)),
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
            sendfile: false,
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
            sendfile: false,
        };
        let r = read(&structured, &req(CmdFlags::DF), pieces());
        assert_eq!(r.parts.len(), 2);
        assert_eq!(&flatten(&r)[28..], b"abcdef");
        let simple = ReplyStyle {
            structured: false,
            contexts: vec![],
            zero_copy: false,
            sendfile: false,
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
            sendfile: false,
        };
        let r = read(&style, &req(0), vec![(0, Bytes::from_static(b"abc"))]);
        assert!(!r.ok);
    }

    fn piped(bytes: &[u8]) -> braid_pool::Piped {
        let mut fill = braid_pool::PipeFill::new(bytes.len(), braid_pool::PIPES).unwrap();
        assert!(fill.push(bytes));
        fill.finish().unwrap()
    }

    /// What the writer puts on the wire for `r`: its parts, then its
    /// pieces, the pipes read out.
    fn wire(r: Reply) -> Vec<u8> {
        let mut out = flatten(&r);
        if let Some(ZeroCopy::Pieces(pieces)) = r.file {
            for p in pieces {
                match p {
                    Piece::Mem(b) => out.extend_from_slice(&b),
                    Piece::Pipe(p) => out.extend_from_slice(&p.into_bytes().unwrap()),
                }
            }
        }
        out
    }

    #[test]
    fn piped_pieces_go_on_the_wire_as_the_same_chunks_as_buffered_ones() {
        for (flags, structured) in [(0, true), (CmdFlags::DF, true), (0, false)] {
            let style = |zero_copy| ReplyStyle {
                structured,
                contexts: vec![],
                zero_copy,
                sendfile: false,
            };
            let want = wire(read(&style(false), &req(flags), pieces()));
            let mixed = || {
                (
                    vec![(3, Bytes::from_static(b"def"))],
                    vec![(0, piped(b"abc"))],
                )
            };
            let (data, pipes) = mixed();
            let spliced = read_piped(&style(true), &req(flags), data, pipes);
            assert!(spliced.ok);
            assert!(matches!(spliced.file, Some(ZeroCopy::Pieces(_))));
            assert_eq!(
                wire(spliced),
                want,
                "flags {flags}, structured {structured}"
            );
            let (data, pipes) = mixed();
            let copied = read_piped(&style(false), &req(flags), data, pipes);
            assert!(
                copied.file.is_none(),
                "a writer that cannot splice gets bytes"
            );
            assert_eq!(wire(copied), want);
        }
    }

    #[test]
    fn piped_pieces_that_leave_a_gap_are_a_short_read() {
        let style = ReplyStyle {
            structured: true,
            contexts: vec![],
            zero_copy: true,
            sendfile: false,
        };
        let r = read_piped(
            &style,
            &req(0),
            vec![(0, Bytes::from_static(b"ab"))],
            vec![(3, piped(b"def"))],
        );
        assert!(!r.ok);
    }
}
