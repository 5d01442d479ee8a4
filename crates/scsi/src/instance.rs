//! braid's vendor-specific VPD page 0xC0: the target process's instance,
//! the same value NBD clients read as `x-braid:instance`.
//!
//! A unit attention for a reset (29h) tells an initiator that something
//! reset the unit, not what: POWER ON OCCURRED after a restart, or a
//! LOGICAL UNIT RESET by another initiator (29h/03h), which loses nothing
//! that was acknowledged. The instance tells them apart without guessing:
//! it changes only when the target process does. Layout:
//!
//! ```text
//! byte 0       peripheral qualifier and device type, as every page
//! byte 1       0xC0
//! bytes 2..4   page length, big-endian: 24
//! bytes 4..12  "braid   " (ASCII, padded with spaces)
//! bytes 12..28 the instance, a u128, big-endian
//! ```

/// The page code.
pub const INSTANCE_PAGE: u8 = 0xc0;

/// What opens the page's body, so that another vendor's page 0xC0 is
/// never read as an instance.
pub const SIGNATURE: &[u8; 8] = b"braid   ";

/// Bytes after the four-byte header.
const BODY: usize = 24;

/// The page's body (after the header the caller adds).
pub fn instance_body(instance: u128) -> Vec<u8> {
    let mut b = Vec::with_capacity(BODY);
    b.extend_from_slice(SIGNATURE);
    b.extend_from_slice(&instance.to_be_bytes());
    b
}

/// The instance in a page 0xC0 as INQUIRY returned it (header
/// included); `None` for a page that is not braid's: another code, a
/// length that is not 24, a missing signature, or data cut short.
pub fn decode_instance_page(page: &[u8]) -> Option<u128> {
    if page.get(1) != Some(&INSTANCE_PAGE) {
        return None;
    }
    let len = u16::from_be_bytes([*page.get(2)?, *page.get(3)?]);
    if usize::from(len) != BODY {
        return None;
    }
    let body = page.get(4..4 + BODY)?;
    if &body[..8] != SIGNATURE {
        return None;
    }
    Some(u128::from_be_bytes(body[8..].try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_these_bytes_and_decodes_back() {
        let instance = 0x0011_2233_4455_6677_8899_aabb_ccdd_eeff_u128;
        let mut page = vec![0x00, 0xc0, 0x00, 0x18];
        page.extend(instance_body(instance));
        assert_eq!(
            page,
            [
                0x00, 0xc0, 0x00, 0x18, b'b', b'r', b'a', b'i', b'd', b' ', b' ', b' ', 0x00, 0x11,
                0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff
            ]
        );
        assert_eq!(decode_instance_page(&page), Some(instance));
    }

    #[test]
    fn a_page_that_is_not_braids_is_refused() {
        let mut page = vec![0x00, 0xc0, 0x00, 0x18];
        page.extend(instance_body(7));
        let mut other_vendor = page.clone();
        other_vendor[4..12].copy_from_slice(b"LIO-ORG ");
        assert_eq!(decode_instance_page(&other_vendor), None, "no signature");
        let mut code = page.clone();
        code[1] = 0xc1;
        assert_eq!(decode_instance_page(&code), None, "another page");
        let mut len = page.clone();
        len[3] = 0x20;
        assert_eq!(decode_instance_page(&len), None, "another length");
        assert_eq!(decode_instance_page(&page[..27]), None, "cut short");
        assert_eq!(decode_instance_page(&[]), None);
        assert_eq!(decode_instance_page(&page), Some(7));
    }
}
