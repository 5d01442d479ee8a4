//! Figures as the page prints them, and HTML escaping: one place, so the
//! first paint and every later update read alike.

use std::fmt::Write;

/// Escapes text for HTML content and quoted attributes.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// MB/s with one decimal (decimal megabytes, as the CLI prints them).
pub fn mbps(bytes_per_s: f64) -> String {
    // A sum of nothing is -0.0: printed as 0.0.
    let v = bytes_per_s / 1e6;
    format!("{:.1}", if v > 0.0 { v } else { 0.0 })
}

/// A rate of requests, whole.
pub fn per_s(n: f64) -> String {
    format!("{n:.0}")
}

/// Microseconds as milliseconds; a dash when nothing was measured.
pub fn ms(us: u64) -> String {
    if us == 0 {
        "–".to_owned()
    } else {
        format!("{:.2}", us as f64 / 1e3)
    }
}

/// Bytes in binary units, as `braid status` prints sizes.
pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 || v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A measured time: milliseconds under two seconds, else seconds.
pub fn took(ms: u64) -> String {
    if ms < 2000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1e3)
    }
}

/// Wall-clock time of day in UTC, `HH:MM:SS.mmm` (the page's script
/// shows it in the reader's own zone).
pub fn clock(at_ms: u64) -> String {
    let day_ms = at_ms % 86_400_000;
    let mut s = String::new();
    let _ = write!(
        s,
        "{:02}:{:02}:{:02}.{:03}",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_as_the_cli_prints_them() {
        assert_eq!(
            esc(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(mbps(117_234_000.0), "117.2");
        assert_eq!(mbps([].iter().sum()), "0.0");
        assert_eq!(ms(0), "–");
        assert_eq!(ms(7930), "7.93");
        assert_eq!(size(2 << 30), "2 GiB");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(512), "512 B");
        assert_eq!(took(528), "528 ms");
        assert_eq!(took(4200), "4.2 s");
        // 2026-11-27 18:42:03.512 UTC
        assert_eq!(clock(1_795_804_923_512), "18:42:03.512");
    }
}
