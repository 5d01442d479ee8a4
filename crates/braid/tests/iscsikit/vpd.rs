//! The Device Identification VPD page (0x83) read the way the initiators
//! that matter read it, each by its own ranking of designators:
//!
//! - Linux's kernel (`scsi_vpd_lun_id`, the `wwid` in sysfs): only
//!   designators of the logical unit (association 0); SCSI name string
//!   first, then NAA IEEE Registered Extended, EUI-64 16 and 12 bytes, NAA
//!   IEEE Registered, NAA IEEE Extended, EUI-64 8 bytes, and last NAA
//!   locally assigned and T10 vendor ID; a tie goes to the longer one.
//! - udev's `scsi_id` (`ID_SERIAL`, multipath's default WWID): a fixed
//!   search list, association 0 only: NAA 6, NAA 5, any other NAA, EUI-64,
//!   T10 vendor ID, vendor specific; the first designator of the first
//!   entry that matches wins. It also records the target port group from a
//!   type 5 designator of association 1.
//! - Windows' MSDSM (`DsmpParseDeviceID` in the published DSM source):
//!   association 0 (association 2 only while nothing of association 0 was
//!   found), types ranked 8 > 3 > 2 > 1 > 0, a tie to the longer; relative
//!   port and target port group from association 1.

/// One designation descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Designator {
    pub protocol: u8,
    pub code_set: u8,
    pub piv: bool,
    pub association: u8,
    pub kind: u8,
    pub value: Vec<u8>,
}

/// The descriptors of a VPD page 0x83 (header included).
pub fn designators(page: &[u8]) -> Vec<Designator> {
    assert_eq!(page[1], 0x83, "not the device identification page");
    let end = 4 + usize::from(u16::from_be_bytes([page[2], page[3]]));
    assert_eq!(end, page.len(), "page length");
    let mut out = Vec::new();
    let mut at = 4;
    while at + 4 <= end {
        let d = &page[at..];
        let len = usize::from(d[3]);
        assert!(at + 4 + len <= end, "descriptor runs past the page");
        out.push(Designator {
            protocol: d[0] >> 4,
            code_set: d[0] & 0x0f,
            piv: d[1] & 0x80 != 0,
            association: (d[1] >> 4) & 3,
            kind: d[1] & 0x0f,
            value: d[4..4 + len].to_vec(),
        });
        at += 4 + len;
    }
    assert_eq!(at, end, "descriptors fill the page exactly");
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The kernel's name for a designator it ranks.
fn linux_name(d: &Designator) -> String {
    match d.kind {
        1 => format!("t10.{}", String::from_utf8_lossy(&d.value)),
        2 => format!("eui.{}", hex(&d.value)),
        3 => format!("naa.{}", hex(&d.value)),
        8 => String::from_utf8_lossy(&d.value)
            .trim_end_matches('\0')
            .to_owned(),
        _ => unreachable!("ranked 0"),
    }
}

fn linux_prio(d: &Designator) -> u8 {
    if d.association != 0 || d.value.is_empty() {
        return 0;
    }
    match (d.kind, d.value.len()) {
        (8, _) => 9,
        (3, _) => match d.value[0] >> 4 {
            6 => 8,
            5 => 5,
            2 => 4,
            3 => 1,
            _ => 0,
        },
        (2, 16) => 7,
        (2, 12) => 6,
        (2, 8) => 3,
        (1, _) => 1,
        _ => 0,
    }
}

/// The device's `wwid` as Linux's kernel names it.
pub fn linux_wwid(ds: &[Designator]) -> Option<String> {
    let mut best: Option<&Designator> = None;
    for d in ds {
        let p = linux_prio(d);
        if p == 0 {
            continue;
        }
        best = match best {
            Some(b) if linux_prio(b) > p => Some(b),
            Some(b) if linux_prio(b) == p && b.value.len() >= d.value.len() => Some(b),
            _ => Some(d),
        };
    }
    best.map(linux_name)
}

/// `ID_SERIAL` as udev's `scsi_id --page=0x83` makes it: the designator
/// type as a hex digit, then the designator (hex if binary).
pub fn udev_serial(ds: &[Designator]) -> Option<String> {
    // (type, NAA type or None for any, code set)
    let list: [(u8, Option<u8>, u8); 12] = [
        (3, Some(6), 1),
        (3, Some(6), 2),
        (3, Some(5), 1),
        (3, Some(5), 2),
        (3, None, 1),
        (3, None, 2),
        (2, None, 1),
        (2, None, 2),
        (1, None, 1),
        (1, None, 2),
        (0, None, 1),
        (0, None, 2),
    ];
    for (kind, naa, code_set) in list {
        let hit = ds.iter().find(|d| {
            d.association == 0
                && d.kind == kind
                && d.code_set == code_set
                && naa.is_none_or(|n| d.value.first().map(|b| b >> 4) == Some(n))
        });
        if let Some(d) = hit {
            let body = if d.code_set == 1 {
                hex(&d.value)
            } else {
                String::from_utf8_lossy(&d.value).into_owned()
            };
            return Some(format!("{:x}{body}", d.kind));
        }
    }
    None
}

/// The target port group udev records (`ID_TARGET_PORT`'s group).
pub fn udev_port_group(ds: &[Designator]) -> Option<u16> {
    ds.iter()
        .find(|d| d.association == 1 && d.kind == 5)
        .map(|d| u16::from_be_bytes([d.value[2], d.value[3]]))
}

fn msdsm_rank(kind: u8) -> u8 {
    match kind {
        8 => 5,
        3 => 4,
        2 => 3,
        1 => 2,
        0 => 1,
        _ => 0,
    }
}

/// The serial MSDSM builds its device identity from: (association, type,
/// value).
pub fn msdsm_identity(ds: &[Designator]) -> Option<(u8, u8, Vec<u8>)> {
    let mut best: Option<&Designator> = None;
    for d in ds {
        let assoc_ok =
            d.association == 0 || (d.association == 2 && best.is_none_or(|b| b.association != 0));
        if !assoc_ok || msdsm_rank(d.kind) == 0 {
            continue;
        }
        let better = match best {
            None => true,
            Some(b) if b.kind == d.kind => b.value.len() < d.value.len(),
            Some(b) => msdsm_rank(d.kind) > msdsm_rank(b.kind),
        };
        if better {
            best = Some(d);
        }
    }
    best.map(|d| (d.association, d.kind, d.value.clone()))
}

/// MSDSM's relative target port and target port group of the path.
pub fn msdsm_port(ds: &[Designator]) -> (Option<u16>, Option<u16>) {
    let find = |kind: u8| {
        ds.iter()
            .find(|d| d.association == 1 && d.kind == kind && d.value.len() == 4)
            .map(|d| u16::from_be_bytes([d.value[2], d.value[3]]))
    };
    (find(4), find(5))
}
