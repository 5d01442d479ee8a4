//! iSCSI's header and data digests: CRC32C (Castagnoli), sent in
//! little-endian byte order after the header (and its AHS) or after the
//! padded data segment (RFC 7143, "Digests").

/// Which digests a connection negotiated (`HeaderDigest`, `DataDigest`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// Bytes a digest takes on the wire.
pub const DIGEST_LEN: usize = 4;

/// CRC32C of `bytes`, as iSCSI computes it.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// CRC32C of what `crc` covered followed by `bytes`: a digest over data
/// that lies in several pieces (a data segment and its padding).
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, bytes)
}

/// The digest as it goes on the wire.
pub fn wire(bytes: &[u8]) -> [u8; DIGEST_LEN] {
    crc32c(bytes).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CRC32C examples of RFC 3720, appendix B.4 (32-byte buffers).
    #[test]
    fn the_rfc_examples() {
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        let up: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&up), 0x46dd_794e);
        let down: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c(&down), 0x113f_db5c);
    }

    #[test]
    fn a_digest_over_pieces_is_the_digest_of_the_whole() {
        let up: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c_append(crc32c(&up[..13]), &up[13..]), 0x46dd_794e);
    }

    #[test]
    fn the_wire_form_is_little_endian() {
        assert_eq!(wire(&[0u8; 32]), [0xaa, 0x36, 0x91, 0x8a]);
    }
}
