//! A headless Chromium driven through chromedriver's WebDriver protocol
//! (W3C JSON over HTTP), spoken over a plain TCP socket: open a page, run
//! a script in it, wait for something to show, take a screenshot. The
//! driver and its browser run in their own process group, stopped by its
//! id when the guard drops; the profile is a fresh temporary directory.
//! Given a lab, the browser runs in its client namespace.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use braid_lab::{Lab, Side};
use serde_json::{json, Value};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

pub struct Browser<'a> {
    driver: Child,
    port: u16,
    session: String,
    lab: Option<&'a Lab>,
    _profile: tempfile::TempDir,
}

impl<'a> Browser<'a> {
    /// Starts chromedriver on a free loopback port (in the lab's client
    /// namespace, given one) and a browser session of `width` x `height`.
    pub fn start(lab: Option<&'a Lab>, width: u32, height: u32) -> Self {
        let profile = tempfile::tempdir().unwrap();
        let port = in_ns(lab, || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        });
        // In the lab: `ip netns exec` becomes chromedriver (same PID).
        let mut cmd = match lab {
            Some(lab) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", lab.ns(Side::Client), CHROMEDRIVER]);
                c
            }
            None => Command::new(CHROMEDRIVER),
        };
        let driver = cmd
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own group: the browser it starts is stopped with it.
            .process_group(0)
            .spawn()
            .expect("start chromedriver");
        let mut b = Browser {
            driver,
            port,
            session: String::new(),
            lab,
            _profile: profile,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let ready = b.call("GET", "/status", None).ok();
            if ready.is_some_and(|v| v["value"]["ready"] == true) {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            // Its crash handler would outlive the browser's process group.
            "--disable-crash-reporter",
            "--disable-breakpad",
            "--hide-scrollbars",
            &format!("--user-data-dir={}", b._profile.path().display()),
            &format!("--window-size={width},{height}"),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args}
        }}});
        let v = b
            .call("POST", "/session", Some(caps))
            .expect("a browser session");
        b.session = v["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"))
            .to_owned();
        b
    }

    /// One WebDriver command; the answer's JSON, or the driver's error.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let port = self.port;
        in_ns(self.lab, || http(port, method, path, body))
    }

    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let v = self
            .call(method, &path, body)
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"));
        if v["value"]["error"].is_string() {
            panic!("WebDriver {method} {path}: {}", v["value"]);
        }
        v["value"].clone()
    }

    pub fn open(&self, url: &str) {
        self.session_call("POST", "/url", Some(json!({ "url": url })));
    }

    /// Runs `script` (a function body: `return ...`) in the page.
    pub fn eval(&self, script: &str) -> Value {
        self.session_call(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// Runs `script`, which ends by calling `done(value)` (an async
    /// function body: `const done = arguments[arguments.length - 1]`).
    pub fn eval_async(&self, script: &str) -> Value {
        self.session_call(
            "POST",
            "/execute/async",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// Evaluates `script` until it returns something truthy, within
    /// `limit`; that value, or `None` and the last one.
    pub fn wait_for(&self, limit: Duration, script: &str) -> Result<Value, Value> {
        let deadline = Instant::now() + limit;
        loop {
            let v = self.eval(script);
            let truthy = match &v {
                Value::Null | Value::Bool(false) => false,
                Value::String(s) => !s.is_empty(),
                Value::Number(n) => n.as_f64() != Some(0.0),
                _ => true,
            };
            if truthy {
                return Ok(v);
            }
            if Instant::now() >= deadline {
                return Err(v);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn resize(&self, width: u32, height: u32) {
        self.session_call(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        );
    }

    /// A PNG of the window, written to `path`.
    pub fn screenshot(&self, path: &Path) {
        let v = self.session_call("GET", "/screenshot", None);
        let png = base64(v.as_str().expect("base64 PNG"));
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser<'_> {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let _ = self.call("DELETE", &path, None);
        }
        // The driver's group: chromedriver and any browser left behind.
        let pgid = self.driver.id() as i32;
        // SAFETY: kill only sends a signal to the group this guard started.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.driver.wait();
    }
}

/// Where the harness leaves its screenshots: `BRAID_SCREENSHOTS` (the
/// README's come from `BRAID_SCREENSHOTS=doc`), else the build's scratch.
pub fn screenshot_dir() -> std::path::PathBuf {
    match std::env::var_os("BRAID_SCREENSHOTS") {
        Some(d) => Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(d),
        None => Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots"),
    }
}

/// Sets its flag when dropped: a load thread started beside a check stops
/// even when the check panics.
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn in_ns<R: Send>(lab: Option<&Lab>, f: impl FnOnce() -> R + Send) -> R {
    match lab {
        Some(lab) => lab
            .enter(Side::Client, f)
            .expect("enter the lab's client side"),
        None => f(),
    }
}

/// One HTTP/1.1 exchange with 127.0.0.1:`port`, bounded in time.
pub fn http(port: u16, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
    let (status, text) = raw(port, method, path, &[], body.map(|b| b.to_string()))?;
    serde_json::from_str(&text).map_err(|e| format!("HTTP {status}, not JSON ({e}): {text}"))
}

/// One HTTP/1.1 request with `headers`; the status and the body.
pub fn raw(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<String>,
) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.unwrap_or_default();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    // Read to the end of the body: its length, the last chunk, or EOF
    // (some servers keep the connection open whatever the request says).
    let mut resp = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        if let Some(at) = resp.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&resp[..at]).to_ascii_lowercase();
            let body = &resp[at + 4..];
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|n| n.trim().parse::<usize>().ok());
            let done = match length {
                Some(n) => body.len() >= n,
                None if head.contains("transfer-encoding: chunked") => {
                    body.ends_with(b"\r\n0\r\n\r\n") || body.starts_with(b"0\r\n")
                }
                None => false,
            };
            if done {
                break;
            }
        }
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        resp.extend_from_slice(&buf[..n]);
    }
    let resp = String::from_utf8_lossy(&resp).into_owned();
    let (head, rest) = resp.split_once("\r\n\r\n").ok_or("no HTTP head")?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status")?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn base64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in s.bytes().filter_map(val) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}
