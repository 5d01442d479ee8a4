//! What a logical unit says about itself, as an initiator reads it:
//! standard INQUIRY, the VPD pages that identify it (0x83, 0x80) and
//! describe its limits (0xb0, 0xb2), READ CAPACITY (16), the caching mode
//! page, and REPORT TARGET PORT GROUPS (SPC-5, SBC-4). Every parser takes
//! untrusted bytes: short or inconsistent data is an error, never a panic.

/// Why a unit's answer cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{what}: {why}")]
pub struct UnitError {
    pub what: &'static str,
    pub why: String,
}

fn short<T>(what: &'static str, got: usize, want: usize) -> Result<T, UnitError> {
    Err(UnitError {
        what,
        why: format!("{got} bytes, at least {want} needed"),
    })
}

/// Standard INQUIRY data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inquiry {
    /// Peripheral qualifier (bits 5-7) and device type (bits 0-4).
    pub qualifier: u8,
    pub device_type: u8,
    /// TPGS: 1 implicit ALUA, 2 explicit, 3 both; 0 none.
    pub tpgs: u8,
    pub vendor: String,
    pub product: String,
    pub revision: String,
}

impl Inquiry {
    /// # Errors
    ///
    /// Fewer than 36 bytes.
    pub fn parse(d: &[u8]) -> Result<Self, UnitError> {
        if d.len() < 36 {
            return short("standard INQUIRY", d.len(), 36);
        }
        let text = |r: std::ops::Range<usize>| String::from_utf8_lossy(&d[r]).trim().to_owned();
        Ok(Self {
            qualifier: d[0] >> 5,
            device_type: d[0] & 0x1f,
            tpgs: (d[5] >> 4) & 3,
            vendor: text(8..16),
            product: text(16..32),
            revision: text(32..36),
        })
    }

    /// A block device that is present (qualifier 0, type 0).
    pub fn is_disk(&self) -> bool {
        self.qualifier == 0 && self.device_type == 0
    }
}

/// The body of a VPD page after its 4-byte header, checked to be the page
/// asked for and cut to its stated length.
fn vpd<'a>(d: &'a [u8], page: u8, what: &'static str) -> Result<&'a [u8], UnitError> {
    if d.len() < 4 {
        return short(what, d.len(), 4);
    }
    if d[1] != page {
        return Err(UnitError {
            what,
            why: format!("page {:#04x} came back", d[1]),
        });
    }
    let len = usize::from(u16::from_be_bytes([d[2], d[3]]));
    Ok(&d[4..(4 + len).min(d.len())])
}

/// VPD 0x00: the pages the unit answers.
///
/// # Errors
///
/// Not page 0x00, or too short.
pub fn supported_pages(d: &[u8]) -> Result<Vec<u8>, UnitError> {
    Ok(vpd(d, 0x00, "VPD page 0x00")?.to_vec())
}

/// VPD 0x80: the unit serial number, spaces trimmed.
///
/// # Errors
///
/// Not page 0x80, or too short.
pub fn serial(d: &[u8]) -> Result<String, UnitError> {
    let body = vpd(d, 0x80, "VPD page 0x80")?;
    Ok(String::from_utf8_lossy(body)
        .trim_matches(|c: char| c == ' ' || c == '\0')
        .to_owned())
}

/// A logical unit's identity, as Linux names a WWID: `naa.…`, `eui.…`,
/// `t10.…`, a SCSI name string as given, or (with no designator) serial,
/// vendor and product.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Identity(pub String);

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What VPD 0x83 says: the unit's identity and the port it was asked
/// through.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Designators {
    /// The best designator of the unit itself (association 0).
    pub identity: Option<Identity>,
    /// The relative target port and target port group of the port asked
    /// (association 1).
    pub relative_port: Option<u16>,
    pub port_group: Option<u16>,
}

/// VPD 0x83. The identity is the unit's designator ranked as Linux
/// multipath ranks them: a SCSI name string, then NAA, then EUI-64, then
/// T10 vendor identification; a longer designator of a kind before a
/// shorter one (NAA IEEE Registered Extended before Registered).
///
/// # Errors
///
/// Not page 0x83, or a descriptor that runs past the page.
pub fn designators(d: &[u8]) -> Result<Designators, UnitError> {
    let body = vpd(d, 0x83, "VPD page 0x83")?;
    let mut out = Designators::default();
    let mut best: Option<((u8, usize), Identity)> = None;
    let mut at = 0;
    while at + 4 <= body.len() {
        let (code_set, assoc, kind) = (
            body[at] & 0x0f,
            (body[at + 1] >> 4) & 3,
            body[at + 1] & 0x0f,
        );
        let len = usize::from(body[at + 3]);
        let Some(value) = body.get(at + 4..at + 4 + len) else {
            return Err(UnitError {
                what: "VPD page 0x83",
                why: format!("a designator of {len} bytes at {at} runs past the page"),
            });
        };
        at += 4 + len;
        match assoc {
            0 => {
                if let Some((rank, id)) = designator(code_set, kind, value) {
                    if best.as_ref().is_none_or(|(r, _)| rank > *r) {
                        best = Some((rank, id));
                    }
                }
            }
            1 if len >= 4 => {
                let n = u16::from_be_bytes([value[2], value[3]]);
                match kind {
                    4 => out.relative_port = Some(n),
                    5 => out.port_group = Some(n),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    out.identity = best.map(|(_, id)| id);
    Ok(out)
}

/// One designator of the unit, with its rank (kind first, then length).
fn designator(code_set: u8, kind: u8, v: &[u8]) -> Option<((u8, usize), Identity)> {
    let hex = |v: &[u8]| v.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let text = |v: &[u8]| {
        let s = String::from_utf8_lossy(v);
        s.trim_end_matches(['\0', ' ']).to_owned()
    };
    let (rank, id) = match (kind, code_set) {
        (8, 2 | 3) if !v.is_empty() => (4, text(v)),
        (3, 1) if matches!(v.len(), 8 | 16) => (3, format!("naa.{}", hex(v))),
        (2, 1) if matches!(v.len(), 8 | 12 | 16) => (2, format!("eui.{}", hex(v))),
        (1, 2) if v.len() > 8 => (1, format!("t10.{}", text(v))),
        _ => return None,
    };
    (!id.is_empty()).then_some(((rank, v.len()), Identity(id)))
}

/// The identity to use when VPD 0x83 has none: VPD 0x80's serial with the
/// vendor and product it belongs to.
pub fn fallback_identity(inquiry: &Inquiry, serial: &str) -> Option<Identity> {
    (!serial.is_empty()).then(|| {
        Identity(format!(
            "serial.{}.{}.{serial}",
            inquiry.vendor, inquiry.product
        ))
    })
}

/// VPD 0xb0, Block Limits (in logical blocks; 0 means "not stated").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockLimits {
    pub max_transfer: u32,
    pub optimal_transfer: u32,
    pub max_unmap: u32,
    pub max_unmap_descriptors: u32,
    pub unmap_granularity: u32,
    pub max_write_same: u64,
}

/// # Errors
///
/// Not page 0xb0.
pub fn block_limits(d: &[u8]) -> Result<BlockLimits, UnitError> {
    let b = vpd(d, 0xb0, "VPD page 0xb0")?;
    // Offsets as SBC numbers them, from the page's start.
    let u32_at = |at: usize| {
        b.get(at - 4..at)
            .map_or(0, |s| u32::from_be_bytes(s.try_into().expect("four bytes")))
    };
    let u64_at = |at: usize| {
        b.get(at - 4..at + 4).map_or(0, |s| {
            u64::from_be_bytes(s.try_into().expect("eight bytes"))
        })
    };
    Ok(BlockLimits {
        max_transfer: u32_at(8),
        optimal_transfer: u32_at(12),
        max_unmap: u32_at(20),
        max_unmap_descriptors: u32_at(24),
        unmap_granularity: u32_at(28),
        max_write_same: u64_at(36),
    })
}

/// VPD 0xb2, Logical Block Provisioning: what deallocates blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Provisioning {
    /// UNMAP is supported.
    pub unmap: bool,
    /// WRITE SAME (16) with UNMAP is supported.
    pub write_same_unmap: bool,
    /// Deallocated blocks read as zero.
    pub zeroes: bool,
}

/// # Errors
///
/// Not page 0xb2.
pub fn provisioning(d: &[u8]) -> Result<Provisioning, UnitError> {
    let b = vpd(d, 0xb2, "VPD page 0xb2")?;
    let flags = b.get(1).copied().unwrap_or(0);
    Ok(Provisioning {
        unmap: flags & 0x80 != 0,
        write_same_unmap: flags & 0x40 != 0,
        zeroes: flags & 0x04 != 0,
    })
}

/// READ CAPACITY (16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    pub blocks: u64,
    pub block_size: u32,
    /// Logical block provisioning management enabled (thin).
    pub thin: bool,
}

impl Capacity {
    pub fn bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_size))
    }
}

/// # Errors
///
/// Fewer than 32 bytes (14 without the provisioning byte), or a block
/// size that is not a power of two from 512 bytes to 1 MiB.
pub fn capacity16(d: &[u8]) -> Result<Capacity, UnitError> {
    if d.len() < 12 {
        return short("READ CAPACITY (16)", d.len(), 12);
    }
    let last = u64::from_be_bytes(d[0..8].try_into().expect("eight bytes"));
    let block_size = u32::from_be_bytes(d[8..12].try_into().expect("four bytes"));
    if !block_size.is_power_of_two() || !(512..=1 << 20).contains(&block_size) {
        return Err(UnitError {
            what: "READ CAPACITY (16)",
            why: format!("logical block size {block_size}"),
        });
    }
    Ok(Capacity {
        blocks: last.saturating_add(1),
        block_size,
        thin: d.get(14).is_some_and(|b| b & 0x80 != 0),
    })
}

/// The caching mode page and its header: whether writes are cached (so
/// SYNCHRONIZE CACHE matters) and whether FUA is honoured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caching {
    pub write_cache: bool,
    pub fua: bool,
    pub read_only: bool,
}

/// MODE SENSE (6) answer with the caching page (no block descriptors).
///
/// # Errors
///
/// Too short, or another page.
pub fn caching(d: &[u8]) -> Result<Caching, UnitError> {
    if d.len() < 4 {
        return short("MODE SENSE caching page", d.len(), 4);
    }
    let page = 4 + usize::from(d[3]);
    let p = d.get(page..page + 3).ok_or(UnitError {
        what: "MODE SENSE caching page",
        why: "no page after the header".into(),
    })?;
    if p[0] & 0x3f != 0x08 {
        return Err(UnitError {
            what: "MODE SENSE caching page",
            why: format!("page {:#04x} came back", p[0] & 0x3f),
        });
    }
    Ok(Caching {
        write_cache: p[2] & 0x04 != 0,
        fua: d[2] & 0x10 != 0,
        read_only: d[2] & 0x80 != 0,
    })
}

/// An ALUA access state (SPC-5, "Asymmetric access state").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AccessState {
    ActiveOptimized,
    ActiveNonOptimized,
    Standby,
    Unavailable,
    Transitioning,
    /// Offline, logical-block-dependent or a value SPC does not define.
    Other(u8),
}

impl AccessState {
    pub fn from_code(c: u8) -> Self {
        match c & 0x0f {
            0x0 => Self::ActiveOptimized,
            0x1 => Self::ActiveNonOptimized,
            0x2 => Self::Standby,
            0x3 => Self::Unavailable,
            0xf => Self::Transitioning,
            other => Self::Other(other),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::ActiveOptimized => "active/optimized",
            Self::ActiveNonOptimized => "active/non-optimized",
            Self::Standby => "standby",
            Self::Unavailable => "unavailable",
            Self::Transitioning => "transitioning",
            Self::Other(_) => "other",
        }
    }
}

/// One target port group from REPORT TARGET PORT GROUPS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortGroup {
    pub id: u16,
    pub state: AccessState,
    /// The PREF bit: the target prefers this group.
    pub preferred: bool,
    pub ports: Vec<u16>,
}

/// REPORT TARGET PORT GROUPS (length-only header format).
///
/// # Errors
///
/// A descriptor that runs past the data.
pub fn port_groups(d: &[u8]) -> Result<Vec<PortGroup>, UnitError> {
    const WHAT: &str = "REPORT TARGET PORT GROUPS";
    if d.len() < 4 {
        return short(WHAT, d.len(), 4);
    }
    let len = u32::from_be_bytes(d[0..4].try_into().expect("four bytes")) as usize;
    let body = &d[4..(4usize.saturating_add(len)).min(d.len())];
    let mut out = Vec::new();
    let mut at = 0;
    while at + 8 <= body.len() {
        let g = &body[at..];
        let count = usize::from(g[7]);
        let Some(ports) = body.get(at + 8..at + 8 + 4 * count) else {
            return Err(UnitError {
                what: WHAT,
                why: format!("group at {at} lists {count} ports past the data"),
            });
        };
        out.push(PortGroup {
            id: u16::from_be_bytes([g[2], g[3]]),
            state: AccessState::from_code(g[0]),
            preferred: g[0] & 0x80 != 0,
            ports: ports
                .chunks_exact(4)
                .map(|p| u16::from_be_bytes([p[2], p[3]]))
                .collect(),
        });
        at += 8 + 4 * count;
    }
    Ok(out)
}
