//! Text keys (RFC 7143, "Text Format"): `key=value` pairs, each ended by a
//! NUL byte, in the data segment of Login and Text PDUs.

/// Longest key name the RFC allows.
pub const MAX_KEY: usize = 63;

/// Longest value braid accepts: the RFC's limit for most values is 255
/// bytes, 8192 for some (CHAP challenges, SendTargets answers); anything
/// longer is refused rather than kept.
pub const MAX_VALUE: usize = 8192;

/// Most text one Login or Text request may carry, over all its
/// continued PDUs. Every key a login or SendTargets needs fits in a few
/// KiB; an initiator sending more before authentication would only make
/// the target hold and parse it (RFC 7143 lets a target refuse text past
/// what it can take).
pub const MAX_TEXT: usize = 64 * 1024;

/// Why a text data segment cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TextError {
    #[error("a text pair is not key=value: {0:?}")]
    NoEquals(String),
    #[error(
        "text key {0:?} is empty, longer than 63 bytes or not made of letters, digits and .-+@_"
    )]
    BadKey(String),
    #[error("the value of {key} is longer than {MAX_VALUE} bytes")]
    ValueTooLong { key: String },
    #[error("text is not UTF-8")]
    NotUtf8,
    #[error("key {0} appears twice")]
    Repeated(String),
}

/// Parses a data segment into pairs, in order, in time linear in its
/// length. A missing NUL after the last pair is tolerated (the RFC
/// requires it; some initiators pad with zeroes instead, which ends it
/// too).
///
/// # Errors
///
/// [`TextError`] for the first malformed pair.
pub fn parse(data: &[u8]) -> Result<Vec<(String, String)>, TextError> {
    parse_with(data, std::hash::RandomState::new())
}

/// [`parse`] with the hasher of the set that finds repeated keys: one
/// hash per key, so the cost grows with the text, not with its square.
pub(crate) fn parse_with<S: std::hash::BuildHasher>(
    data: &[u8],
    hasher: S,
) -> Result<Vec<(String, String)>, TextError> {
    // Sized up front: a set that grows rehashes what it holds.
    let pairs = data.iter().filter(|&&b| b == 0).count() + 1;
    let mut seen = std::collections::HashSet::with_capacity_and_hasher(pairs, hasher);
    let mut out: Vec<(String, String)> = Vec::new();
    for raw in data.split(|&b| b == 0).filter(|p| !p.is_empty()) {
        let pair = std::str::from_utf8(raw).map_err(|_| TextError::NotUtf8)?;
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| TextError::NoEquals(pair.chars().take(80).collect()))?;
        if !valid_key(key) {
            return Err(TextError::BadKey(key.chars().take(80).collect()));
        }
        if value.len() > MAX_VALUE {
            return Err(TextError::ValueTooLong { key: key.into() });
        }
        if !seen.insert(key) {
            return Err(TextError::Repeated(key.into()));
        }
        out.push((key.to_owned(), value.to_owned()));
    }
    Ok(out)
}

/// Encodes pairs as a data segment (each pair NUL-terminated).
pub fn encode<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref().as_bytes());
        out.push(b'=');
        out.extend_from_slice(v.as_ref().as_bytes());
        out.push(0);
    }
    out
}

/// Key names: letters, digits and `.-+@_`, 1 to 63 bytes (standard keys
/// and `X-` / `X#` extension keys alike).
fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-+@_#".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_in_order() {
        let pairs = [
            ("InitiatorName", "iqn.2026-11.org.example:host"),
            ("SessionType", "Normal"),
            ("HeaderDigest", "CRC32C,None"),
        ];
        let wire = encode(&pairs);
        assert_eq!(&wire[..33], b"InitiatorName=iqn.2026-11.org.exa");
        assert_eq!(wire.iter().filter(|&&b| b == 0).count(), 3);
        let back = parse(&wire).unwrap();
        let want: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(back, want);
    }

    #[test]
    fn padding_zeroes_and_a_missing_last_nul_are_tolerated() {
        assert_eq!(
            parse(b"A=1\0B=2\0\0\0").unwrap(),
            [("A".into(), "1".into()), ("B".into(), "2".into())]
        );
        assert_eq!(parse(b"A=1").unwrap(), [("A".into(), "1".into())]);
        assert_eq!(parse(b"A=\0").unwrap(), [("A".into(), "".into())]);
    }

    #[test]
    fn malformed_text_is_refused() {
        assert_eq!(
            parse(b"novalue\0"),
            Err(TextError::NoEquals("novalue".into()))
        );
        assert_eq!(parse(b"=x\0"), Err(TextError::BadKey("".into())));
        assert_eq!(parse(b"a b=x\0"), Err(TextError::BadKey("a b".into())));
        let long_key = format!("{}=1", "k".repeat(64));
        assert!(matches!(
            parse(long_key.as_bytes()),
            Err(TextError::BadKey(_))
        ));
        let long_value = format!("K={}", "v".repeat(MAX_VALUE + 1));
        assert_eq!(
            parse(long_value.as_bytes()),
            Err(TextError::ValueTooLong { key: "K".into() })
        );
        assert_eq!(parse(b"K=\xff\0"), Err(TextError::NotUtf8));
        assert_eq!(parse(b"K=1\0K=2\0"), Err(TextError::Repeated("K".into())));
    }
}
