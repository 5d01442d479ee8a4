//! `braid doctor --html`: the findings as one page in the console's look,
//! standing alone (its style inlined, no script), so it can be attached
//! to a support ticket and opened anywhere.

use std::fmt::Write;

use crate::fmt::esc;
use crate::model::DoctorReport;

/// The report as a page; `title` says what was checked and where.
pub fn doctor_page(report: &DoctorReport, title: &str) -> String {
    let count = |s: &str| report.findings.iter().filter(|f| f.severity == s).count();
    let mut body = String::new();
    let _ = write!(
        body,
        "<p class=\"summary\"><span class=\"badge down\">{} fail</span> \
         <span class=\"badge wait\">{} warn</span> <span class=\"badge up\">{} ok</span></p>",
        count("fail"),
        count("warn"),
        count("ok")
    );
    // Worst first, then in the order the checks ran.
    let mut order: Vec<_> = report.findings.iter().collect();
    order.sort_by_key(|f| match f.severity.as_str() {
        "fail" => 0,
        "warn" => 1,
        _ => 2,
    });
    for f in order {
        let tone = match f.severity.as_str() {
            "fail" => "down",
            "warn" => "wait",
            _ => "up",
        };
        let evidence: String = f
            .evidence
            .iter()
            .map(|e| {
                format!(
                    "<tr><th>{}</th><td>{}</td></tr>",
                    esc(&e.source),
                    esc(&e.value)
                )
            })
            .collect();
        let _ = write!(
            body,
            "<article class=\"finding sev-{sev}\"><h3><span class=\"badge {tone}\">{sev}</span> \
             {check} <span class=\"sub\">{subject}</span></h3><p>{why}</p>{evidence}{fix}</article>",
            sev = esc(&f.severity),
            check = esc(&f.check),
            subject = esc(&f.subject),
            why = esc(&f.why),
            evidence = if evidence.is_empty() {
                String::new()
            } else {
                format!("<table class=\"evidence\"><caption>read</caption>{evidence}</table>")
            },
            fix = f
                .fix
                .as_ref()
                .map(|x| format!("<p class=\"fixlabel\">fix</p><pre class=\"fix\">{}</pre>", esc(x)))
                .unwrap_or_default(),
        );
    }
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>braid doctor: {t}</title><style>{css}</style></head><body data-role=\"doctor\">\
         <header class=\"top\"><h1>braid <span>doctor</span></h1><span class=\"meta\">{t}</span>\
         </header><main class=\"doctor\">{body}</main></body></html>\n",
        t = esc(title),
        css = include_str!("../assets/console.css"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DoctorEvidence, DoctorFinding};

    #[test]
    fn findings_come_worst_first_with_what_was_read_and_the_fix() {
        let f = |check: &str, severity: &str, fix: Option<&str>| DoctorFinding {
            check: check.into(),
            severity: severity.into(),
            subject: "path 1 (10.77.1.1:10809)".into(),
            evidence: vec![DoctorEvidence {
                source: "/sys/class/net/brc1/mtu".into(),
                value: "9000".into(),
            }],
            why: "one end uses <jumbo> frames".into(),
            fix: fix.map(Into::into),
        };
        let report = DoctorReport {
            findings: vec![
                f("route", "ok", None),
                f("mtu", "fail", Some("ip link set dev brc1 mtu 1500")),
            ],
        };
        let html = doctor_page(&report, "nbd://10.77.1.1/vol");
        assert!(
            html.find("mtu").unwrap() < html.find("route").unwrap(),
            "{html}"
        );
        assert!(html.contains("1 fail"), "{html}");
        assert!(html.contains("<pre class=\"fix\">ip link set dev brc1 mtu 1500</pre>"));
        assert!(html.contains("&lt;jumbo&gt;"));
        assert!(!html.contains("<script"), "the page stands alone");
    }
}
