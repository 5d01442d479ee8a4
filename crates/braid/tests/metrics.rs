//! Prometheus metrics of `braid serve` and `braid attach` under a real load:
//! each scrape parses with the Prometheus project's own OpenMetrics parser,
//! every histogram has one fixed set of buckets, the byte counters add up
//! to the traffic the test sent, and every query of the Grafana dashboard
//! in contrib/ names a metric braid exports.

mod common;
mod labkit;

use braid_test_needs::needs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::{cmd, free_port, random_file, run, scrape, Serve};
use labkit::Attach;

/// One sample as the parser saw it.
#[derive(Debug, serde::Deserialize)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses with `prometheus_client.openmetrics.parser` (Debian's
/// python3-prometheus-client): every sample, or the parser's complaint.
fn parse(text: &str, dir: &Path) -> Vec<Sample> {
    let file = dir.join("scrape.txt");
    std::fs::write(&file, text).unwrap();
    let script = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse
out = []
for fam in parse(open(sys.argv[1]).read()):
    for s in fam.samples:
        out.append({'name': s.name, 'labels': s.labels, 'value': s.value})
print(json.dumps(out))
"#;
    let out = run(cmd("/usr/bin/python3").args(["-c", script]).arg(&file));
    serde_json::from_slice(&out.stdout).expect("the parser's JSON")
}

fn sum(samples: &[Sample], name: &str) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum()
}

/// The `le` values of each histogram series, by series.
fn bucket_sets(samples: &[Sample]) -> BTreeMap<String, Vec<String>> {
    let mut sets: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name.ends_with("_bucket")) {
        let mut series = s.labels.clone();
        let le = series.remove("le").expect("a bucket has le");
        sets.entry(format!("{} {series:?}", s.name))
            .or_default()
            .push(le);
    }
    sets
}

#[needs("nbdcopy", "python3")]
fn scrapes_parse_have_fixed_buckets_and_add_up_to_the_traffic() {
    let serve_port = free_port();
    let serve_metrics = format!("127.0.0.1:{serve_port}");
    let serve = Serve::start(&[
        "--metrics",
        &serve_metrics,
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.2:0",
    ]);
    // Two paths, one to each portal.
    let portals = serve.portals();
    assert_eq!(portals.len(), 2, "{portals:?}");
    let attach_port = free_port();
    let attach_metrics = format!("127.0.0.1:{attach_port}");
    let attach = Attach::start(
        None,
        &serve.uri("vol"),
        "vol",
        &["--metrics", &attach_metrics, "--policy", "round-robin"],
    );

    let dir = tempfile::tempdir().unwrap();
    let before_attach = parse(&scrape(attach_port), dir.path());
    let before_serve = parse(&scrape(serve_port), dir.path());
    let size = 16 << 20;
    let src = random_file(dir.path(), size, 7);
    let back = dir.path().join("back");
    run(cmd("nbdcopy").arg(&src).arg(attach.uri()));
    run(cmd("nbdcopy").arg(attach.uri()).arg(&back));
    assert_eq!(
        std::fs::read(&src).unwrap(),
        std::fs::read(&back).unwrap()[..size],
        "data read back differs"
    );

    let attach_text = scrape(attach_port);
    let serve_text = scrape(serve_port);
    let after_attach = parse(&attach_text, dir.path());
    let after_serve = parse(&serve_text, dir.path());

    // Bytes: the attach wrote and read exactly what nbdcopy moved, over
    // both paths; the target saw the same writes, and the same reads plus
    // the initiator's small health probes.
    let moved = |a: &[Sample], b: &[Sample], name: &str| sum(a, name) - sum(b, name);
    let size = size as f64;
    assert_eq!(
        moved(
            &after_attach,
            &before_attach,
            "braid_path_written_bytes_total"
        ),
        size
    );
    assert_eq!(
        moved(&after_attach, &before_attach, "braid_path_read_bytes_total"),
        size
    );
    let per_path: Vec<f64> = after_attach
        .iter()
        .filter(|s| s.name == "braid_path_written_bytes_total")
        .map(|s| s.value)
        .collect();
    assert!(
        per_path.len() == 2 && per_path.iter().all(|v| *v > 0.0),
        "{per_path:?}"
    );
    assert_eq!(
        moved(
            &after_serve,
            &before_serve,
            "braid_target_written_bytes_total"
        ),
        size
    );
    let read = moved(&after_serve, &before_serve, "braid_target_read_bytes_total");
    assert!(
        (size..size + (1 << 20) as f64).contains(&read),
        "target read {read}"
    );
    assert!(sum(&after_serve, "braid_target_connections_total") >= 2.0);
    assert_eq!(
        sum(&after_attach, "braid_volume_errors_returned_total"),
        0.0
    );

    // Fixed buckets: every series of a histogram has the same le set, and
    // an empty histogram (before any load) already had it.
    for (before, after) in [
        (&before_attach, &after_attach),
        (&before_serve, &after_serve),
    ] {
        let sets = bucket_sets(after);
        assert!(!sets.is_empty());
        let first = sets.values().next().unwrap().clone();
        assert!(first.len() > 10 && first.last().map(String::as_str) == Some("+Inf"));
        for (series, les) in &sets {
            assert_eq!(les, &first, "{series} has other buckets");
        }
        for (series, les) in bucket_sets(before) {
            assert_eq!(les, first, "{series} had other buckets before the load");
        }
    }

    // Every query of the dashboard names metrics that exist.
    let exported: BTreeSet<String> = after_attach
        .iter()
        .chain(&after_serve)
        .map(|s| s.name.clone())
        .collect();
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../contrib/grafana-braid.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut queries = Vec::new();
    collect_exprs(&dash, &mut queries);
    assert!(queries.len() >= 10, "{queries:?}");
    for q in &queries {
        let names = metric_names(q);
        assert!(!names.is_empty(), "query names no braid metric: {q}");
        for n in names {
            assert!(
                exported.contains(&n),
                "dashboard query names {n}, which braid does not export: {q}"
            );
        }
    }
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            // A template variable of type "query" asks Prometheus too.
            let variable_query = m.get("type").and_then(|t| t.as_str()) == Some("query");
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    ("query", serde_json::Value::String(s)) if variable_query => {
                        out.push(s.clone());
                    }
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// `braid_*` identifiers in a PromQL expression.
fn metric_names(q: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = q;
    while let Some(i) = rest.find("braid_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

#[needs("nbdcopy")]
fn status_latency_is_recent_and_leaves_probes_out() {
    let serve = Serve::start(&[]);
    let attach = Attach::start(None, &serve.uri("vol"), "vol", &[]);
    // An idle volume: the engine probes its path, but no user request has
    // run, so there is no latency to show.
    std::thread::sleep(Duration::from_millis(2500));
    let v = attach.status();
    let p = &v["paths"][0];
    assert!(p["others"].as_u64().unwrap() > 0, "no probe ran: {p}");
    assert_eq!(p["latency_p50_us"], 0, "probes are in the latency: {p}");
    assert_eq!(p["latency_1m_p99_us"], 0, "{p}");
    run(cmd("nbdcopy").arg(attach.uri()).arg("null:"));
    let p = &attach.status()["paths"][0];
    assert!(p["latency_p50_us"].as_u64().unwrap() > 0, "{p}");
    assert!(p["latency_1m_p99_us"].as_u64().unwrap() > 0, "{p}");
}

/// A `--metrics` address that is already taken ends `braid serve`'s start
/// before it logs a portal or an export: those lines are what a supervisor
/// or a test takes as "serving", and a server that said them and then
/// exited left its clients a refused connection and no reason.
#[test]
fn a_taken_metrics_port_ends_the_start_before_the_server_says_it_is_up() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let err = common::refused(dir.path(), &["--metrics", &addr, "vol=mem:1MiB"]);
    assert!(err.contains(&addr), "the error names the address:\n{err}");
    assert!(
        !err.contains(" portal ") && !err.contains(" export \""),
        "the server said it was up before it failed:\n{err}"
    );
}

/// The same for `braid attach`: a taken `--metrics` address ends the start
/// before a volume is attached, so no socket says "attached" to a client
/// of a process about to exit.
#[test]
fn a_taken_metrics_port_ends_attach_before_a_volume_is_attached() {
    let serve = Serve::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = common::output(
        std::process::Command::new(env!("CARGO_BIN_EXE_braid"))
            .env("NO_COLOR", "1")
            .arg("attach")
            .arg(serve.uri("vol"))
            .arg("--socket")
            .arg(dir.path().join("vol.sock"))
            .arg("--control")
            .arg(dir.path().join("ctl"))
            .args(["--metrics", &addr]),
        Duration::from_secs(20),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&addr), "the error names the address:\n{err}");
    assert!(
        !err.contains(" attached"),
        "a volume was attached before the start failed:\n{err}"
    );
}
