//! A deliberately simple NBD client over a blocking `TcpStream`, for tests
//! that must send what real clients never send: malformed handshakes,
//! unknown commands, lying lengths, half a payload. Encoding uses
//! `braid_proto`'s encoders so the bytes are right where the test means
//! them to be; everything the test means to break is written by hand.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

use braid_proto::option::{encode_option, GoData, MetaQuery, OptionReplyHeader};
use braid_proto::reply::{BlockStatus, ErrorChunk, OffsetHole, ReplyHeader};
use braid_proto::wire::{
    chunk_type, client_flags, info, OptCode, RepCode, CHUNK_HEADER_LEN, INIT_MAGIC,
    OPTION_REPLY_HEADER_LEN, OPTS_MAGIC,
};
use braid_proto::{CmdFlags, Command, Cookie, Request};

/// The largest payload braid advertises (and the spec's interoperable
/// 32 MiB), for checking chunk lengths.
pub const MAX_PAYLOAD: u32 = 32 << 20;

/// Size of the export the raw-protocol tests serve ([`serve`]).
pub const SIZE: u64 = 64 << 20;

/// `braid serve` with one 64 MiB memory export named `vol`.
pub fn serve() -> super::Serve {
    super::Serve::start(&["vol=mem:64MiB"])
}

/// A well-behaved client writes on one connection and reads back on that
/// one and on another, byte for byte; the server is alive and never
/// panicked. `seed` keeps each call's data and offset distinct.
pub fn assert_still_serving(serve: &mut super::Serve, seed: u64) {
    let data = super::random_bytes(100_003, seed);
    let off = 1_000_001 + seed * 40_009 % (SIZE - 200_000);
    let mut a = RawClient::open(serve.addr(), "vol");
    a.write(off, &data).expect("write by a good client");
    assert_eq!(
        a.read(off, data.len() as u32).unwrap(),
        data,
        "same connection"
    );
    let mut b = RawClient::open(serve.addr(), "vol");
    assert_eq!(
        b.read(off, data.len() as u32).unwrap(),
        data,
        "other connection"
    );
    serve.assert_healthy();
}

/// How long any single read from the server may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// NBD command numbers, as sent on the wire.
pub mod cmd {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const DISC: u16 = 2;
    pub const FLUSH: u16 = 3;
    pub const TRIM: u16 = 4;
    pub const CACHE: u16 = 5;
    pub const WRITE_ZEROES: u16 = 6;
    pub const BLOCK_STATUS: u16 = 7;
}

/// NBD error values (spec: "Error values").
pub mod errno {
    pub const EPERM: u32 = 1;
    pub const EINVAL: u32 = 22;
    pub const ENOSPC: u32 = 28;
    pub const EOVERFLOW: u32 = 75;
}

/// One option reply: its type and payload.
#[derive(Debug)]
pub struct OptReply {
    pub code: RepCode,
    pub data: Vec<u8>,
}

/// A whole transmission reply, all chunks gathered.
#[derive(Debug, Default)]
pub struct Reply {
    pub cookie: u64,
    /// The NBD error value, if the reply was an error.
    pub error: Option<u32>,
    pub message: String,
    /// READ data, assembled from data and hole chunks.
    pub data: Vec<u8>,
    /// BLOCK_STATUS chunks: context id and `(length, flags)` extents.
    pub extents: Vec<(u32, Vec<(u32, u32)>)>,
}

/// A raw NBD connection.
pub struct RawClient {
    pub stream: TcpStream,
    /// Export size and transmission flags, once in transmission.
    pub size: u64,
    pub flags: u16,
    pub structured: bool,
    next_cookie: u64,
    /// In-flight requests: cookie to (command, offset, length), to parse
    /// replies.
    pending: HashMap<u64, (u16, u64, u32)>,
}

impl RawClient {
    /// Connects; nothing is read or sent yet.
    pub fn connect(addr: SocketAddr) -> RawClient {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream
            .set_read_timeout(Some(READ_TIMEOUT))
            .expect("timeout");
        stream.set_nodelay(true).expect("nodelay");
        RawClient {
            stream,
            size: 0,
            flags: 0,
            structured: false,
            next_cookie: 1,
            pending: HashMap::new(),
        }
    }

    /// Reads the server greeting; returns the handshake flags.
    pub fn greeting(&mut self) -> u16 {
        let mut g = [0u8; 18];
        self.stream.read_exact(&mut g).expect("greeting");
        assert_eq!(&g[0..8], &INIT_MAGIC.to_be_bytes(), "NBDMAGIC");
        assert_eq!(&g[8..16], &OPTS_MAGIC.to_be_bytes(), "IHAVEOPT");
        u16::from_be_bytes([g[16], g[17]])
    }

    /// Greeting read and fixed-newstyle, no-zeroes client flags sent:
    /// ready for options.
    pub fn start(addr: SocketAddr) -> RawClient {
        let mut c = Self::connect(addr);
        c.greeting();
        c.send(&client_flags::KNOWN.to_be_bytes());
        c
    }

    /// A full handshake to transmission on `export`: structured replies,
    /// `base:allocation`, `NBD_OPT_GO`.
    pub fn open(addr: SocketAddr, export: &str) -> RawClient {
        let mut c = Self::start(addr);
        c.negotiate(export);
        c
    }

    /// From option haggling to transmission (structured replies,
    /// `base:allocation`, GO), asserting every step succeeds.
    pub fn negotiate(&mut self, export: &str) {
        self.negotiate_with(export, &["base:allocation"]);
    }

    /// As [`Self::negotiate`], selecting the metadata contexts `queries`
    /// match; returns the contexts selected, as `(id, name)`.
    pub fn negotiate_with(&mut self, export: &str, queries: &[&str]) -> Vec<(u32, String)> {
        self.option(OptCode::StructuredReply, &[]);
        assert_eq!(self.option_reply().code, RepCode::Ack, "structured reply");
        self.structured = true;
        let query = MetaQuery {
            export: export.into(),
            queries: queries.iter().map(|q| q.to_string()).collect(),
        };
        self.option(OptCode::SetMetaContext, &query.encode());
        let mut selected = Vec::new();
        loop {
            let r = self.option_reply();
            match r.code {
                RepCode::Ack => break,
                RepCode::MetaContext => {
                    let id = u32::from_be_bytes(r.data[..4].try_into().expect("4"));
                    selected.push((id, String::from_utf8_lossy(&r.data[4..]).into_owned()));
                }
                code => panic!("SET_META_CONTEXT {queries:?} answered {code:?}"),
            }
        }
        if let Err(e) = self.go(export) {
            panic!("NBD_OPT_GO {export:?} refused: {e:?}");
        }
        selected
    }

    /// Sends bytes as they are; errors (the server hung up) are returned.
    pub fn try_send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.try_send(bytes).expect("sending to braid");
    }

    /// Sends one option with `data`.
    pub fn option(&mut self, code: OptCode, data: &[u8]) {
        let mut out = Vec::new();
        encode_option(&mut out, code, data);
        self.send(&out);
    }

    pub fn option_reply(&mut self) -> OptReply {
        let mut h = [0u8; OPTION_REPLY_HEADER_LEN];
        self.stream.read_exact(&mut h).expect("option reply header");
        let header = OptionReplyHeader::decode(&h).expect("option reply magic");
        let mut data = vec![0u8; header.length as usize];
        self.stream
            .read_exact(&mut data)
            .expect("option reply data");
        OptReply {
            code: header.code,
            data,
        }
    }

    /// `NBD_OPT_GO` asking for block sizes; on success the client is in
    /// transmission with `size` and `flags` set.
    pub fn go(&mut self, export: &str) -> Result<(), (RepCode, String)> {
        let go = GoData {
            export: export.into(),
            requests: vec![info::BLOCK_SIZE],
        };
        self.option(OptCode::Go, &go.encode());
        loop {
            let r = self.option_reply();
            match r.code {
                RepCode::Ack => return Ok(()),
                RepCode::Info => {
                    if r.data[..2] == info::EXPORT.to_be_bytes() {
                        self.size = u64::from_be_bytes(r.data[2..10].try_into().expect("8"));
                        self.flags = u16::from_be_bytes([r.data[10], r.data[11]]);
                    }
                }
                code => return Err((code, String::from_utf8_lossy(&r.data).into_owned())),
            }
        }
    }

    /// Sends a request header without waiting; a WRITE's payload is the
    /// caller's to send.
    pub fn request(&mut self, command: u16, flags: u16, offset: u64, length: u32) -> u64 {
        let (cookie, header) = self.encode_request(command, flags, offset, length);
        self.send(&header);
        cookie
    }

    /// A request header with a fresh cookie, recorded so [`Self::reply`]
    /// can parse its reply, for the caller to send as it likes.
    pub fn encode_request(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
    ) -> (u64, Vec<u8>) {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let mut header = Vec::new();
        Request {
            flags: CmdFlags(flags),
            command: Command::from_u16(command),
            cookie: Cookie(cookie),
            offset,
            length,
        }
        .encode_into(&mut header);
        self.pending.insert(cookie, (command, offset, length));
        (cookie, header)
    }

    /// Reads one whole reply (every chunk up to the one marked done).
    pub fn reply(&mut self) -> io::Result<Reply> {
        let mut magic = [0u8; 4];
        self.stream.read_exact(&mut magic)?;
        let len = ReplyHeader::header_len(magic).map_err(io::Error::other)?;
        let mut head = vec![0u8; len];
        head[..4].copy_from_slice(&magic);
        self.stream.read_exact(&mut head[4..])?;
        match ReplyHeader::decode(&head).map_err(io::Error::other)? {
            ReplyHeader::Simple(s) => {
                let (command, _, length) = self.take_pending(s.cookie.0)?;
                let mut reply = Reply {
                    cookie: s.cookie.0,
                    error: (s.error != 0).then_some(s.error),
                    ..Reply::default()
                };
                if command == cmd::READ && s.error == 0 {
                    reply.data = vec![0u8; length as usize];
                    self.stream.read_exact(&mut reply.data)?;
                }
                Ok(reply)
            }
            ReplyHeader::Chunk(first) => self.chunks(first.cookie.0, head),
        }
    }

    fn take_pending(&mut self, cookie: u64) -> io::Result<(u16, u64, u32)> {
        self.pending
            .remove(&cookie)
            .ok_or_else(|| io::Error::other(format!("reply for unknown cookie {cookie}")))
    }

    fn chunks(&mut self, cookie: u64, mut head: Vec<u8>) -> io::Result<Reply> {
        let (command, offset, length) = self.take_pending(cookie)?;
        let mut reply = Reply {
            cookie,
            ..Reply::default()
        };
        let mut pieces: Vec<(u64, Vec<u8>)> = Vec::new();
        loop {
            let ReplyHeader::Chunk(c) = ReplyHeader::decode(&head).map_err(io::Error::other)?
            else {
                return Err(io::Error::other("simple reply inside a structured reply"));
            };
            if c.cookie.0 != cookie {
                return Err(io::Error::other("chunks of two replies interleaved"));
            }
            // Every chunk must be one the spec allows, before its payload
            // is trusted (e.g. OFFSET_DATA carries at least one byte).
            c.check(MAX_PAYLOAD).map_err(io::Error::other)?;
            let mut payload = vec![0u8; c.length as usize];
            self.stream.read_exact(&mut payload)?;
            match c.kind {
                chunk_type::NONE => {}
                chunk_type::OFFSET_DATA => {
                    let off = u64::from_be_bytes(payload[..8].try_into().expect("8"));
                    pieces.push((off, payload[8..].to_vec()));
                }
                chunk_type::OFFSET_HOLE => {
                    let h = OffsetHole::decode(&payload).map_err(io::Error::other)?;
                    pieces.push((h.offset, vec![0u8; h.length as usize]));
                }
                chunk_type::BLOCK_STATUS => {
                    let s = BlockStatus::decode(&payload).map_err(io::Error::other)?;
                    let ext = s.extents.iter().map(|e| (e.length, e.flags)).collect();
                    reply.extents.push((s.context_id, ext));
                }
                k if k & chunk_type::ERROR_BIT != 0 => {
                    let e = ErrorChunk::decode(k, &payload).map_err(io::Error::other)?;
                    reply.error = Some(e.error.to_u32());
                    reply.message = e.message;
                }
                k => return Err(io::Error::other(format!("unknown chunk type {k}"))),
            }
            if c.done() {
                break;
            }
            head = vec![0u8; CHUNK_HEADER_LEN];
            self.stream.read_exact(&mut head)?;
        }
        if command == cmd::READ && reply.error.is_none() {
            // The spec lets data and hole chunks come in any order, but
            // together they must cover the request exactly once.
            reply.data = vec![0u8; length as usize];
            let mut covered = 0usize;
            for (off, bytes) in pieces {
                let end = off + bytes.len() as u64;
                if off < offset || end > offset + u64::from(length) {
                    return Err(io::Error::other(format!(
                        "chunk [{off}, {end}) outside the request"
                    )));
                }
                let at = (off - offset) as usize;
                reply.data[at..at + bytes.len()].copy_from_slice(&bytes);
                covered += bytes.len();
            }
            if covered != length as usize {
                return Err(io::Error::other(format!(
                    "chunks cover {covered} of {length} bytes"
                )));
            }
        }
        Ok(reply)
    }

    /// Sends one request and waits for its reply.
    pub fn call(&mut self, command: u16, flags: u16, offset: u64, length: u32) -> Reply {
        let cookie = self.request(command, flags, offset, length);
        let r = self.reply().expect("reply from braid");
        assert_eq!(r.cookie, cookie, "reply to the request just sent");
        r
    }

    pub fn read(&mut self, offset: u64, length: u32) -> Result<Vec<u8>, u32> {
        let r = self.call(cmd::READ, 0, offset, length);
        r.error.map_or(Ok(r.data), Err)
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), u32> {
        let len = u32::try_from(data.len()).expect("test writes fit u32");
        let cookie = self.request(cmd::WRITE, 0, offset, len);
        self.send(data);
        let r = self.reply().expect("reply from braid");
        assert_eq!(r.cookie, cookie);
        r.error.map_or(Ok(()), Err)
    }

    /// Whether the server closed the connection: EOF or reset within the
    /// read timeout, after skipping anything it still had to say.
    pub fn closed_by_server(&mut self) -> bool {
        let mut buf = [0u8; 4096];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Half-closes the sending side, as a client that goes away does.
    pub fn hang_up(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}
