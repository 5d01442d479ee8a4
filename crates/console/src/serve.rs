//! The serve console: portals (NIC, ALUA state, their clients' rates),
//! exports (identity, backend, fences given, a Ceph gateway's peers),
//! every client connection with its figures, and the timeline.

use std::fmt::Write;

use crate::fmt::{esc, mbps, per_s, size};
use crate::model::{PortalView, ServeView};
use crate::page::{hold, timeline, Part};

const SHOWN: usize = 50;

pub fn layout(_: &ServeView) -> String {
    "serve".to_owned()
}

pub fn body(v: &ServeView, actions: bool) -> String {
    let part = |id: &str| {
        parts(v, actions)
            .into_iter()
            .find(|p| p.id == id)
            .map(|p| p.html)
            .unwrap_or_default()
    };
    let act = if actions { "<th>action</th>" } else { "" };
    let lease = v
        .gateway_lease_s
        .map(|s| format!("<p class=\"sub\">Ceph gateway: lease {s:.0} s on its record</p>"))
        .unwrap_or_default();
    format!(
        "<section class=\"serve\"><h2>Portals</h2>\
         <div class=\"tablewrap\"><table><thead><tr><th>portal</th><th>protocol</th><th>NIC</th>\
         <th class=\"n\">group</th><th>ALUA</th><th class=\"n\">clients</th>\
         <th class=\"n\">read MB/s</th><th class=\"n\">write MB/s</th>{act}</tr></thead>{portals}\
         </table></div>\
         <div class=\"charts\" data-serve=\"1\"><figure class=\"chart\" data-chart=\"portal-mbps\">\
         <figcaption>MB/s per portal (read + write)</figcaption><div class=\"plot\"></div></figure>\
         <figure class=\"chart\" data-chart=\"portal-clients\"><figcaption>clients per portal</figcaption>\
         <div class=\"plot\"></div></figure></div>\
         <h2>Exports</h2>{lease}<div class=\"tablewrap\"><table><thead><tr><th>export</th>\
         <th>identity</th><th>backend</th><th class=\"n\">size</th><th>access</th>\
         <th class=\"n\">fences given</th><th>gateway peers</th></tr></thead>{exports}</table></div>\
         <h2>Clients</h2><div class=\"tablewrap\"><table><thead><tr><th>connection</th><th>peer</th>\
         <th>portal</th><th>export</th><th class=\"n\">read MB/s</th><th class=\"n\">write MB/s</th>\
         <th class=\"n\">IOPS</th><th class=\"n\">in flight</th><th class=\"n\">errors</th></tr></thead>\
         {conns}</table></div>\
         <h3>Timeline</h3>{events}</section>",
        portals = hold("tbody", "portals", "", &part("portals")),
        exports = hold("tbody", "exports", "", &part("exports")),
        conns = hold("tbody", "conns", "", &part("conns")),
        events = hold("ol", "events", "timeline", &part("events")),
    )
}

pub fn parts(v: &ServeView, actions: bool) -> Vec<Part> {
    let portals = v
        .portals
        .iter()
        .map(|p| portal(p, &v.alua_states, actions))
        .collect();
    let exports = v
        .exports
        .iter()
        .map(|e| {
            let peers = match &e.peers {
                None => "–".to_owned(),
                Some(p) if p.is_empty() => "none live".to_owned(),
                Some(p) => p.join(", "),
            };
            format!(
                "<tr><td>{}</td><td class=\"id\">{}</td><td>{}</td><td class=\"n\">{}</td>\
                 <td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                esc(&e.name),
                esc(&e.identity),
                esc(&e.backend),
                size(e.size),
                if e.read_only {
                    "read-only"
                } else {
                    "read-write"
                },
                e.fences,
                esc(&peers),
            )
        })
        .collect();
    let mut conns = String::new();
    if v.connections.is_empty() {
        conns.push_str("<tr><td colspan=\"9\" class=\"empty\">no client is connected</td></tr>");
    }
    for c in &v.connections {
        let _ = write!(
            conns,
            "<tr><td class=\"id\" title=\"{id}\">{short}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(&c.peer),
            esc(&c.portal),
            esc(c.export.as_deref().unwrap_or("(handshake)")),
            mbps(c.read_bytes_per_s),
            mbps(c.write_bytes_per_s),
            per_s(c.read_iops + c.write_iops),
            c.inflight,
            c.errors,
            id = esc(&c.id),
            // The id's tail: its head is the server's, the same for all.
            short = esc(c.id.get(c.id.len().saturating_sub(12)..).unwrap_or(&c.id)),
        );
    }
    vec![
        Part {
            id: "portals".into(),
            html: portals,
        },
        Part {
            id: "exports".into(),
            html: exports,
        },
        Part {
            id: "conns".into(),
            html: conns,
        },
        Part {
            id: "events".into(),
            html: timeline(&v.events, SHOWN),
        },
    ]
}

fn portal(p: &PortalView, states: &[String], actions: bool) -> String {
    let tone = match p.alua.as_deref() {
        None | Some("active-optimized") => "up",
        Some("active-non-optimized" | "transitioning") => "wait",
        Some(_) => "off",
    };
    let action = match (&p.alua, actions) {
        (_, false) => String::new(),
        (None, true) => "<td></td>".to_owned(),
        (Some(now), true) => {
            let options: String = states
                .iter()
                .map(|s| {
                    let sel = if s == now { " selected" } else { "" };
                    format!("<option{sel}>{}</option>", esc(s))
                })
                .collect();
            format!(
                "<td><form class=\"act\" data-op=\"alua\" data-portal=\"{}\"><select name=\"state\">\
                 {options}</select><button>set</button></form></td>",
                esc(&p.address)
            )
        }
    };
    format!(
        "<tr class=\"st-{tone}\"><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td>\
         <td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>{action}</tr>",
        esc(&p.address),
        esc(&p.protocol),
        esc(p.nic.as_deref().unwrap_or("–")),
        p.group.map(|g| g.to_string()).unwrap_or_else(|| "–".into()),
        match &p.alua {
            Some(a) => format!("<span class=\"badge {tone}\">{}</span>", esc(a)),
            None => "–".into(),
        },
        p.connections,
        mbps(p.read_bytes_per_s),
        mbps(p.write_bytes_per_s),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ConnView, ExportView};

    #[test]
    fn portals_exports_and_clients_are_in_the_first_paint() {
        let v = ServeView {
            pid: 1,
            portals: vec![PortalView {
                address: "10.77.1.1:3260".into(),
                protocol: "iscsi".into(),
                nic: Some("brs1".into()),
                group: Some(1),
                alua: Some("standby".into()),
                ..PortalView::default()
            }],
            exports: vec![ExportView {
                name: "vol".into(),
                identity: "ba31".into(),
                backend: "/srv/vol.img".into(),
                fences: 3,
                peers: Some(vec!["10.0.0.9:10809".into()]),
                ..ExportView::default()
            }],
            connections: vec![ConnView {
                id: "0466831ca8fb4e76bc545153aa3f7852".into(),
                peer: "10.77.1.2:40689".into(),
                export: Some("vol".into()),
                ..ConnView::default()
            }],
            alua_states: vec!["active-optimized".into(), "standby".into()],
            ..ServeView::default()
        };
        let html = body(&v, true);
        assert!(
            html.contains("<span class=\"badge off\">standby</span>"),
            "{html}"
        );
        assert!(html.contains("<option selected>standby</option>"), "{html}");
        assert!(html.contains("10.0.0.9:10809"), "{html}");
        assert!(html.contains(">5153aa3f7852<"), "{html}");
        assert!(html.contains("<td class=\"n\">3</td>"), "{html}");
        assert!(
            !body(&v, false).contains("<form"),
            "no actions without a token"
        );
    }
}
