//! `braid status`, `braid policy`, `braid path`: the running serve and
//! attach processes, seen and steered through their control sockets.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use braid_target::source::format_size;
use serde_json::{json, Value};

use crate::cli::{PathArgs, PolicyArgs, StatusArgs, UsageError};
use crate::control;
use crate::out::{self, out, outln};

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

async fn gather(only: &Option<PathBuf>) -> Result<Vec<(PathBuf, Value)>> {
    match only {
        Some(p) => Ok(vec![(
            p.clone(),
            control::request(p, &json!({"op": "status"})).await?,
        )]),
        None => Ok(control::discover().await),
    }
}

pub fn status(args: StatusArgs) -> Result<()> {
    runtime()?.block_on(async {
        let mut rounds = 0u64;
        loop {
            let all = gather(&args.control).await?;
            if args.json {
                let list: Vec<Value> = all.iter().map(|(_, v)| v.clone()).collect();
                outln!(
                    "{}",
                    serde_json::to_string_pretty(&json!({ "processes": list }))?
                );
            } else {
                if args.watch {
                    // Clear the screen and home the cursor: refresh in place.
                    out!("\x1b[2J\x1b[H");
                }
                if all.is_empty() {
                    outln!(
                        "no braid serve or attach is running (control sockets are in {})",
                        control::dir().display()
                    );
                }
                for (_, v) in &all {
                    out!("{}", render(v));
                }
            }
            rounds += 1;
            if !args.watch || args.count.is_some_and(|c| rounds >= c) || out::closed() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_secs_f64(args.interval.max(0.2))).await;
        }
    })
}

fn mb(v: &Value) -> String {
    format!("{:.1} MB/s", v.as_f64().unwrap_or(0.0) / 1e6)
}

fn ms(v: &Value) -> String {
    format!("{:.2} ms", v.as_f64().unwrap_or(0.0) / 1e3)
}

/// The topology as a tree, like `multipath -ll`.
pub fn render(v: &Value) -> String {
    let mut out = String::new();
    let pid = &v["pid"];
    match v["role"].as_str() {
        Some("attach") => {
            for vol in v["volumes"].as_array().into_iter().flatten() {
                out.push_str(&format!(
                    "{} ({}) size {} policy {}\n  identity {}, socket {}, braid attach pid {pid}{}\n",
                    vol["name"].as_str().unwrap_or("?"),
                    vol["uri"].as_str().unwrap_or("?"),
                    format_size(vol["size"].as_u64().unwrap_or(0)),
                    vol["policy"].as_str().unwrap_or("?"),
                    vol["identity"].as_str().unwrap_or("unknown (plain NBD server)"),
                    vol["socket"].as_str().unwrap_or("?"),
                    if vol["fencing"] == true { "" } else { ", no fencing" },
                ));
                let paths = vol["paths"].as_array().cloned().unwrap_or_default();
                for (i, p) in paths.iter().enumerate() {
                    let branch = if i + 1 == paths.len() {
                        "└─"
                    } else {
                        "├─"
                    };
                    let local = p["local"].as_str().unwrap_or("*");
                    let route = if local == "*" {
                        p["portal"].as_str().unwrap_or("?").to_owned()
                    } else {
                        format!("{local} → {}", p["portal"].as_str().unwrap_or("?"))
                    };
                    out.push_str(&format!(
                        "{branch} path {} {route} {} ({} conn)\n",
                        p["index"],
                        p["state"].as_str().unwrap_or("?"),
                        p["connections"]
                    ));
                    let cont = if i + 1 == paths.len() { "  " } else { "│ " };
                    out.push_str(&format!(
                        "{cont}   read {} {:.0} IOPS, write {} {:.0} IOPS, in flight {} / {}\n",
                        mb(&p["read_bytes_per_s"]),
                        p["read_iops"].as_f64().unwrap_or(0.0),
                        mb(&p["write_bytes_per_s"]),
                        p["write_iops"].as_f64().unwrap_or(0.0),
                        p["inflight_requests"],
                        format_size(p["inflight_bytes"].as_u64().unwrap_or(0)),
                    ));
                    out.push_str(&format!(
                        "{cont}   latency 10 s p50 {} p99 {}, 1 min p99 {}, errors {}, failovers {}, failbacks {}\n",
                        ms(&p["latency_p50_us"]),
                        ms(&p["latency_p99_us"]),
                        ms(&p["latency_1m_p99_us"]),
                        p["errors"],
                        p["failures"],
                        p["restores"],
                    ));
                    // Knobs only once someone set them: most volumes have none.
                    if let Some(c) = p["config"].as_str().filter(|c| *c != DEFAULT_KNOBS) {
                        out.push_str(&format!("{cont}   {c}\n"));
                    }
                }
            }
        }
        Some("serve") => {
            out.push_str(&format!("braid serve pid {pid}\n"));
            for p in v["portals"].as_array().into_iter().flatten() {
                out.push_str(&format!("  portal {}\n", p.as_str().unwrap_or("?")));
            }
            for e in v["exports"].as_array().into_iter().flatten() {
                out.push_str(&format!(
                    "  export {} {} volume {}\n",
                    e["name"].as_str().unwrap_or("?"),
                    format_size(e["size"].as_u64().unwrap_or(0)),
                    e["identity"].as_str().unwrap_or("?"),
                ));
            }
            let conns = v["connections"].as_array().cloned().unwrap_or_default();
            for (i, c) in conns.iter().enumerate() {
                let branch = if i + 1 == conns.len() {
                    "└─"
                } else {
                    "├─"
                };
                out.push_str(&format!(
                    "{branch} conn {} {} → {} export {}: read {} write {}, in flight {}, errors {}\n",
                    c["id"],
                    c["peer"].as_str().unwrap_or("?"),
                    c["portal"].as_str().unwrap_or("?"),
                    c["export"].as_str().unwrap_or("(handshake)"),
                    mb(&c["read_bytes_per_s"]),
                    mb(&c["write_bytes_per_s"]),
                    c["inflight"],
                    c["errors"],
                ));
            }
        }
        _ => out.push_str(&format!("{v}\n")),
    }
    out
}

fn expect_ok(v: Value) -> Result<()> {
    if v["ok"] == true {
        Ok(())
    } else {
        bail!("{}", v["error"].as_str().unwrap_or("refused"))
    }
}

pub fn policy(args: PolicyArgs) -> Result<()> {
    runtime()?.block_on(async {
        let sock = match &args.control {
            Some(p) => p.clone(),
            None => control::find_volume(&args.volume).await?,
        };
        let v = control::request(
            &sock,
            &json!({"op": "policy", "volume": args.volume, "policy": args.policy.as_str()}),
        )
        .await?;
        expect_ok(v)?;
        outln!("{}: policy {}", args.volume, args.policy);
        Ok(())
    })
}

/// What `attach::knobs` says of a path nobody configured.
const DEFAULT_KNOBS: &str = "priority=0 weight=0 standby=no relative-throughput=1 repeat-count=0";

pub fn path(args: PathArgs) -> Result<()> {
    let first = args.action.first().map(String::as_str);
    let (request, done) = match (first, args.action.len()) {
        (Some("enable"), 1) => (
            json!({"op": "path", "volume": args.volume, "path": args.path, "enable": true}),
            "enabled".to_owned(),
        ),
        (Some("disable"), 1) => (
            json!({"op": "path", "volume": args.volume, "path": args.path, "enable": false}),
            "disabled (requests in flight finish there; new ones go elsewhere)".to_owned(),
        ),
        _ => {
            // Checked here too, so a typo is a usage error before anything
            // is asked of the volume.
            braid_initiator::PathAttrs::parse(args.action.iter().map(String::as_str))
                .map_err(|e| UsageError(format!("{e}; or give enable or disable")))?;
            (
                json!({"op": "path", "volume": args.volume, "path": args.path, "set": args.action}),
                String::new(),
            )
        }
    };
    runtime()?.block_on(async {
        let sock = match &args.control {
            Some(p) => p.clone(),
            None => control::find_volume(&args.volume).await?,
        };
        let v = control::request(&sock, &request).await?;
        let config = v["config"].as_str().map(str::to_owned);
        expect_ok(v)?;
        match config {
            Some(c) => outln!("{}: path {} {c}", args.volume, args.path),
            None => outln!("{}: path {} {done}", args.volume, args.path),
        }
        Ok(())
    })
}
