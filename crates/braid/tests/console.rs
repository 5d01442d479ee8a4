//! The console in a real browser (headless Chromium driven through
//! WebDriver), on loopback: an action works with the token and is refused
//! without it and from another site, each try logged with the peer's
//! address; the serve console shows its portals, exports and clients and
//! sets a portal's ALUA state; the page neither shifts as its figures
//! change nor overflows a phone's width.

mod browserkit;
mod common;
mod labkit;

use braid_test_needs::needs;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use browserkit::{raw, screenshot_dir, Browser, StopOnDrop};
use common::{cmd, free_port, random_file, wait_until, Serve};
use labkit::Attach;

const TOKEN: &str = "c0ns0le-t0ken-0123456789";

/// Waits (bounded) until the listener on `port` answers.
fn wait_http(port: u16) {
    assert!(
        wait_until(Duration::from_secs(10), || raw(
            port,
            "GET",
            "/api/snapshot",
            &[],
            None
        )
        .is_ok_and(|(s, _)| s == 200)),
        "no console on port {port}"
    );
}

fn path_state(attach: &Attach, n: usize) -> String {
    attach.status()["paths"][n - 1]["state"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The page's notice once it says something.
fn notice(b: &Browser) -> String {
    let v = b.wait_for(
        Duration::from_secs(5),
        "const n = document.getElementById('notice'); \
         return n.classList.contains('shown') ? n.textContent : '';",
    );
    let text = v.unwrap_or_else(|v| panic!("no notice: {v}"));
    // Hidden again, so the next action's notice is its own.
    b.eval("document.getElementById('notice').className = 'notice'; return true;");
    text.as_str().unwrap_or_default().to_owned()
}

const LIVE: &str = "return document.getElementById('live').textContent === 'live';";

#[needs("chromium", "chromedriver", "nbdcopy")]
fn actions_need_the_token_in_a_header_from_the_same_origin() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let token_arg = token_file.display().to_string();
    let (serve_http, attach_http) = (free_port(), free_port());
    let iscsi = free_port().to_string();
    let serve = Serve::start(&[
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.2:0",
        "--iscsi",
        &iscsi,
        "--http",
        &format!("127.0.0.1:{serve_http}"),
        "--http-token",
        &token_arg,
    ]);
    let mut attach = Attach::start(
        None,
        &serve.uri("vol"),
        "vol",
        &[
            "--http",
            &format!("127.0.0.1:{attach_http}"),
            "--http-token",
            &token_arg,
        ],
    );
    wait_http(serve_http);
    wait_http(attach_http);
    let console = format!("http://127.0.0.1:{attach_http}/");
    let b = Browser::start(None, 1280, 720);

    // Loopback: the page opens without the token, shows the actions (the
    // daemon has a token) and asks for it; a drain without it is refused.
    b.open(&console);
    b.wait_for(Duration::from_secs(5), LIVE)
        .expect("the push stream");
    let form_shown = b.eval("return !document.getElementById('token').hidden;");
    assert_eq!(form_shown, true, "the page asks for the token");
    b.eval("document.querySelector('button.act[data-path=\"2\"]').click(); return true;");
    let said = notice(&b);
    assert!(
        said.contains("refused") && said.contains("X-Braid-Token"),
        "{said}"
    );
    assert_eq!(path_state(&attach, 2), "active");

    // With the token (given once in the address): drained, and the
    // timeline says so.
    b.open(&format!("{console}?token={TOKEN}"));
    b.wait_for(Duration::from_secs(5), LIVE)
        .expect("the push stream");
    let url = b.eval("return location.href;");
    assert_eq!(
        url,
        console.as_str(),
        "the token is dropped from the address"
    );
    b.eval("document.querySelector('button.act[data-path=\"2\"]').click(); return true;");
    let said = notice(&b);
    assert!(said.contains("path 2 drained"), "{said}");
    assert_eq!(path_state(&attach, 2), "disabled");
    b.wait_for(
        Duration::from_secs(3),
        "return document.querySelector('#v0-events li[data-kind=\"path-disabled\"]') !== null \
         && document.querySelector('#v0-paths tr[data-path=\"2\"] button').textContent.trim() === 'enable';",
    )
    .expect("the drain on the timeline and the button turned to enable");
    b.eval("document.querySelector('button.act[data-path=\"2\"]').click(); return true;");
    assert!(notice(&b).contains("path 2 enabled"));
    assert_eq!(path_state(&attach, 2), "active");

    // From another origin: the browser will not send the token's header
    // there without the console's leave (a preflight it never gets), and
    // what it does send has no token and says where it came from. The
    // right token from a foreign origin is refused too.
    // Another origin (the serve console's port), on a document of it
    // that the console's own content policy does not hold back.
    b.open(&format!(
        "http://127.0.0.1:{serve_http}/assets/uPlot.LICENSE"
    ));
    let tried = b.eval_async(&format!(
        "const done = arguments[arguments.length - 1];
         const body = JSON.stringify({{op: 'path', volume: 'vol', path: 2, enable: false}});
         const out = [];
         fetch('{console}api/action', {{method: 'POST', body,
             headers: {{'Content-Type': 'application/json', 'X-Braid-Token': '{TOKEN}'}}}})
           .then(r => out.push('answered ' + r.status), e => out.push('blocked'))
           .then(() => fetch('{console}api/action', {{method: 'POST', mode: 'no-cors', body,
             headers: {{'Content-Type': 'text/plain'}}}}))
           .then(() => out.push('sent'), e => out.push('failed ' + e))
           .then(() => done(out));"
    ));
    assert_eq!(tried, serde_json::json!(["blocked", "sent"]), "{tried}");
    let body = r#"{"op":"path","volume":"vol","path":2,"enable":false}"#.to_owned();
    let (status, answer) = raw(
        attach_http,
        "POST",
        "/api/action",
        &[
            ("Origin", "http://elsewhere.example"),
            ("X-Braid-Token", TOKEN),
        ],
        Some(body),
    )
    .unwrap();
    assert_eq!(status, 403, "{answer}");
    assert_eq!(
        path_state(&attach, 2),
        "active",
        "no cross-site action landed"
    );
    let log = attach.log();
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("console action refused"))
        .collect();
    assert!(
        refused
            .iter()
            .any(|l| l.contains("Sec-Fetch-Site: same-site")),
        "{log}"
    );
    assert!(
        refused
            .iter()
            .any(|l| l.contains("Origin: http://elsewhere.example")),
        "{log}"
    );
    assert!(
        refused.iter().all(|l| l.contains("peer=127.0.0.1:")),
        "every refusal names the peer: {refused:#?}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("console action:") && l.contains("peer=127.0.0.1:")),
        "{log}"
    );

    // Figures move as a page stays open: no layout shift, and at a phone's
    // width nothing wider than the screen (wide tables scroll inside).
    b.open(&console);
    b.wait_for(Duration::from_secs(5), LIVE)
        .expect("the push stream");
    b.eval(
        "window.__shift = 0; window.__moved = []; \
         new PerformanceObserver(l => l.getEntries().forEach(e => { \
         if (e.hadRecentInput) return; window.__shift += e.value; \
         (e.sources || []).forEach(s => window.__moved.push( \
         (s.node ? (s.node.id || s.node.className || s.node.nodeName) : '?') + ' ' + \
         JSON.stringify([s.previousRect.y, s.previousRect.height]) + ' -> ' + \
         JSON.stringify([s.currentRect.y, s.currentRect.height]))); })) \
         .observe({type: 'layout-shift', buffered: false}); return true;",
    );
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| load(&attach, &stop));
        // Three updates with figures changing under the load.
        let seen = b.eval_async(
            "const done = arguments[arguments.length - 1]; let n = 0; \
             const es = new EventSource('/events'); \
             es.addEventListener('update', () => { if (++n === 3) { es.close(); done(n); } });",
        );
        assert_eq!(seen, 3);
        let shift = b.eval("return window.__shift;").as_f64().unwrap_or(1.0);
        assert!(
            shift < 0.001,
            "the layout shifted by {shift} as figures changed: {}",
            b.eval("return window.__moved;")
        );
        b.resize(390, 844);
        let wide = b.eval("return document.documentElement.scrollWidth - window.innerWidth;");
        assert!(
            wide.as_i64().unwrap_or(1) <= 0,
            "{wide} px wider than a phone"
        );
        b.resize(1280, 720);

        // The serve console: ALUA of the second iSCSI portal set to
        // standby from the page, as braid alua would.
        b.open(&format!("http://127.0.0.1:{serve_http}/?token={TOKEN}"));
        b.wait_for(Duration::from_secs(5), LIVE)
            .expect("the push stream");
        let portal = format!("127.0.0.2:{iscsi}");
        b.eval(&format!(
            "const f = document.querySelector('form.act[data-portal=\"{portal}\"]'); \
             f.state.value = 'standby'; f.requestSubmit(); return true;"
        ));
        let said = notice(&b);
        assert!(said.contains("standby"), "{said}");
        b.wait_for(
            Duration::from_secs(3),
            "return document.querySelector('#portals .badge.off') !== null \
             && document.querySelector('#events li[data-kind=\"alua\"]') !== null;",
        )
        .expect("the portal in standby, and the change on the timeline");
        let clients = b.eval("return document.querySelectorAll('#conns tr').length;");
        assert!(clients.as_u64().unwrap_or(0) >= 2, "{clients}");
        b.resize(1280, 1000);
        // A few seconds of figures on the charts.
        std::thread::sleep(Duration::from_secs(4));
        b.screenshot(&screenshot_dir().join("console-serve.png"));
        stop.store(true, Ordering::Relaxed);
    });
    assert!(attach.stop());
}

/// Writes and reads the volume through braid attach until `stop`.
fn load(attach: &Attach, stop: &AtomicBool) {
    let dir = tempfile::tempdir().unwrap();
    let src = random_file(dir.path(), 16 << 20, 3);
    while !stop.load(Ordering::Relaxed) {
        common::run(cmd("nbdcopy").arg(&src).arg(attach.uri()));
        common::run(cmd("nbdcopy").arg(attach.uri()).arg("null:"));
    }
}

#[needs("python3")]
fn the_console_is_https_when_serve_has_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    common::run(
        cmd(env!("CARGO_BIN_EXE_braid"))
            .args(["tls", "init"])
            .arg(dir.path())
            .args(["--name", "127.0.0.1"]),
    );
    let f = |name: &str| dir.path().join(name).display().to_string();
    let http = free_port();
    // NBD clients must show certificates; a browser brings none, and the
    // console does not ask for one.
    let _serve = Serve::start(&[
        "--tls-cert",
        &f("server-cert.pem"),
        "--tls-key",
        &f("server-key.pem"),
        "--tls-client-ca",
        &f("ca-cert.pem"),
        "--http",
        &format!("127.0.0.1:{http}"),
    ]);
    let fetch = |url: &str| {
        let script = "import ssl, sys, urllib.request\n\
                      ctx = ssl.create_default_context(cafile=sys.argv[1])\n\
                      r = urllib.request.urlopen(sys.argv[2], context=ctx, timeout=10)\n\
                      print(r.status, r.headers['content-type'])\n";
        common::output(
            cmd("/usr/bin/python3")
                .args(["-c", script])
                .arg(f("ca-cert.pem"))
                .arg(url),
            Duration::from_secs(30),
        )
    };
    assert!(wait_until(Duration::from_secs(10), || fetch(&format!(
        "https://127.0.0.1:{http}/metrics"
    ))
    .status
    .success()));
    for (path, kind) in [
        ("/metrics", "application/openmetrics-text"),
        ("/", "text/html"),
    ] {
        let out = fetch(&format!("https://127.0.0.1:{http}{path}"));
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            said.starts_with("200 ") && said.contains(kind),
            "{path}: {said} {out:?}"
        );
    }
    // Plain HTTP gets no page.
    assert!(raw(http, "GET", "/metrics", &[], None).map_or(true, |(s, _)| s != 200));
}
