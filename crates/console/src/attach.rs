//! The attach console: per volume, its identity, a drawing of its paths
//! (local NIC, link, portal, target) in their states, the per-path table,
//! the charts' frames and the timeline.

use std::fmt::Write;

use crate::fmt::{esc, mbps, ms, per_s, size};
use crate::model::{AttachView, PathView, VolumeView};
use crate::page::{hold, timeline, Part};

/// Events shown per volume.
const SHOWN: usize = 50;

/// The charts of each volume: element name, caption.
pub const CHARTS: &[(&str, &str)] = &[
    ("mbps", "MB/s (read + write)"),
    ("iops", "IOPS"),
    ("lat", "latency p50 / p99, ms"),
    ("inflight", "in flight, requests"),
    ("inbytes", "in flight, MiB"),
    ("share", "policy share, %"),
];

/// What changes the page's sections: the volumes, in order.
pub fn layout(v: &AttachView) -> String {
    let names: Vec<&str> = v.volumes.iter().map(|v| v.name.as_str()).collect();
    format!("attach:{}", names.join("/"))
}

/// The page's body, parts included.
pub fn body(v: &AttachView, actions: bool) -> String {
    let mut out = String::new();
    if v.volumes.is_empty() {
        out.push_str("<p class=\"empty\">no volume is attached</p>");
    }
    let parts = parts(v, actions);
    for (i, vol) in v.volumes.iter().enumerate() {
        let part = |suffix: &str| {
            let id = format!("v{i}-{suffix}");
            parts
                .iter()
                .find(|p| p.id == id)
                .map(|p| p.html.clone())
                .unwrap_or_default()
        };
        let _ = write!(
            out,
            "<section class=\"volume\" id=\"v{i}\" data-volume=\"{name}\">\
             <div class=\"vhead\"><h2>{name}</h2>{policy}</div>\
             {ident}{topo}\
             <div class=\"tablewrap\"><table class=\"paths\"><thead><tr>\
             <th>path</th><th>local</th><th>portal</th><th>state</th><th>ALUA</th>\
             <th class=\"n\">conns</th><th class=\"n\">read MB/s</th><th class=\"n\">write MB/s</th>\
             <th class=\"n\">IOPS</th><th class=\"n\">p50 ms</th><th class=\"n\">p99 ms</th>\
             <th class=\"n infl\">in flight</th><th class=\"share\">share</th><th class=\"n\">depth limit</th>\
             <th class=\"n\">errors</th><th class=\"n\">failovers</th><th class=\"n\">failbacks</th>\
             {act}</tr></thead>{rows}</table></div>\
             <div class=\"charts\" data-volume=\"{name}\">{charts}</div>\
             <h3>Timeline</h3>{events}</section>",
            name = esc(&vol.name),
            policy = policy_form(vol, &v.policies, actions),
            ident = hold("dl", &format!("v{i}-ident"), "ident", &part("ident")),
            topo = hold("div", &format!("v{i}-topo"), "topo", &part("topo")),
            act = if actions { "<th>action</th>" } else { "" },
            rows = hold("tbody", &format!("v{i}-paths"), "", &part("paths")),
            charts = chart_frames(),
            events = hold("ol", &format!("v{i}-events"), "timeline", &part("events")),
        );
    }
    out
}

/// Every part of every volume.
pub fn parts(v: &AttachView, actions: bool) -> Vec<Part> {
    let mut out = Vec::new();
    for (i, vol) in v.volumes.iter().enumerate() {
        let id = |s: &str| format!("v{i}-{s}");
        out.push(Part {
            id: id("ident"),
            html: ident(vol),
        });
        out.push(Part {
            id: id("topo"),
            html: topology(vol),
        });
        out.push(Part {
            id: id("paths"),
            html: vol.paths.iter().map(|p| row(p, actions)).collect(),
        });
        out.push(Part {
            id: id("events"),
            html: timeline(&vol.events, SHOWN),
        });
    }
    out
}

fn chart_frames() -> String {
    CHARTS
        .iter()
        .map(|(name, caption)| {
            format!(
                "<figure class=\"chart\" data-chart=\"{name}\"><figcaption>{caption}</figcaption>\
                 <div class=\"plot\"></div></figure>"
            )
        })
        .collect()
}

fn policy_form(vol: &VolumeView, policies: &[String], actions: bool) -> String {
    if !actions {
        return format!("<span class=\"policy\">policy {}</span>", esc(&vol.policy));
    }
    let options: String = policies
        .iter()
        .map(|p| {
            let sel = if *p == vol.policy { " selected" } else { "" };
            format!("<option{sel}>{}</option>", esc(p))
        })
        .collect();
    format!(
        "<form class=\"act policy\" data-op=\"policy\" data-volume=\"{}\">\
         <label>policy <select name=\"policy\">{options}</select></label>\
         <button>switch</button></form>",
        esc(&vol.name)
    )
}

fn ident(v: &VolumeView) -> String {
    let r = &v.replay;
    let replay = if let Some(lost) = &r.lost {
        format!(
            "LOST: {lost}; {} FLUSH/FUA failed until braid clear-loss",
            r.lost_flushes
        )
    } else if !r.available {
        "unavailable: the target does not say when it restarts".to_owned()
    } else if r.replaying {
        "replaying to the restarted target".to_owned()
    } else {
        format!(
            "{} held{}, {} replays",
            size(r.window_bytes),
            if r.overflowed { " (window full)" } else { "" },
            r.replays
        )
    };
    let rows = [
        ("URI", v.uri.clone()),
        (
            "identity",
            v.identity
                .clone()
                .unwrap_or_else(|| "unknown (plain NBD server)".into()),
        ),
        ("size", size(v.size)),
        ("transport", v.transport.clone()),
        ("policy", v.policy.clone()),
        (
            "fencing",
            if v.fencing { "by the target" } else { "none" }.into(),
        ),
        ("replay", replay),
    ];
    // One line each, whatever the figures: a value that wrapped onto a
    // second line as it grew would move everything under it.
    rows.iter()
        .map(|(k, val)| {
            format!(
                "<div><dt>{k}</dt><dd title=\"{t}\">{t}</dd></div>",
                t = esc(val)
            )
        })
        .collect()
}

/// The state's class: up, down, off (drained or standby), or wait.
fn tone(state: &str) -> &'static str {
    match state {
        "active" => "up",
        "failed" | "dead" => "down",
        "disabled" | "standby" => "off",
        _ => "wait",
    }
}

fn row(p: &PathView, actions: bool) -> String {
    let local = match &p.nic {
        Some(nic) if !p.local.contains(nic.as_str()) => format!("{} ({nic})", p.local),
        _ => p.local.clone(),
    };
    let button = if !actions {
        String::new()
    } else {
        let (enable, label) = if p.state == "disabled" {
            ("true", "enable")
        } else {
            ("false", "drain")
        };
        format!(
            "<td><button class=\"act\" data-op=\"path\" data-path=\"{}\" data-enable=\"{enable}\">\
             {label}</button></td>",
            p.index
        )
    };
    format!(
        "<tr class=\"st-{tone}\" data-path=\"{idx}\"><td>{idx}</td><td>{local}</td><td>{portal}</td>\
         <td><span class=\"badge {tone}\">{state}</span></td><td>{access}</td>\
         <td class=\"n\">{conns}</td><td class=\"n\">{read}</td><td class=\"n\">{write}</td>\
         <td class=\"n\">{iops}</td><td class=\"n\">{p50}</td><td class=\"n\">{p99}</td>\
         <td class=\"n\">{inflight} / {inbytes}</td>\
         <td><meter min=\"0\" max=\"1\" value=\"{share:.3}\"></meter> {pct:.0}%</td>\
         <td class=\"n\">{depth}</td><td class=\"n\">{errors}</td><td class=\"n\">{failures}</td>\
         <td class=\"n\">{restores}</td>{button}</tr>",
        tone = tone(&p.state),
        idx = p.index,
        local = esc(&local),
        portal = esc(&p.portal),
        state = esc(&p.state),
        access = esc(p.access.as_deref().unwrap_or("–")),
        conns = p.connections,
        read = mbps(p.read_bytes_per_s),
        write = mbps(p.write_bytes_per_s),
        iops = per_s(p.read_iops + p.write_iops),
        p50 = ms(p.latency_p50_us),
        p99 = ms(p.latency_p99_us),
        inflight = p.inflight_requests,
        inbytes = size(p.inflight_bytes),
        share = p.share,
        pct = p.share * 100.0,
        depth = p.depth_limit.map(|d| d.to_string()).unwrap_or_default(),
        errors = p.errors,
        failures = p.failures,
        restores = p.restores,
    )
}

/// The volume's paths drawn: each local side, its link (in the path's
/// state, with its rate), its portal, and the target they all lead to.
fn topology(v: &VolumeView) -> String {
    let n = v.paths.len().max(1);
    let row_h = 44;
    let h = n * row_h + 12;
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg viewBox=\"0 0 760 {h}\" role=\"img\" aria-label=\"paths of {}\">",
        esc(&v.name)
    );
    let target_y = 6;
    let target_h = h - 12;
    for (i, p) in v.paths.iter().enumerate() {
        let y = 6 + i * row_h;
        let mid = y + row_h / 2 - 2;
        let t = tone(&p.state);
        let local = match (&p.nic, p.local.split_once('%')) {
            (Some(nic), Some((addr, _))) => format!("{nic} {addr}"),
            (Some(nic), None) => nic.clone(),
            (None, _) => p.local.clone(),
        };
        let rate = mbps(p.read_bytes_per_s + p.write_bytes_per_s);
        let _ = write!(
            out,
            "<g class=\"link {t}\"><rect class=\"box\" x=\"4\" y=\"{y}\" width=\"200\" height=\"{bh}\" rx=\"5\"/>\
             <text x=\"14\" y=\"{ty}\">{local}</text>\
             <line x1=\"204\" y1=\"{mid}\" x2=\"420\" y2=\"{mid}\"/>\
             <text class=\"rate\" x=\"312\" y=\"{ly}\">path {idx} · {state} · {rate} MB/s</text>\
             <rect class=\"box\" x=\"420\" y=\"{y}\" width=\"190\" height=\"{bh}\" rx=\"5\"/>\
             <text x=\"430\" y=\"{ty}\">{portal}</text>\
             <line x1=\"610\" y1=\"{mid}\" x2=\"650\" y2=\"{mid}\"/></g>",
            bh = row_h - 8,
            ty = mid + 5,
            ly = mid - 6,
            idx = p.index,
            state = esc(&p.state),
            local = esc(&clip(&local, 26)),
            portal = esc(&clip(&p.portal, 24)),
        );
    }
    let _ = write!(
        out,
        "<g class=\"target\"><rect class=\"box\" x=\"650\" y=\"{target_y}\" width=\"106\" \
         height=\"{target_h}\" rx=\"5\"/><text x=\"660\" y=\"{}\">target</text>\
         <text class=\"sub\" x=\"660\" y=\"{}\">{}</text></g></svg>",
        target_y + target_h / 2 - 2,
        target_y + target_h / 2 + 14,
        esc(&clip(&v.name, 12)),
    );
    out
}

fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(max - 1).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume() -> AttachView {
        let path = |index, state: &str| PathView {
            index,
            local: format!("10.77.{index}.2%brc{index}"),
            nic: Some(format!("brc{index}")),
            portal: format!("10.77.{index}.1:10809"),
            state: state.into(),
            read_bytes_per_s: 117e6,
            share: 0.5,
            ..PathView::default()
        };
        AttachView {
            pid: 7,
            volumes: vec![VolumeView {
                name: "vol".into(),
                uri: "nbd://10.77.1.1/vol".into(),
                policy: "adaptive".into(),
                paths: vec![path(1, "active"), path(2, "failed")],
                ..VolumeView::default()
            }],
            policies: vec!["adaptive".into(), "round-robin".into()],
        }
    }

    #[test]
    fn the_first_paint_holds_every_part_and_each_path_in_its_state() {
        let v = volume();
        let html = body(&v, false);
        for p in parts(&v, false) {
            assert!(html.contains(&format!("id=\"{}\"", p.id)), "{}", p.id);
            assert!(html.contains(&p.html), "{}", p.id);
        }
        assert!(
            html.contains("<tr class=\"st-down\" data-path=\"2\">"),
            "{html}"
        );
        assert!(html.contains("<g class=\"link down\">"), "{html}");
        assert!(html.contains("117.0"), "{html}");
        // No actions without a token: no forms, no buttons.
        assert!(!html.contains("<button"), "{html}");
        let acting = body(&v, true);
        assert!(
            acting.contains("data-op=\"path\" data-path=\"2\""),
            "{acting}"
        );
        assert!(
            acting.contains("<option selected>adaptive</option>"),
            "{acting}"
        );
    }
}
