//! iSCSI names (RFC 3720 "iSCSI Names", RFC 3722 "String Profile for
//! iSCSI Names"): what an initiator or target may call itself. A name
//! reaches logs, the session registry and the reservation file, so one
//! that is not a name (a space, a newline, a slash) is refused at login
//! rather than carried.
//!
//! The three forms: `iqn.` with the month a naming authority was held
//! and that authority's domain, reversed (`iqn.2026-11.org.example` and
//! optionally `:` and anything unique under it); `eui.` with 16 hex
//! digits (an EUI-64); `naa.` with 16 or 32 hex digits (an NAA
//! identifier). At most 223 bytes, of lower-case ASCII letters, digits,
//! `-`, `.` and `:`, which is what RFC 3722's profile leaves of ASCII
//! once upper case is folded to lower (so upper case is taken too, as the
//! same name). Names outside ASCII are not taken.

/// Longest name, in bytes (RFC 3720).
pub const MAX_NAME: usize = 223;

/// What is wrong with a name.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NameError {
    #[error("is empty")]
    Empty,
    #[error("is {0} bytes long, more than the 223 an iSCSI name may have")]
    TooLong(usize),
    #[error(
        "has '{}' at byte {at}: an iSCSI name has only letters, digits, '-', '.' and ':'",
        .found.escape_default()
    )]
    Character { found: char, at: usize },
    #[error("does not begin with iqn., eui. or naa.")]
    Form,
    #[error("has no date after iqn. (yyyy-mm, the month the naming authority was held)")]
    Date,
    #[error("has no naming authority after its date (a reversed domain, e.g. org.example)")]
    Authority,
    #[error("is not eui. and 16 hex digits")]
    Eui,
    #[error("is not naa. and 16 or 32 hex digits")]
    Naa,
}

/// Checks that `name` is an iSCSI name.
///
/// # Errors
///
/// [`NameError`]: what is wrong, first found first.
pub fn check(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if let Some((at, found)) = name
        .char_indices()
        .find(|&(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':')))
    {
        return Err(NameError::Character { found, at });
    }
    if name.len() > MAX_NAME {
        return Err(NameError::TooLong(name.len()));
    }
    let lower = name.to_ascii_lowercase();
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_hexdigit());
    if let Some(rest) = lower.strip_prefix("iqn.") {
        return iqn(rest);
    }
    if let Some(digits) = lower.strip_prefix("eui.") {
        return (digits.len() == 16 && hex(digits))
            .then_some(())
            .ok_or(NameError::Eui);
    }
    if let Some(digits) = lower.strip_prefix("naa.") {
        return (matches!(digits.len(), 16 | 32) && hex(digits))
            .then_some(())
            .ok_or(NameError::Naa);
    }
    Err(NameError::Form)
}

/// The part of an iqn. name after `iqn.`: `yyyy-mm.authority[:unique]`.
fn iqn(rest: &str) -> Result<(), NameError> {
    let b = rest.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let month = rest.get(5..7).and_then(|m| m.parse::<u8>().ok());
    if !(digits(0..4) && b.get(4) == Some(&b'-') && digits(5..7) && matches!(month, Some(1..=12))) {
        return Err(NameError::Date);
    }
    let Some(after) = rest.get(7..).and_then(|r| r.strip_prefix('.')) else {
        return Err(NameError::Authority);
    };
    let authority = after.split(':').next().unwrap_or_default();
    if authority.is_empty() || authority.split('.').any(str::is_empty) {
        return Err(NameError::Authority);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_are_names() {
        for name in [
            "iqn.2026-11.org.example",
            "iqn.2026-11.org.example:vol",
            "iqn.2001-04.com.example:storage:diskarrays-sn-a8675309",
            "eui.02004567a425678d",
            "naa.52004567BA64678D",
            "naa.62004567BA64678D0123456789ABCDEF",
        ] {
            assert_eq!(check(name), Ok(()), "{name}");
        }
        let longest = format!("iqn.2026-11.org.example:{}", "a".repeat(MAX_NAME - 24));
        assert_eq!(longest.len(), MAX_NAME);
        assert_eq!(check(&longest), Ok(()));
    }

    #[test]
    fn what_is_wrong_is_named() {
        assert_eq!(
            check("iqn.2026-11.org.example:a\nb"),
            Err(NameError::Character {
                found: '\n',
                at: 25
            })
        );
        let e = check("iqn.2026-11.org.example:a\nb")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("has '\\n' at byte 25"), "{e}");
        assert_eq!(check(&"a".repeat(224)), Err(NameError::TooLong(224)));
        assert_eq!(check("iqn.2026-1.org.example"), Err(NameError::Date));
        assert_eq!(check("iqn.2026-00.org.example"), Err(NameError::Date));
        assert_eq!(check("iqn.2026-11"), Err(NameError::Authority));
        assert_eq!(check("iqn.2026-11.org.:x"), Err(NameError::Authority));
        assert_eq!(check("eui.0123"), Err(NameError::Eui));
        assert_eq!(check("naa.0123456789abcdef0"), Err(NameError::Naa));
        assert_eq!(check("target"), Err(NameError::Form));
    }
}
