//! `braid doctor` as a command over the captured trees of
//! `crates/doctor/fixtures`: the JSON document has the documented shape
//! (read back through the library's own types), the text fits 80 columns,
//! the exit status says whether anything needs fixing, and `--apply`
//! refuses a tree that is not this host.

use std::process::{Command, Output};

use braid_doctor::{Report, Severity};

fn fixture(name: &str) -> String {
    format!("{}/../doctor/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn doctor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_braid"))
        .arg("doctor")
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run braid doctor")
}

#[test]
fn json_over_a_fixture_has_the_documented_shape() {
    let out = doctor(&["--serve", "--root", &fixture("nics"), "--json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["findings"]);
    for f in v["findings"].as_array().unwrap() {
        let mut k: Vec<&str> = f.as_object().unwrap().keys().map(String::as_str).collect();
        k.sort_unstable();
        assert_eq!(
            k,
            ["check", "evidence", "fix", "severity", "subject", "why"]
        );
    }
    let typed: Report = serde_json::from_slice(&out.stdout).expect("the library's types");
    assert_eq!(typed.worst(), Severity::Fail);
    assert!(typed
        .findings
        .iter()
        .any(|f| f.check == "duplex" && f.subject.to_string() == "interface eth1"));
}

#[test]
fn text_is_grouped_and_fits_80_columns() {
    let out = doctor(&[
        "--serve",
        "--root",
        &fixture("raid5-reshape"),
        "vol=/srv/vol.img",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "{line:?}");
    }
    assert!(text.contains("\ndevice md0\n"), "{text}");
    assert!(text.contains("WARN md-sync-speed"), "{text}");
    assert!(text.trim_end().ends_with("0 fail, 3 warn, 21 ok"), "{text}");
}

#[test]
fn exit_status_is_zero_only_when_all_is_well() {
    let out = doctor(&["--serve", "--root", &fixture("healthy"), "vol=/srv/vol.img"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = doctor(&["--serve", "--root", &fixture("raid6-resync")]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[test]
fn apply_is_refused_on_a_captured_tree_and_bad_roots_are_usage_errors() {
    let out = doctor(&["--serve", "--root", &fixture("nics"), "--apply", "--yes"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--apply") && err.contains("--root"), "{err}");
    let out = doctor(&["--serve", "--root", "/nonexistent-tree"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn html_is_a_page_of_every_finding_worst_first() {
    let json = doctor(&["--serve", "--root", &fixture("nics"), "--json"]);
    let typed: Report = serde_json::from_slice(&json.stdout).expect("JSON");
    let out = doctor(&["--serve", "--root", &fixture("nics"), "--html"]);
    assert_eq!(out.status.code(), Some(1), "the same exit status as text");
    let html = String::from_utf8(out.stdout).unwrap();
    assert!(html.starts_with("<!doctype html>"), "{html}");
    assert!(!html.contains("<script"), "the page stands alone");
    // Every finding, worst first.
    assert_eq!(
        html.matches("<article class=\"finding").count(),
        typed.findings.len()
    );
    let last_fail = html.rfind("finding sev-fail").expect("a failing finding");
    let first_ok = html.find("finding sev-ok").unwrap_or(html.len());
    assert!(last_fail < first_ok);
    for f in &typed.findings {
        assert!(html.contains(&format!(" {} <span", f.check)), "{}", f.check);
    }
}
