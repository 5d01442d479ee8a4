//! The text report: findings grouped by what they are about (paths first,
//! then interfaces, devices, exports, the host), problems in full with
//! their evidence and fix, `ok` in one line each, wrapped to 80 columns.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::finding::{Finding, Report, Severity, Subject};

/// Width the report is wrapped to.
pub const WIDTH: usize = 80;

/// The report as text.
pub fn text(report: &Report) -> String {
    let mut groups: BTreeMap<&Subject, Vec<&Finding>> = BTreeMap::new();
    for f in &report.findings {
        groups.entry(&f.subject).or_default().push(f);
    }
    let mut out = String::new();
    for (subject, mut findings) in groups {
        findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
        let _ = writeln!(out, "{subject}");
        for f in findings {
            finding(&mut out, f);
        }
        out.push('\n');
    }
    let count = |s: Severity| report.findings.iter().filter(|f| f.severity == s).count();
    let _ = writeln!(
        out,
        "{} fail, {} warn, {} ok",
        count(Severity::Fail),
        count(Severity::Warn),
        count(Severity::Ok)
    );
    out
}

fn finding(out: &mut String, f: &Finding) {
    let tag = match f.severity {
        Severity::Ok => "ok  ",
        Severity::Warn => "WARN",
        Severity::Fail => "FAIL",
    };
    if f.severity == Severity::Ok {
        let head = format!("  {tag} {}: ", f.check);
        wrap_into(out, &head, &f.why, &" ".repeat(7));
        return;
    }
    let _ = writeln!(out, "  {tag} {}", f.check);
    let body = " ".repeat(7);
    wrap_into(out, &body, &f.why, &body);
    for (i, e) in f.evidence.iter().enumerate() {
        let head = if i == 0 {
            "       read: "
        } else {
            "             "
        };
        wrap_into(
            out,
            head,
            &format!("{} = {}", e.source, e.value),
            &" ".repeat(15),
        );
    }
    if let Some(fix) = &f.fix {
        for (i, line) in fix.to_string().lines().enumerate() {
            let head = if i == 0 {
                "       fix:  "
            } else {
                "             "
            };
            wrap_into(out, head, line, &" ".repeat(15));
        }
    }
}

/// Writes `text` after `first`, wrapped at [`WIDTH`], continuing lines
/// with `rest` as indent. Words longer than a line are left whole.
fn wrap_into(out: &mut String, first: &str, text: &str, rest: &str) {
    let mut line = first.to_owned();
    let mut fresh = true;
    for word in text.split_whitespace() {
        let len = line.chars().count();
        if !fresh && len + 1 + word.chars().count() > WIDTH {
            out.push_str(line.trim_end());
            out.push('\n');
            line = rest.to_owned();
            fresh = true;
        }
        if !fresh {
            line.push(' ');
        }
        line.push_str(word);
        fresh = false;
    }
    out.push_str(line.trim_end());
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::Fix;

    #[test]
    fn grouped_wrapped_and_counted() {
        let long = "word ".repeat(40);
        let r = Report {
            findings: vec![
                Finding::ok("duplex", Subject::Interface("eth0".into()), "full duplex"),
                Finding::new(
                    "link-speed",
                    Severity::Warn,
                    Subject::Interface("eth0".into()),
                    long,
                )
                .read("/sys/class/net/eth0/speed", "100")
                .fix(Fix::Run("ethtool -r eth0".into())),
                Finding::ok(
                    "route",
                    Subject::Path {
                        index: 1,
                        via: "a → b".into(),
                    },
                    "fine",
                ),
            ],
        };
        let t = text(&r);
        assert!(t.lines().all(|l| l.chars().count() <= WIDTH), "{t}");
        let path = t.find("path 1 (a → b)").unwrap();
        let iface = t.find("interface eth0").unwrap();
        assert!(path < iface, "paths come first:\n{t}");
        let warn = t.find("WARN link-speed").unwrap();
        let ok = t.find("ok   duplex").unwrap();
        assert!(warn < ok, "problems before ok lines:\n{t}");
        assert!(t.contains("fix:  ethtool -r eth0"));
        assert!(t.ends_with("0 fail, 1 warn, 2 ok\n"), "{t}");
    }
}
