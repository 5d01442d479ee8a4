//! Sizes, rates and durations as findings print them.

/// Bytes in binary units: `512 KiB`, `1.8 TiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 || v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[unit])
    } else if v < 10.0 {
        format!("{v:.1} {}", UNITS[unit])
    } else {
        format!("{v:.0} {}", UNITS[unit])
    }
}

/// Bytes per second in decimal megabytes, as people quote link goodput:
/// `117.6 MB/s`.
pub fn mbytes_per_s(bytes_per_s: f64) -> String {
    let mb = bytes_per_s / 1e6;
    if mb < 10.0 {
        format!("{mb:.2} MB/s")
    } else {
        format!("{mb:.1} MB/s")
    }
}

/// Bits per second as link speeds are named: `1 Gbit/s`, `100 Mbit/s`,
/// `98.96 Mbit/s`.
pub fn bits_per_s(bits: u64) -> String {
    let (v, unit) = if bits >= 1_000_000_000 {
        (bits as f64 / 1e9, "Gbit/s")
    } else if bits >= 1_000_000 {
        (bits as f64 / 1e6, "Mbit/s")
    } else {
        (bits as f64 / 1e3, "kbit/s")
    };
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s} {unit}")
}

/// A duration of seconds in the unit a person would use: `42 s`, `16 min`,
/// `16.2 hours`, `9.8 days`.
pub fn duration(secs: f64) -> String {
    if !secs.is_finite() {
        return "forever".into();
    }
    if secs < 120.0 {
        format!("{secs:.0} s")
    } else if secs < 2.0 * 3600.0 {
        format!("{:.0} min", secs / 60.0)
    } else if secs < 2.0 * 86400.0 {
        format!("{:.1} hours", secs / 3600.0)
    } else {
        format!("{:.1} days", secs / 86400.0)
    }
}

/// Milliseconds with sensible precision: `0.12 ms`, `20.3 ms`.
pub fn millis(ms: f64) -> String {
    if ms < 1.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{ms:.1} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readable_units() {
        assert_eq!(bytes(512 * 1024), "512 KiB");
        assert_eq!(bytes(1536 * 1024), "1.5 MiB");
        assert_eq!(bytes(100), "100 B");
        assert_eq!(bits_per_s(1_000_000_000), "1 Gbit/s");
        assert_eq!(bits_per_s(98_960_000), "98.96 Mbit/s");
        assert_eq!(mbytes_per_s(117_600_000.0), "117.6 MB/s");
        assert_eq!(duration(30.0), "30 s");
        assert_eq!(duration(16.0 * 3600.0), "16.0 hours");
        assert_eq!(duration(10.0 * 86400.0), "10.0 days");
        assert_eq!(millis(0.123), "0.12 ms");
    }
}
