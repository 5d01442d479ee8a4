//! CHAP for iSCSI logins (RFC 1994 as RFC 7143 uses it): MD5 only
//! (`CHAP_A=5`), values in hex. A response is MD5 over the one-byte
//! identifier, the secret and the challenge.

use md5::{Digest, Md5};

/// The credentials a target checks, and the ones it proves itself with
/// when the initiator asks (mutual CHAP).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub secret: Vec<u8>,
    /// The target's own name and secret, for mutual CHAP.
    pub mutual: Option<(String, Vec<u8>)>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets never reach a log.
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("mutual", &self.mutual.as_ref().map(|(u, _)| u))
            .finish_non_exhaustive()
    }
}

/// RFC 1994's response: MD5(identifier || secret || challenge).
pub fn response(id: u8, secret: &[u8], challenge: &[u8]) -> [u8; 16] {
    let mut h = Md5::new();
    h.update([id]);
    h.update(secret);
    h.update(challenge);
    h.finalize().into()
}

/// A CHAP binary value as the text keys carry it: `0x` and hex digits.
pub fn to_hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 + 2 * bytes.len());
    s.push_str("0x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Parses `0x...` hex (either case). Base64 (`0b...`) is not accepted:
/// no initiator braid meets sends it for CHAP.
pub fn from_hex(v: &str) -> Option<Vec<u8>> {
    let digits = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X"))?;
    // Hex digits only: anything else (a multi-byte character above all)
    // is refused before the digits are cut in pairs.
    if digits.is_empty()
        || digits.len() % 2 != 0
        || digits.len() > 2048
        || !digits.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).ok())
        .collect()
}

/// Compares two responses in time that does not depend on where they
/// differ.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_response_is_md5_of_id_secret_and_challenge() {
        // Identifier 'a', secret "b", challenge "c": MD5("abc"), RFC 1321's
        // own example.
        assert_eq!(
            to_hex(&response(b'a', b"b", b"c")),
            "0x900150983cd24fb0d6963f7d28e17f72"
        );
    }

    #[test]
    fn hex_round_trips_and_refuses_the_malformed() {
        assert_eq!(to_hex(&[0, 0xab, 0x10]), "0x00ab10");
        assert_eq!(from_hex("0x00AB10"), Some(vec![0, 0xab, 0x10]));
        assert_eq!(from_hex("00ab"), None);
        assert_eq!(from_hex("0x0"), None);
        assert_eq!(from_hex("0xzz"), None);
        assert_eq!(from_hex("0bAAAA"), None);
        // Found by fuzzing: a character of two bytes across a pair.
        assert_eq!(from_hex("0xababaaD\u{496}gest"), None);
        assert_eq!(from_hex("0x+1"), None, "from_str_radix would take the sign");
        assert!(same(&[1, 2], &[1, 2]) && !same(&[1, 2], &[1, 3]) && !same(&[1], &[1, 1]));
    }
}
