//! Numbers of the NBD protocol: magics, option and reply codes, flags and
//! error values (spec: "Values"), with typed wrappers so the rest of the
//! crate never compares bare integers.
//!
//! This module only names values; encoding lives in `request`, `reply` and
//! `option`.

/// `NBDMAGIC`, the first eight bytes a server sends.
pub const INIT_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle greeting's second magic and every option's prefix.
pub const OPTS_MAGIC: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply in fixed newstyle.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Prefix of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Prefix of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Prefix of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Size of a request header on the wire.
pub const REQUEST_HEADER_LEN: usize = 28;
/// Size of a simple reply header on the wire.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Size of a structured reply chunk header on the wire.
pub const CHUNK_HEADER_LEN: usize = 20;
/// Size of an option request header (magic, option, length).
pub const OPTION_HEADER_LEN: usize = 16;
/// Size of an option reply header (magic, option, type, length).
pub const OPTION_REPLY_HEADER_LEN: usize = 20;

/// The spec's limit on any string (export names, messages, context names).
pub const MAX_STRING_LEN: usize = 4096;
/// Payload size every peer must accept (spec: "Size constraints").
pub const DEFAULT_MAX_PAYLOAD: u32 = 1 << 25;

/// Handshake flags sent by the server after `IHAVEOPT`.
pub mod handshake_flags {
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Client flags sent in reply to the greeting.
pub mod client_flags {
    pub const FIXED_NEWSTYLE: u32 = 1 << 0;
    pub const NO_ZEROES: u32 = 1 << 1;
    /// Every flag a client may set.
    pub const KNOWN: u32 = FIXED_NEWSTYLE | NO_ZEROES;
}

/// Transmission flags: what an export supports (spec: "Transmission flags").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TransmissionFlags(pub u16);

impl TransmissionFlags {
    pub const HAS_FLAGS: u16 = 1 << 0;
    pub const READ_ONLY: u16 = 1 << 1;
    pub const SEND_FLUSH: u16 = 1 << 2;
    pub const SEND_FUA: u16 = 1 << 3;
    pub const ROTATIONAL: u16 = 1 << 4;
    pub const SEND_TRIM: u16 = 1 << 5;
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    pub const SEND_DF: u16 = 1 << 7;
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    pub const SEND_RESIZE: u16 = 1 << 9;
    pub const SEND_CACHE: u16 = 1 << 10;
    pub const SEND_FAST_ZERO: u16 = 1 << 11;

    /// Whether every bit of `bits` is set.
    pub fn has(self, bits: u16) -> bool {
        self.0 & bits == bits
    }

    pub fn read_only(self) -> bool {
        self.has(Self::READ_ONLY)
    }

    pub fn can_multi_conn(self) -> bool {
        self.has(Self::CAN_MULTI_CONN)
    }

    /// The flag names, for logs and `--help`-style listings.
    pub fn names(self) -> Vec<&'static str> {
        const NAMES: [(u16, &str); 12] = [
            (TransmissionFlags::HAS_FLAGS, "has_flags"),
            (TransmissionFlags::READ_ONLY, "read_only"),
            (TransmissionFlags::SEND_FLUSH, "flush"),
            (TransmissionFlags::SEND_FUA, "fua"),
            (TransmissionFlags::ROTATIONAL, "rotational"),
            (TransmissionFlags::SEND_TRIM, "trim"),
            (TransmissionFlags::SEND_WRITE_ZEROES, "write_zeroes"),
            (TransmissionFlags::SEND_DF, "df"),
            (TransmissionFlags::CAN_MULTI_CONN, "multi_conn"),
            (TransmissionFlags::SEND_RESIZE, "resize"),
            (TransmissionFlags::SEND_CACHE, "cache"),
            (TransmissionFlags::SEND_FAST_ZERO, "fast_zero"),
        ];
        NAMES
            .iter()
            .filter(|(bit, _)| self.has(*bit))
            .map(|(_, name)| *name)
            .collect()
    }
}

/// Command flags carried by each request (spec: "Command flags").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CmdFlags(pub u16);

impl CmdFlags {
    pub const FUA: u16 = 1 << 0;
    pub const NO_HOLE: u16 = 1 << 1;
    pub const DF: u16 = 1 << 2;
    pub const REQ_ONE: u16 = 1 << 3;
    pub const FAST_ZERO: u16 = 1 << 4;
    pub const PAYLOAD_LEN: u16 = 1 << 5;

    pub fn has(self, bits: u16) -> bool {
        self.0 & bits == bits
    }

    pub fn fua(self) -> bool {
        self.has(Self::FUA)
    }

    /// The one place neutral request flags become NBD's.
    pub fn from_flags(f: braid_block::Flags) -> Self {
        use braid_block::Flags as F;
        let bits = [
            (F::FUA, Self::FUA),
            (F::NO_HOLE, Self::NO_HOLE),
            (F::DONT_FRAGMENT, Self::DF),
            (F::REQ_ONE, Self::REQ_ONE),
            (F::FAST_ZERO, Self::FAST_ZERO),
        ];
        Self(
            bits.iter()
                .filter(|(n, _)| f.contains(*n))
                .fold(0, |acc, (_, b)| acc | b),
        )
    }

    /// NBD's flags as neutral ones (PAYLOAD_LEN only shapes the wire).
    pub fn flags(self) -> braid_block::Flags {
        use braid_block::Flags as F;
        [
            (Self::FUA, F::FUA),
            (Self::NO_HOLE, F::NO_HOLE),
            (Self::DF, F::DONT_FRAGMENT),
            (Self::REQ_ONE, F::REQ_ONE),
            (Self::FAST_ZERO, F::FAST_ZERO),
        ]
        .iter()
        .filter(|(b, _)| self.has(*b))
        .fold(F::empty(), |acc, (_, n)| acc.with(*n))
    }
}

/// A transmission command. Unknown values are kept so the server can answer
/// them with `EINVAL` instead of dropping the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
    Unknown(u16),
}

impl Command {
    /// The one place a neutral block operation becomes an NBD command.
    pub fn from_op(op: braid_block::Op) -> Self {
        use braid_block::Op;
        match op {
            Op::Read => Self::Read,
            Op::Write => Self::Write,
            Op::Flush => Self::Flush,
            Op::Trim => Self::Trim,
            Op::WriteZeroes => Self::WriteZeroes,
            Op::Cache => Self::Cache,
            Op::BlockStatus => Self::BlockStatus,
        }
    }

    /// The neutral operation an NBD command is; `None` for a disconnect
    /// or a command NBD does not define.
    pub fn op(self) -> Option<braid_block::Op> {
        use braid_block::Op;
        Some(match self {
            Self::Read => Op::Read,
            Self::Write => Op::Write,
            Self::Flush => Op::Flush,
            Self::Trim => Op::Trim,
            Self::WriteZeroes => Op::WriteZeroes,
            Self::Cache => Op::Cache,
            Self::BlockStatus => Op::BlockStatus,
            Self::Disc | Self::Unknown(_) => return None,
        })
    }

    pub fn from_u16(value: u16) -> Self {
        match value {
            0 => Self::Read,
            1 => Self::Write,
            2 => Self::Disc,
            3 => Self::Flush,
            4 => Self::Trim,
            5 => Self::Cache,
            6 => Self::WriteZeroes,
            7 => Self::BlockStatus,
            other => Self::Unknown(other),
        }
    }

    pub fn to_u16(self) -> u16 {
        match self {
            Self::Read => 0,
            Self::Write => 1,
            Self::Disc => 2,
            Self::Flush => 3,
            Self::Trim => 4,
            Self::Cache => 5,
            Self::WriteZeroes => 6,
            Self::BlockStatus => 7,
            Self::Unknown(other) => other,
        }
    }

    /// Whether the command changes the export's contents.
    pub fn is_write(self) -> bool {
        matches!(self, Self::Write | Self::Trim | Self::WriteZeroes)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Disc => "disc",
            Self::Flush => "flush",
            Self::Trim => "trim",
            Self::Cache => "cache",
            Self::WriteZeroes => "write_zeroes",
            Self::BlockStatus => "block_status",
            Self::Unknown(_) => "unknown",
        }
    }
}

/// Option codes a client sends during the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OptCode {
    ExportName,
    Abort,
    List,
    StartTls,
    Info,
    Go,
    StructuredReply,
    ListMetaContext,
    SetMetaContext,
    ExtendedHeaders,
    Unknown(u32),
}

impl OptCode {
    pub fn from_u32(value: u32) -> Self {
        match value {
            1 => Self::ExportName,
            2 => Self::Abort,
            3 => Self::List,
            5 => Self::StartTls,
            6 => Self::Info,
            7 => Self::Go,
            8 => Self::StructuredReply,
            9 => Self::ListMetaContext,
            10 => Self::SetMetaContext,
            11 => Self::ExtendedHeaders,
            other => Self::Unknown(other),
        }
    }

    pub fn to_u32(self) -> u32 {
        match self {
            Self::ExportName => 1,
            Self::Abort => 2,
            Self::List => 3,
            Self::StartTls => 5,
            Self::Info => 6,
            Self::Go => 7,
            Self::StructuredReply => 8,
            Self::ListMetaContext => 9,
            Self::SetMetaContext => 10,
            Self::ExtendedHeaders => 11,
            Self::Unknown(other) => other,
        }
    }
}

/// Option reply types (spec: "Option reply types"); errors have bit 31 set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RepCode {
    Ack,
    Server,
    Info,
    MetaContext,
    ErrUnsup,
    ErrPolicy,
    ErrInvalid,
    ErrPlatform,
    ErrTlsReqd,
    ErrUnknown,
    ErrShutdown,
    ErrBlockSizeReqd,
    ErrTooBig,
    ErrExtHeaderReqd,
    Unknown(u32),
}

const REP_ERR: u32 = 1 << 31;

impl RepCode {
    pub fn from_u32(value: u32) -> Self {
        match value {
            1 => Self::Ack,
            2 => Self::Server,
            3 => Self::Info,
            4 => Self::MetaContext,
            v if v == REP_ERR + 1 => Self::ErrUnsup,
            v if v == REP_ERR + 2 => Self::ErrPolicy,
            v if v == REP_ERR + 3 => Self::ErrInvalid,
            v if v == REP_ERR + 4 => Self::ErrPlatform,
            v if v == REP_ERR + 5 => Self::ErrTlsReqd,
            v if v == REP_ERR + 6 => Self::ErrUnknown,
            v if v == REP_ERR + 7 => Self::ErrShutdown,
            v if v == REP_ERR + 8 => Self::ErrBlockSizeReqd,
            v if v == REP_ERR + 9 => Self::ErrTooBig,
            v if v == REP_ERR + 10 => Self::ErrExtHeaderReqd,
            other => Self::Unknown(other),
        }
    }

    pub fn to_u32(self) -> u32 {
        match self {
            Self::Ack => 1,
            Self::Server => 2,
            Self::Info => 3,
            Self::MetaContext => 4,
            Self::ErrUnsup => REP_ERR + 1,
            Self::ErrPolicy => REP_ERR + 2,
            Self::ErrInvalid => REP_ERR + 3,
            Self::ErrPlatform => REP_ERR + 4,
            Self::ErrTlsReqd => REP_ERR + 5,
            Self::ErrUnknown => REP_ERR + 6,
            Self::ErrShutdown => REP_ERR + 7,
            Self::ErrBlockSizeReqd => REP_ERR + 8,
            Self::ErrTooBig => REP_ERR + 9,
            Self::ErrExtHeaderReqd => REP_ERR + 10,
            Self::Unknown(other) => other,
        }
    }

    pub fn is_error(self) -> bool {
        self.to_u32() & REP_ERR != 0
    }

    /// The spec's name of the reply, for error messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ack => "ACK",
            Self::Server => "SERVER",
            Self::Info => "INFO",
            Self::MetaContext => "META_CONTEXT",
            Self::ErrUnsup => "ERR_UNSUP",
            Self::ErrPolicy => "ERR_POLICY",
            Self::ErrInvalid => "ERR_INVALID",
            Self::ErrPlatform => "ERR_PLATFORM",
            Self::ErrTlsReqd => "ERR_TLS_REQD",
            Self::ErrUnknown => "ERR_UNKNOWN",
            Self::ErrShutdown => "ERR_SHUTDOWN",
            Self::ErrBlockSizeReqd => "ERR_BLOCK_SIZE_REQD",
            Self::ErrTooBig => "ERR_TOO_BIG",
            Self::ErrExtHeaderReqd => "ERR_EXT_HEADER_REQD",
            Self::Unknown(_) => "unknown reply",
        }
    }
}

/// Information types in `NBD_REP_INFO` replies.
pub mod info {
    pub const EXPORT: u16 = 0;
    pub const NAME: u16 = 1;
    pub const DESCRIPTION: u16 = 2;
    pub const BLOCK_SIZE: u16 = 3;
}

/// Structured reply chunk types.
pub mod chunk_type {
    pub const NONE: u16 = 0;
    pub const OFFSET_DATA: u16 = 1;
    pub const OFFSET_HOLE: u16 = 2;
    pub const BLOCK_STATUS: u16 = 5;
    pub const ERROR: u16 = (1 << 15) + 1;
    pub const ERROR_OFFSET: u16 = (1 << 15) + 2;
    /// Bit set on every error chunk type, known or not.
    pub const ERROR_BIT: u16 = 1 << 15;
}

/// Flag of a structured chunk that ends its reply.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;

/// Flags of `base:allocation` extents.
pub mod state {
    pub const HOLE: u32 = 1 << 0;
    pub const ZERO: u32 = 1 << 1;

    /// The one place a neutral extent's allocation becomes these flags.
    pub fn of(e: &braid_block::Extent) -> u32 {
        let hole = if e.hole { HOLE } else { 0 };
        let zero = if e.zero { ZERO } else { 0 };
        hole | zero
    }

    /// What these flags say of `len` bytes, in the words every part of
    /// braid speaks; bits of other meanings are not allocation's, so
    /// they are left out.
    pub fn extent(len: u64, flags: u32) -> braid_block::Extent {
        braid_block::Extent {
            len,
            hole: flags & HOLE != 0,
            zero: flags & ZERO != 0,
        }
    }
}

/// The error values a reply may carry (spec: "Error values").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Errno {
    Perm,
    Io,
    NoMem,
    Inval,
    NoSpc,
    Overflow,
    NotSup,
    Shutdown,
    /// A value outside the spec; clients treat it as `EINVAL`.
    Other(u32),
}

impl Errno {
    pub fn from_u32(value: u32) -> Self {
        match value {
            1 => Self::Perm,
            5 => Self::Io,
            12 => Self::NoMem,
            22 => Self::Inval,
            28 => Self::NoSpc,
            75 => Self::Overflow,
            95 => Self::NotSup,
            108 => Self::Shutdown,
            other => Self::Other(other),
        }
    }

    pub fn to_u32(self) -> u32 {
        match self {
            Self::Perm => 1,
            Self::Io => 5,
            Self::NoMem => 12,
            Self::Inval => 22,
            Self::NoSpc => 28,
            Self::Overflow => 75,
            Self::NotSup => 95,
            Self::Shutdown => 108,
            Self::Other(other) => other,
        }
    }

    /// The one place an operating system error becomes an NBD error value.
    pub fn from_os(errno: i32) -> Self {
        match errno {
            1 | 13 | 30 => Self::Perm, // EPERM, EACCES, EROFS
            12 => Self::NoMem,
            22 | 34 => Self::Inval,       // EINVAL, ERANGE
            27 | 28 | 122 => Self::NoSpc, // EFBIG, ENOSPC, EDQUOT
            75 => Self::Overflow,
            95 => Self::NotSup,
            108 => Self::Shutdown,
            _ => Self::Io,
        }
    }

    /// The one place a neutral error kind becomes an NBD error value.
    pub fn from_kind(kind: braid_block::ErrorKind) -> Self {
        use braid_block::ErrorKind as K;
        match kind {
            K::NoSpace => Self::NoSpc,
            K::ReadOnly => Self::Perm,
            K::Invalid | K::OutOfRange => Self::Inval,
            K::NotSupported => Self::NotSup,
            K::ShuttingDown => Self::Shutdown,
            K::NoMemory => Self::NoMem,
            _ => Self::Io,
        }
    }

    /// What an NBD error value means, in the words every part of braid
    /// speaks.
    pub fn kind(self) -> braid_block::ErrorKind {
        use braid_block::ErrorKind as K;
        match self {
            Self::Perm => K::ReadOnly,
            Self::NoMem => K::NoMemory,
            Self::Inval | Self::Overflow | Self::Other(_) => K::Invalid,
            Self::NoSpc => K::NoSpace,
            Self::NotSup => K::NotSupported,
            Self::Shutdown => K::ShuttingDown,
            Self::Io => K::Io,
        }
    }

    /// The matching OS error number, for handing NBD errors to local callers.
    pub fn to_os(self) -> i32 {
        match self {
            Self::Other(_) => 22,
            known => known.to_u32() as i32,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Perm => "EPERM",
            Self::Io => "EIO",
            Self::NoMem => "ENOMEM",
            Self::Inval => "EINVAL",
            Self::NoSpc => "ENOSPC",
            Self::Overflow => "EOVERFLOW",
            Self::NotSup => "ENOTSUP",
            Self::Shutdown => "ESHUTDOWN",
            Self::Other(_) => "unknown error",
        }
    }

    /// What the error means to a person reading a log.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Perm => "operation not permitted (read-only export?)",
            Self::Io => "input/output error on the server",
            Self::NoMem => "server out of memory",
            Self::Inval => "invalid request (offset, length, alignment or flags)",
            Self::NoSpc => "no space left on the server, or write past the end",
            Self::Overflow => "request too large for the server",
            Self::NotSup => "operation not supported by the server",
            Self::Shutdown => "server is shutting down",
            Self::Other(_) => "error value outside the NBD spec",
        }
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Other(v) => write!(f, "error {v} ({})", self.describe()),
            known => write!(f, "{} ({})", known.name(), known.describe()),
        }
    }
}

/// The client-chosen tag that pairs a reply with its request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cookie(pub u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neutral_flags_and_nbd_flags_map_both_ways() {
        use braid_block::Flags as F;
        for f in [
            F::FUA,
            F::NO_HOLE,
            F::DONT_FRAGMENT,
            F::REQ_ONE,
            F::FAST_ZERO,
        ] {
            assert_eq!(CmdFlags::from_flags(f).flags(), f);
        }
        let both = F::FUA.with(F::NO_HOLE);
        assert_eq!(
            CmdFlags::from_flags(both).0,
            CmdFlags::FUA | CmdFlags::NO_HOLE
        );
        assert_eq!(CmdFlags(CmdFlags::PAYLOAD_LEN).flags(), F::empty());
    }

    #[test]
    fn neutral_error_kinds_and_nbd_errors_map_both_ways() {
        use braid_block::ErrorKind as K;
        for k in [
            K::Io,
            K::NoSpace,
            K::ReadOnly,
            K::Invalid,
            K::NotSupported,
            K::ShuttingDown,
            K::NoMemory,
        ] {
            assert_eq!(Errno::from_kind(k).kind(), k, "{k}");
        }
        assert_eq!(Errno::from_kind(K::OutOfRange), Errno::Inval);
        assert_eq!(Errno::Other(7).kind(), K::Invalid);
    }

    #[test]
    fn neutral_extents_and_allocation_flags_map_both_ways() {
        let zeroes = |len| braid_block::Extent {
            len,
            hole: false,
            zero: true,
        };
        for flags in 0..4 {
            let e = state::extent(9, flags);
            assert_eq!(e.len, 9);
            assert_eq!(state::of(&e), flags);
        }
        let hole = braid_block::Extent::unallocated(1);
        assert_eq!(state::of(&hole), state::HOLE | state::ZERO);
        assert_eq!(state::extent(1, 1 << 7 | state::ZERO), zeroes(1));
        assert_eq!(state::extent(1, 1 << 7), braid_block::Extent::data(1));
    }

    #[test]
    fn codes_round_trip() {
        for v in 0..16u16 {
            assert_eq!(Command::from_u16(v).to_u16(), v);
        }
        for v in 0..16u32 {
            assert_eq!(OptCode::from_u32(v).to_u32(), v);
            assert_eq!(RepCode::from_u32(v).to_u32(), v);
            assert_eq!(RepCode::from_u32(REP_ERR + v).to_u32(), REP_ERR + v);
        }
        for v in [0, 1, 5, 12, 22, 28, 75, 95, 108, 200] {
            assert_eq!(Errno::from_u32(v).to_u32(), v);
        }
    }

    #[test]
    fn error_replies_have_bit_31() {
        assert!(RepCode::ErrUnsup.is_error());
        assert_eq!(RepCode::ErrUnsup.to_u32(), 0x8000_0001);
        assert!(!RepCode::Ack.is_error());
        assert_eq!(RepCode::ErrTooBig.to_u32(), 0x8000_0009);
    }

    #[test]
    fn os_errors_map_to_spec_values() {
        assert_eq!(Errno::from_os(libc_enospc()), Errno::NoSpc);
        assert_eq!(Errno::from_os(122), Errno::NoSpc);
        assert_eq!(Errno::from_os(30), Errno::Perm);
        assert_eq!(Errno::from_os(9999), Errno::Io);
    }

    fn libc_enospc() -> i32 {
        28
    }

    #[test]
    fn flag_names_list_set_bits() {
        let f = TransmissionFlags(
            TransmissionFlags::HAS_FLAGS
                | TransmissionFlags::READ_ONLY
                | TransmissionFlags::CAN_MULTI_CONN,
        );
        assert_eq!(f.names(), vec!["has_flags", "read_only", "multi_conn"]);
        assert!(f.read_only());
        assert!(f.can_multi_conn());
    }
}
