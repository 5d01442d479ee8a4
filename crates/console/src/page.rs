//! The page: its shell (head, header, footer), the timeline shared by both
//! consoles, and the parts the push stream replaces. The server renders
//! every part, for the first paint and for each update alike, so the page
//! reads the same with or without its script, and the script stays small:
//! it swaps parts and feeds the charts.

use std::fmt::Write;

use serde::Serialize;

use crate::fmt::{clock, esc, took};
use crate::model::{EventView, Snapshot};

/// One replaceable part of the page: the element with `id` gets `html`.
#[derive(Clone, Debug, Serialize)]
pub struct Part {
    pub id: String,
    pub html: String,
}

/// What the push stream sends each time: the figures for the charts and
/// the parts to swap. `layout` changes when sections come or go (a
/// volume attached or detached), and the page then loads itself again.
#[derive(Serialize)]
pub struct Update<'a> {
    pub layout: String,
    pub snapshot: &'a Snapshot,
    pub parts: Vec<Part>,
}

/// How an event kind looks on the timeline: one entry per kind. A kind
/// missing here is shown plainly, under its own name.
pub struct Kind {
    pub name: &'static str,
    pub label: &'static str,
    /// `bad`, `warn`, `good` or `info`: its colour.
    pub tone: &'static str,
    /// What `took_ms` measures for this kind.
    pub took: &'static str,
}

pub const KINDS: &[Kind] = &[
    Kind {
        name: "path-failed",
        label: "path failed",
        tone: "bad",
        took: "failover",
    },
    Kind {
        name: "fenced",
        label: "fence confirmed",
        tone: "warn",
        took: "failover",
    },
    Kind {
        name: "path-restored",
        label: "failback",
        tone: "good",
        took: "was down",
    },
    Kind {
        name: "no-path-timeout",
        label: "no path",
        tone: "bad",
        took: "",
    },
    Kind {
        name: "policy",
        label: "policy",
        tone: "info",
        took: "",
    },
    Kind {
        name: "path-disabled",
        label: "drained",
        tone: "warn",
        took: "",
    },
    Kind {
        name: "path-enabled",
        label: "enabled",
        tone: "good",
        took: "",
    },
    Kind {
        name: "alua",
        label: "ALUA",
        tone: "info",
        took: "",
    },
    Kind {
        name: "restart",
        label: "target restarted",
        tone: "bad",
        took: "",
    },
    Kind {
        name: "replayed",
        label: "replay done",
        tone: "good",
        took: "replay",
    },
    Kind {
        name: "restart-known",
        label: "restart already handled",
        tone: "info",
        took: "",
    },
    Kind {
        name: "lost",
        label: "writes may be lost",
        tone: "bad",
        took: "",
    },
    Kind {
        name: "loss-cleared",
        label: "loss cleared",
        tone: "warn",
        took: "",
    },
    Kind {
        name: "writeback-failed",
        label: "braid's FLUSH failed",
        tone: "warn",
        took: "",
    },
    Kind {
        name: "conn-open",
        label: "client connected",
        tone: "info",
        took: "",
    },
    Kind {
        name: "conn-closed",
        label: "client left",
        tone: "info",
        took: "",
    },
    Kind {
        name: "fence-given",
        label: "fence given",
        tone: "warn",
        took: "",
    },
];

fn kind(name: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.name == name)
}

/// A timeline, newest first, at most `max` events.
pub fn timeline(events: &[EventView], max: usize) -> String {
    let mut out = String::new();
    if events.is_empty() {
        out.push_str("<li class=\"ev none\">nothing has happened yet</li>");
    }
    for e in events.iter().rev().take(max) {
        let (label, tone, what) = match kind(&e.kind) {
            Some(k) => (k.label, k.tone, k.took),
            None => (e.kind.as_str(), "info", ""),
        };
        let _ = write!(
            out,
            "<li class=\"ev tone-{tone}\" data-kind=\"{}\"><time data-ms=\"{}\">{}</time>\
             <span class=\"kind\">{}</span><span class=\"where\">{}</span>\
             <span class=\"text\">{}</span><span class=\"took\">{}</span></li>",
            esc(&e.kind),
            e.at_ms,
            clock(e.at_ms),
            esc(label),
            esc(&place(e)),
            esc(&e.text),
            match e.took_ms {
                Some(ms) if !what.is_empty() => format!("{what} {}", took(ms)),
                Some(ms) => took(ms),
                None => String::new(),
            },
        );
    }
    out
}

fn place(e: &EventView) -> String {
    match (e.scope.is_empty(), e.path) {
        (true, Some(p)) => format!("path {p}"),
        (false, Some(p)) => format!("{} path {p}", e.scope),
        (_, None) => e.scope.clone(),
    }
}

/// The whole page: `title`, then `body` (sections holding the parts).
pub fn shell(
    title: &str,
    role: &str,
    pid: Option<u32>,
    actions: bool,
    layout: &str,
    body: &str,
) -> String {
    let mut out = String::with_capacity(body.len() + 2048);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title}</title>\
         <link rel=\"stylesheet\" href=\"/assets/uPlot.min.css\">\
         <link rel=\"stylesheet\" href=\"/assets/console.css\">\
         <script src=\"/assets/uPlot.iife.min.js\" defer></script>\
         <script src=\"/assets/console.js\" defer></script></head>\
         <body data-role=\"{role}\" data-actions=\"{}\" data-layout=\"{layout}\">\
         <header class=\"top\"><h1>braid <span>{role}</span></h1>\
         <span class=\"meta\">{}</span>\
         <span class=\"live\" id=\"live\" title=\"the push stream\">static</span>\
         <form id=\"token\" class=\"token\" hidden><input type=\"password\" name=\"token\" \
         placeholder=\"token for actions\" autocomplete=\"off\"><button>use</button></form>\
         <button id=\"theme\" type=\"button\" title=\"dark or light\">theme</button></header>\
         <main>{body}</main>\
         <footer>charts by uPlot {UPLOT_VERSION} (<a href=\"/assets/uPlot.LICENSE\">MIT licence</a>)\
         · <a href=\"/metrics\">metrics</a> · <a href=\"/api/snapshot\">JSON</a></footer>\
         <p id=\"notice\" class=\"notice\" role=\"status\"></p></body></html>\n",
        if actions { "on" } else { "off" },
        pid.map(|p| format!("pid {p}")).unwrap_or_default(),
        title = esc(title),
        layout = esc(layout),
    );
    out
}

/// The version of the vendored uPlot (assets/uPlot.iife.min.js).
pub const UPLOT_VERSION: &str = "1.6.32";

/// A part's element: `tag` with `id`, holding `html`.
pub fn hold(tag: &str, id: &str, class: &str, html: &str) -> String {
    format!("<{tag} id=\"{id}\" class=\"{class}\">{html}</{tag}>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_kind_takes_its_look_and_an_unknown_one_shows_plainly() {
        let ev = |kind: &str, took_ms| EventView {
            scope: "vol".into(),
            seq: 1,
            at_ms: 1_000,
            kind: kind.into(),
            path: Some(2),
            text: "failed: <no reply>".into(),
            took_ms,
        };
        let html = timeline(&[ev("path-failed", Some(528)), ev("brand-new", None)], 10);
        // Newest first.
        let new = html.find("brand-new").unwrap();
        let failed = html.find("path failed").unwrap();
        assert!(new < failed, "{html}");
        assert!(html.contains("tone-bad"), "{html}");
        assert!(html.contains("failover 528 ms"), "{html}");
        assert!(html.contains("vol path 2"), "{html}");
        assert!(html.contains("&lt;no reply&gt;"), "text is escaped: {html}");
        assert!(
            html.contains("<span class=\"kind\">brand-new</span>"),
            "{html}"
        );
    }
}
