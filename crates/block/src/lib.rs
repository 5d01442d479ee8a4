//! The words every part of braid shares, whatever the wire: a block
//! operation, its flags, an extent of a volume's allocation, and the kind
//! of error an operation ends with. The engine, the store and every front
//! end and transport speak these; each protocol (NBD, iSCSI, ...) maps its
//! own words to and from them in exactly one place of its crate, so that
//! an NBD errno or a SCSI sense key never travels past its front end.
//!
//! No I/O, no protocol: only types.

use std::fmt;

/// What a request does to a volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
    /// Make every write completed before it durable.
    Flush,
    /// The range need not be kept (a hint; what it reads as after is the
    /// target's business).
    Trim,
    /// The range reads as zeroes.
    WriteZeroes,
    /// Read ahead into the target's cache.
    Cache,
    /// What the range's allocation is.
    BlockStatus,
}

impl Op {
    /// Changes the volume's contents (and so needs fencing to re-send).
    pub fn is_write(self) -> bool {
        matches!(self, Self::Write | Self::Trim | Self::WriteZeroes)
    }

    /// Carries payload bytes (the rest cost a link almost nothing).
    pub fn moves_data(self) -> bool {
        matches!(self, Self::Read | Self::Write)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Flush => "flush",
            Self::Trim => "trim",
            Self::WriteZeroes => "write zeroes",
            Self::Cache => "cache",
            Self::BlockStatus => "block status",
        }
    }
}

/// A request's flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(u8);

impl Flags {
    /// Durable before it is answered (forced unit access).
    pub const FUA: Self = Self(1);
    /// WRITE ZEROES: the range must stay allocated (no hole).
    pub const NO_HOLE: Self = Self(1 << 1);
    /// WRITE ZEROES: fail rather than be slow (no fallback to writing).
    pub const FAST_ZERO: Self = Self(1 << 2);
    /// READ: answer in one piece (do not fragment).
    pub const DONT_FRAGMENT: Self = Self(1 << 3);
    /// BLOCK STATUS: one extent is enough.
    pub const REQ_ONE: Self = Self(1 << 4);

    pub const fn empty() -> Self {
        Self(0)
    }

    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    #[must_use]
    pub const fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    #[must_use]
    pub const fn without(self, other: Self) -> Self {
        Self(self.0 & !other.0)
    }

    pub const fn fua(self) -> bool {
        self.contains(Self::FUA)
    }
}

/// One extent of a volume's allocation, in order from a request's offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub len: u64,
    /// Not allocated: reading it costs the store nothing.
    pub hole: bool,
    /// Reads as zeroes.
    pub zero: bool,
}

impl Extent {
    /// Allocated, contents unknown.
    pub const fn data(len: u64) -> Self {
        Self {
            len,
            hole: false,
            zero: false,
        }
    }

    /// Not allocated, so it reads as zeroes.
    pub const fn unallocated(len: u64) -> Self {
        Self {
            len,
            hole: true,
            zero: true,
        }
    }
}

/// How an operation failed, as its caller can act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The medium or the path failed; the data is in doubt.
    Io,
    /// No room left to write.
    NoSpace,
    /// Writes are refused (a read-only export, a reservation).
    ReadOnly,
    /// The request itself is wrong (alignment, flags).
    Invalid,
    /// Past the volume's end.
    OutOfRange,
    /// The operation is not offered.
    NotSupported,
    /// The storage behind is going away or was lost (a failed cache flush,
    /// a fenced gateway): try another path.
    ShuttingDown,
    /// Not enough memory to answer now.
    NoMemory,
}

impl ErrorKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Io => "I/O error",
            Self::NoSpace => "no space left",
            Self::ReadOnly => "read-only",
            Self::Invalid => "invalid request",
            Self::OutOfRange => "out of range",
            Self::NotSupported => "not supported",
            Self::ShuttingDown => "shutting down",
            Self::NoMemory => "out of memory",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An operation's failure: its kind, and what happened in words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// A connection's id as its server issued it, which a fence names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u128);

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// The id of one request on the wire (NBD's cookie, iSCSI's task tag).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag(pub u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_combine_and_test() {
        let f = Flags::empty().with(Flags::FUA).with(Flags::NO_HOLE);
        assert!(f.fua() && f.contains(Flags::NO_HOLE) && !f.contains(Flags::FAST_ZERO));
        assert_eq!(f.without(Flags::FUA), Flags::NO_HOLE);
        assert!(!Flags::default().fua());
    }

    #[test]
    fn errors_say_their_kind_and_what_happened() {
        let e = Error::new(ErrorKind::NoSpace, "writing 4096 bytes at 0");
        assert_eq!(e.to_string(), "no space left: writing 4096 bytes at 0");
        assert!(Op::Trim.is_write() && !Op::Trim.moves_data());
    }
}
