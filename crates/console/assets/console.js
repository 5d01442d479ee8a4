// braid console: swaps the server-rendered parts as the push stream sends
// them, keeps the last minutes of figures for the charts (uPlot), and posts
// guarded actions with the token in a header. No build step.
"use strict";
(function () {
  const KEEP = 300; // seconds of history per chart
  const body = document.body;
  const root = document.documentElement;
  const actions = body.dataset.actions === "on";
  let layout = body.dataset.layout;

  // Theme: follows the system until chosen; the choice is remembered.
  const themes = ["auto", "dark", "light"];
  function applyTheme(t) {
    if (t === "auto") delete root.dataset.theme; else root.dataset.theme = t;
    document.getElementById("theme").textContent = "theme: " + t;
  }
  let theme = localStorage.getItem("braid-theme") || "auto";
  applyTheme(theme);
  document.getElementById("theme").addEventListener("click", function () {
    theme = themes[(themes.indexOf(theme) + 1) % themes.length];
    localStorage.setItem("braid-theme", theme);
    applyTheme(theme);
    rebuildCharts();
  });

  // The token: taken from ?token= once, then kept for this tab only and
  // dropped from the address bar.
  const url = new URL(location.href);
  if (url.searchParams.has("token")) {
    sessionStorage.setItem("braid-token", url.searchParams.get("token"));
    url.searchParams.delete("token");
    history.replaceState(null, "", url.pathname + url.search);
  }
  const token = () => sessionStorage.getItem("braid-token") || "";
  const tokenForm = document.getElementById("token");
  if (actions && !token()) tokenForm.hidden = false;
  tokenForm.addEventListener("submit", function (e) {
    e.preventDefault();
    sessionStorage.setItem("braid-token", tokenForm.token.value.trim());
    tokenForm.hidden = true;
    connect();
  });

  const notice = document.getElementById("notice");
  let noticeTimer = 0;
  function say(text, bad) {
    notice.textContent = text;
    notice.className = "notice shown" + (bad ? " bad" : "");
    clearTimeout(noticeTimer);
    noticeTimer = setTimeout(() => (notice.className = "notice"), 6000);
  }

  // Times arrive in UTC; shown in the reader's zone.
  function localTimes(el) {
    el.querySelectorAll("time[data-ms]").forEach(function (t) {
      const d = new Date(Number(t.dataset.ms));
      t.textContent = d.toLocaleTimeString([], { hour12: false }) + "." +
        String(d.getMilliseconds()).padStart(3, "0");
    });
  }
  localTimes(document);

  // Charts: one set per volume (attach) or one for the portals (serve).
  const color = (i) => getComputedStyle(root).getPropertyValue("--p" + ((i % 6) + 1)).trim();
  const muted = () => getComputedStyle(root).getPropertyValue("--muted").trim();
  const lineColor = () => getComputedStyle(root).getPropertyValue("--line").trim();
  const charts = new Map(); // figure element -> {plot, names, key}
  const kept = new Map(); // chart key -> {t: [], cols: [[]...], names}

  const READ = {
    mbps: (p) => [(p.read_bytes_per_s + p.write_bytes_per_s) / 1e6],
    iops: (p) => [p.read_iops + p.write_iops],
    lat: (p) => [p.latency_p50_us / 1000, p.latency_p99_us / 1000],
    inflight: (p) => [p.inflight_requests],
    inbytes: (p) => [p.inflight_bytes / 1048576],
    share: (p) => [p.share * 100],
    "portal-mbps": (p) => [(p.read_bytes_per_s + p.write_bytes_per_s) / 1e6],
    "portal-clients": (p) => [p.connections],
  };

  function record(key, names, values) {
    let h = kept.get(key);
    if (!h || h.names.join("|") !== names.join("|")) {
      h = { t: [], cols: names.map(() => []), names: names };
      kept.set(key, h);
    }
    const now = Date.now() / 1000;
    h.t.push(now);
    values.forEach((v, i) => h.cols[i].push(v));
    while (h.t[0] < now - KEEP) {
      h.t.shift();
      h.cols.forEach((c) => c.shift());
    }
    return h;
  }

  function makePlot(fig, h) {
    const el = fig.querySelector(".plot");
    el.textContent = "";
    const bases = [];
    const series = [{}].concat(h.names.map(function (n) {
      const base = n.replace(/ p(50|99)$/, "");
      if (bases.indexOf(base) < 0) bases.push(base);
      const p50 = n.endsWith(" p50");
      return {
        label: n, stroke: color(bases.indexOf(base)), width: p50 ? 1 : 2,
        dash: p50 ? [4, 4] : undefined, points: { show: false },
      };
    }));
    const axis = { stroke: muted(), grid: { stroke: lineColor(), width: 1 }, ticks: { stroke: lineColor() } };
    const clock = (u, vals) => vals.map((v) => new Date(v * 1000).toLocaleTimeString([], { hour12: false }));
    const plot = new uPlot({
      width: Math.max(200, el.clientWidth), height: 150, series: series,
      axes: [Object.assign({ values: clock }, axis), Object.assign({ size: 48 }, axis)],
      scales: { x: { time: true }, y: { range: (u, lo, hi) => [0, Math.max(hi * 1.1, 1)] } },
      legend: { live: false }, cursor: { drag: { x: false, y: false } },
    }, [h.t].concat(h.cols), el);
    return plot;
  }

  function feed(fig, key, names, values) {
    const h = record(key, names, values);
    let c = charts.get(fig);
    if (typeof uPlot === "undefined") return;
    if (!c || c.key !== h.names.join("|")) {
      if (c) c.plot.destroy();
      c = { plot: makePlot(fig, h), key: h.names.join("|") };
      charts.set(fig, c);
    } else {
      c.plot.setData([h.t].concat(h.cols));
    }
  }

  function rebuildCharts() {
    charts.forEach((c) => c.plot.destroy());
    charts.clear();
    if (last) draw(last);
  }

  function draw(snap) {
    if (snap.role === "attach") {
      document.querySelectorAll(".charts[data-volume]").forEach(function (box) {
        const vol = snap.volumes.find((v) => v.name === box.dataset.volume);
        if (!vol) return;
        box.querySelectorAll("figure.chart").forEach(function (fig) {
          const chart = fig.dataset.chart;
          const names = [];
          const values = [];
          vol.paths.forEach(function (p) {
            const vs = READ[chart](p);
            vs.forEach(function (v, j) {
              names.push("path " + p.index + (vs.length > 1 ? (j ? " p99" : " p50") : ""));
              values.push(v);
            });
          });
          feed(fig, vol.name + "/" + chart, names, values);
        });
      });
    } else {
      document.querySelectorAll(".charts[data-serve] figure.chart").forEach(function (fig) {
        const chart = fig.dataset.chart;
        feed(fig, chart, snap.portals.map((p) => p.protocol + " " + p.address),
          snap.portals.map((p) => READ[chart](p)[0]));
      });
    }
  }

  let resizeTimer = 0;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () {
      charts.forEach(function (c, fig) {
        c.plot.setSize({ width: Math.max(200, fig.querySelector(".plot").clientWidth), height: 150 });
      });
    }, 150);
  });

  // The push stream.
  const live = document.getElementById("live");
  let last = null;
  let source = null;
  function connect() {
    if (source) source.close();
    source = new EventSource("/events" + (token() ? "?token=" + encodeURIComponent(token()) : ""));
    source.addEventListener("update", function (e) {
      const u = JSON.parse(e.data);
      if (u.layout !== layout) { location.reload(); return; }
      u.parts.forEach(function (p) {
        const el = document.getElementById(p.id);
        if (el && el.dataset.html !== p.html) {
          el.innerHTML = p.html;
          el.dataset.html = p.html;
          localTimes(el);
        }
      });
      last = u.snapshot;
      draw(last);
      live.textContent = "live";
      live.className = "live on";
    });
    source.onerror = function () {
      live.textContent = "reconnecting";
      live.className = "live off";
    };
  }
  connect();

  // Actions: the same requests as braid policy, braid path, braid alua.
  async function act(payload) {
    try {
      const r = await fetch("/api/action", {
        method: "POST", credentials: "omit",
        headers: Object.assign({ "Content-Type": "application/json" },
          token() ? { "X-Braid-Token": token() } : {}),
        body: JSON.stringify(payload),
      });
      const a = await r.json();
      say(a.ok ? a.done : "refused: " + a.error, !a.ok);
      if (r.status === 401) tokenForm.hidden = false;
    } catch (err) {
      say("the daemon did not answer: " + err, true);
    }
  }
  document.addEventListener("submit", function (e) {
    const f = e.target.closest("form.act");
    if (!f) return;
    e.preventDefault();
    if (f.dataset.op === "policy") {
      act({ op: "policy", volume: f.dataset.volume, policy: f.policy.value });
    } else if (f.dataset.op === "alua") {
      act({ op: "alua", portal: f.dataset.portal, state: f.state.value });
    }
  });
  document.addEventListener("click", function (e) {
    const b = e.target.closest("button.act");
    if (!b) return;
    const vol = b.closest("section.volume").dataset.volume;
    act({ op: "path", volume: vol, path: Number(b.dataset.path), enable: b.dataset.enable === "true" });
  });
})();
