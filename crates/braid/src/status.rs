//! `braid status`, `braid policy`, `braid path`: the running serve and
//! attach processes, seen and steered through their control sockets.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use braid_store::source::format_size;

use crate::cli::{AluaArgs, ClearLossArgs, PathArgs, PolicyArgs, StatusArgs, UsageError};
use crate::control;
use crate::ctl::{Ack, PeerStatus, Processes, Request, Status, VolumeStatus};
use crate::out::{self, out, outln};

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

async fn gather(only: &Option<PathBuf>) -> Result<Vec<(PathBuf, Status)>> {
    match only {
        Some(p) => Ok(vec![(
            p.clone(),
            control::request(p, &Request::Status).await?,
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
                let processes = all.into_iter().map(|(_, s)| s).collect();
                outln!(
                    "{}",
                    serde_json::to_string_pretty(&Processes { processes })?
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
                for (_, s) in &all {
                    out!("{}", render(s));
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

fn mb(bytes_per_s: f64) -> String {
    format!("{:.1} MB/s", bytes_per_s / 1e6)
}

fn ms(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1e3)
}

/// What `attach::knobs` says of a path nobody configured.
const DEFAULT_KNOBS: &str =
    "priority=0 weight=0 standby=no relative-throughput=1 repeat-count=0 queue-depth=0";

/// The topology as a tree, like `multipath -ll`.
pub fn render(s: &Status) -> String {
    let mut out = String::new();
    match s {
        Status::Attach { pid, volumes, .. } => {
            for vol in volumes {
                render_volume(&mut out, *pid, vol);
            }
        }
        Status::Serve {
            pid,
            portals,
            exports,
            connections,
            front_ends,
            ..
        } => {
            out.push_str(&format!("braid serve pid {pid}\n"));
            for p in portals {
                out.push_str(&format!("  portal {p}\n"));
            }
            for p in front_ends.iscsi.iter().flat_map(|i| &i.portals) {
                out.push_str(&format!(
                    "  iSCSI portal {} group {} {}\n",
                    p.portal, p.group, p.state
                ));
            }
            for e in exports {
                out.push_str(&format!(
                    "  export {} {} volume {}\n",
                    e.name,
                    format_size(e.size),
                    e.identity,
                ));
                render_peers(&mut out, e.peers.as_deref());
            }
            for (i, c) in connections.iter().enumerate() {
                let branch = if i + 1 == connections.len() {
                    "└─"
                } else {
                    "├─"
                };
                out.push_str(&format!(
                    "{branch} conn {} {} → {} export {}: read {} write {}, in flight {}, errors {}\n",
                    c.id,
                    c.peer,
                    c.portal,
                    c.export.as_deref().unwrap_or("(handshake)"),
                    mb(c.read_bytes_per_s),
                    mb(c.write_bytes_per_s),
                    c.inflight,
                    c.errors,
                ));
            }
        }
    }
    out
}

/// An export's other live gateways, as `braid status` shows them.
pub fn peers_of(e: &braid_store::Export) -> Option<Vec<PeerStatus>> {
    let figures = e.peers.as_ref()?.figures()?;
    Some(
        figures
            .peers
            .into_iter()
            .map(|p| PeerStatus {
                addr: p.addr,
                host: p.host,
                pid: p.pid,
                portals: p.portals,
            })
            .collect(),
    )
}

fn render_peers(out: &mut String, peers: Option<&[PeerStatus]>) {
    match peers {
        None => {}
        Some([]) => out.push_str("    no other live gateway\n"),
        Some(peers) => {
            for p in peers {
                out.push_str(&format!(
                    "    gateway {} (host {}, pid {}) portals {}\n",
                    p.addr,
                    p.host,
                    p.pid,
                    p.portals.join(", ")
                ));
            }
        }
    }
}

/// How a failed path's writes are fenced, as the second line says it.
fn fence_note(vol: &VolumeStatus) -> String {
    match vol.fence.as_str() {
        "held" => ", fence held (no fence known for this target: a failed path's writes wait, \
                   then fail with EIO at the no-path timeout; --persistent-reservations fences \
                   a target that has PREEMPT AND ABORT)"
            .into(),
        "none" | "" if !vol.fencing => ", no fencing".into(),
        "" => String::new(),
        f => format!(", fence {f}"),
    }
}

fn render_volume(out: &mut String, pid: u32, vol: &VolumeStatus) {
    out.push_str(&format!(
        "{} ({}) size {} policy {}\n  identity {}, socket {}, braid attach pid {pid}{}{}\n",
        vol.name,
        vol.uri,
        format_size(vol.size),
        vol.policy,
        vol.identity
            .as_deref()
            .unwrap_or("unknown (plain NBD server)"),
        vol.socket,
        fence_note(vol),
        if vol.replay {
            ""
        } else {
            ", no replay (the target does not say when it restarts: writes acknowledged \
             but never flushed can be lost with it)"
        },
    ));
    if let Some(l) = &vol.lost {
        out.push_str(&format!(
            "  LOST since {}: {}\n  every FLUSH and FUA write fails with EIO ({} so far) until \
             `braid clear-loss {}`\n",
            wall_time(l.since_unix),
            l.cause,
            vol.lost_flushes,
            vol.name
        ));
    } else if vol.replaying {
        out.push_str("  replaying to the restarted target: new requests wait\n");
    } else if vol.replay_overflowed {
        out.push_str(&format!(
            "  replay window full ({} of {}): a restart now would lose writes; FLUSH to \
             empty it\n",
            format_size(vol.replay_window_pinned),
            format_size(vol.replay_window_limit)
        ));
    }
    for (i, p) in vol.paths.iter().enumerate() {
        let last = i + 1 == vol.paths.len();
        let (branch, cont) = if last {
            ("└─", "  ")
        } else {
            ("├─", "│ ")
        };
        let route = if p.local == "*" {
            p.portal.clone()
        } else {
            format!("{} → {}", p.local, p.portal)
        };
        out.push_str(&format!(
            "{branch} path {} {route} {} ({} conn)\n",
            p.index, p.state, p.connections
        ));
        let depth = match p.queue_depth {
            0 => String::new(),
            d => format!(" (queue depth {d}, at most {} held)", p.max_inflight),
        };
        out.push_str(&format!(
            "{cont}   read {} {:.0} IOPS, write {} {:.0} IOPS, in flight {} / {}{depth}\n",
            mb(p.read_bytes_per_s),
            p.read_iops,
            mb(p.write_bytes_per_s),
            p.write_iops,
            p.inflight_requests,
            format_size(p.inflight_bytes),
        ));
        out.push_str(&format!(
            "{cont}   latency 10 s p50 {} p99 {}, 1 min p99 {}, errors {}, failovers {}, failbacks {}\n",
            ms(p.latency_p50_us),
            ms(p.latency_p99_us),
            ms(p.latency_1m_p99_us),
            p.errors,
            p.failures,
            p.restores,
        ));
        // Knobs only once someone set them: most volumes have none.
        if p.config != DEFAULT_KNOBS {
            out.push_str(&format!("{cont}   {}\n", p.config));
        }
    }
}

fn expect_ok(a: &Ack) -> Result<()> {
    if a.ok {
        Ok(())
    } else {
        bail!("{}", a.error.as_deref().unwrap_or("refused"))
    }
}

pub fn policy(args: PolicyArgs) -> Result<()> {
    runtime()?.block_on(async {
        let sock = match &args.control {
            Some(p) => p.clone(),
            None => control::find_volume(&args.volume).await?,
        };
        let req = Request::Policy {
            volume: args.volume.clone(),
            policy: args.policy.as_str().to_owned(),
        };
        let ack: Ack = control::request(&sock, &req).await?;
        expect_ok(&ack)?;
        outln!("{}: policy {}", args.volume, args.policy);
        Ok(())
    })
}

pub fn path(args: PathArgs) -> Result<()> {
    let first = args.action.first().map(String::as_str);
    let (enable, set, done) = match (first, args.action.len()) {
        (Some("enable"), 1) => (Some(true), None, "enabled"),
        (Some("disable"), 1) => (
            Some(false),
            None,
            "disabled (requests in flight finish there; new ones go elsewhere)",
        ),
        _ => {
            // Checked here too, so a typo is a usage error before anything
            // is asked of the volume.
            braid_initiator::PathAttrs::parse(args.action.iter().map(String::as_str))
                .map_err(|e| UsageError(format!("{e}; or give enable or disable")))?;
            (None, Some(args.action.clone()), "")
        }
    };
    let req = Request::Path {
        volume: args.volume.clone(),
        path: args.path,
        enable,
        set,
    };
    runtime()?.block_on(async {
        let sock = match &args.control {
            Some(p) => p.clone(),
            None => control::find_volume(&args.volume).await?,
        };
        let ack: Ack = control::request(&sock, &req).await?;
        expect_ok(&ack)?;
        match &ack.config {
            Some(c) => outln!("{}: path {} {c}", args.volume, args.path),
            None => outln!("{}: path {} {done}", args.volume, args.path),
        }
        Ok(())
    })
}

pub fn clear_loss(args: ClearLossArgs) -> Result<()> {
    let req = Request::ClearLoss {
        volume: args.volume.clone(),
    };
    runtime()?.block_on(async {
        let sock = match &args.control {
            Some(p) => p.clone(),
            None => control::find_volume(&args.volume).await?,
        };
        let ack: Ack = control::request(&sock, &req).await?;
        expect_ok(&ack)?;
        match &ack.cleared {
            Some(l) => outln!(
                "{}: cleared the loss found at {} ({}); FLUSH and FUA writes succeed again. \
                 Nothing lost was given back",
                args.volume,
                wall_time(l.since_unix),
                l.cause
            ),
            None => outln!("{}: no loss to clear", args.volume),
        }
        Ok(())
    })
}

/// Seconds since the Unix epoch as local-free UTC text.
fn wall_time(unix: f64) -> String {
    let secs = unix as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's days-to-civil algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

pub fn alua(args: AluaArgs) -> Result<()> {
    let req = Request::Alua {
        portal: args.portal.clone(),
        state: args.state.as_str().to_owned(),
    };
    runtime()?.block_on(async {
        let sock = match &args.control {
            Some(p) => p.clone(),
            None => control::find_iscsi_portal(&args.portal).await?,
        };
        let ack: Ack = control::request(&sock, &req).await?;
        expect_ok(&ack)?;
        outln!("iSCSI portal {}: {}", args.portal, args.state.as_str());
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wall_times_are_utc_dates() {
        assert_eq!(wall_time(0.0), "1970-01-01 00:00:00 UTC");
        assert_eq!(wall_time(951_782_400.0), "2000-02-29 00:00:00 UTC");
        assert_eq!(wall_time(1_795_803_133.0), "2026-11-27 18:12:13 UTC");
    }

    #[test]
    fn unconfigured_knobs_read_as_the_default() {
        let c = braid_initiator::engine::PathConfig::default();
        assert_eq!(crate::attach::knobs(&c), DEFAULT_KNOBS);
    }
}
