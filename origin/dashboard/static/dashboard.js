// The origin dashboard: polls /dashboard/data (same origin, the session cookie) and draws
// it with uPlot. Every column arrives ready to plot: times in unix seconds, rates per
// second (null where there is nothing before a point to compare it with).
"use strict";

(function () {
  const COLORS = ["#2e90fa", "#12b76a", "#f79009", "#9e77ed", "#f04438", "#0ba5ec",
    "#ee46bc", "#667085", "#84cc16", "#155eef"];
  const LAYER_COLORS = { miss: "#f79009", redis: "#12b76a", semantic: "#9e77ed", bypass: "#667085" };
  const state = { charts: {}, updates: 0, errors: [], last: null };
  window.prismDashboard = state;

  function color(index, name) {
    return LAYER_COLORS[name] || COLORS[index % COLORS.length];
  }

  function width(el) {
    return Math.max(320, el.clientWidth || 560);
  }

  // Draw (or redraw) one chart: recreated only when its series change.
  function draw(id, times, columns, opts) {
    const el = document.getElementById(id);
    const names = Object.keys(columns);
    const key = names.join("\u0000");
    const data = [times, ...names.map((n) => columns[n])];
    const existing = state.charts[id];
    if (existing && existing.key === key) {
      existing.plot.setData(data);
      return;
    }
    if (existing) existing.plot.destroy();
    el.textContent = "";
    const series = [{}].concat(names.map((name, i) => ({
      label: name,
      stroke: color(i, name),
      width: 2,
      paths: opts && opts.stepped ? uPlot.paths.stepped({ align: 1 }) : undefined,
      value: (u, v) => (v == null ? "–" : (opts && opts.format ? opts.format(v) : v.toFixed(2))),
    })));
    const plot = new uPlot({
      width: width(el),
      height: 220,
      series: series,
      scales: { x: { time: true }, y: opts && opts.range ? { range: opts.range } : { auto: true } },
      axes: [{}, {
        size: 70,
        values: opts && opts.axis ? (u, splits) => splits.map((v) => (v == null ? "" : opts.axis(v))) : undefined,
      }],
      legend: { live: true },
    }, data, el);
    state.charts[id] = { plot: plot, key: key };
  }

  function fixed(digits) {
    return (v) => v.toFixed(digits);
  }

  function usd(v) {
    return "$" + (v >= 1 || v === 0 ? v.toFixed(2) : v.toPrecision(2));
  }

  // Axis labels stay short: tiny amounts in exponent form ($4.0e-6).
  function usdShort(v) {
    return "$" + (v === 0 ? "0" : v >= 0.01 ? v.toFixed(2) : v.toExponential(1));
  }

  function setText(id, text) {
    document.getElementById(id).textContent = text;
  }

  function lastNumber(column) {
    for (let i = column.length - 1; i >= 0; i--) if (column[i] != null) return column[i];
    return null;
  }

  function fillTable(id, rows) {
    const body = document.querySelector("#" + id + " tbody");
    body.textContent = "";
    for (const row of rows) {
      const tr = document.createElement("tr");
      for (const cell of row) {
        const td = document.createElement("td");
        if (cell && typeof cell === "object") {
          td.textContent = cell.text;
          td.className = cell.className;
        } else {
          td.textContent = cell == null ? "–" : String(cell);
        }
        tr.appendChild(td);
      }
      body.appendChild(tr);
    }
  }

  function render(d) {
    const t = d.t;
    draw("chart-requests", t, d.requests, { format: fixed(2) });
    draw("chart-hits", t, { "hit ratio": d.hit_ratio }, { range: [0, 1], format: fixed(3) });
    const latency = {};
    const health = {};
    for (const [name, p] of Object.entries(d.providers)) {
      latency[name] = p.p50_ms;
      health[name] = p.state;
    }
    draw("chart-latency", t, latency, { format: fixed(1) });
    draw("chart-health", t, health, { range: [0, 2], stepped: true, format: fixed(0) });
    const spend = {};
    const perProject = {};
    for (const [name, p] of Object.entries(d.projects)) {
      spend[name] = p.spend_usd;
      perProject[name] = p.requests_per_s;
    }
    draw("chart-spend", t, spend, { format: usd, axis: usdShort });
    draw("chart-projects", t, perProject, { format: fixed(2) });
    draw("chart-kv", t, { queued: d.kv.queued, "sent / s": d.kv.sent, "dropped / s": d.kv.dropped },
      { format: fixed(1) });

    let rate = 0;
    for (const layer of d.layers) rate += lastNumber(d.requests[layer]) || 0;
    setText("card-rate", rate.toFixed(1));
    const ratio = lastNumber(d.hit_ratio);
    setText("card-hits", ratio == null ? "–" : (100 * ratio).toFixed(1) + " %");
    const errors = lastNumber(d.server_errors);
    setText("card-errors", errors == null ? "–" : errors.toFixed(2));
    const latest = d.latest || {};
    setText("card-kv", latest.kv ? String(latest.kv.queued) : "–");
    let spent = null;
    if (latest.projects) {
      spent = 0;
      for (const p of Object.values(latest.projects)) spent += p.cost_usd;
    }
    setText("card-spend", spent == null ? "Redis unavailable" : usd(spent));

    fillTable("providers", Object.entries(latest.providers || {}).map(([name, p]) => [
      name, { text: p.state, className: p.state }, p.recent_calls,
      (100 * p.error_rate).toFixed(1) + " %", p.p50_ms, p.p95_ms, p.reason || "",
    ]));
    fillTable("projects", Object.entries(latest.projects || {}).map(([name, p]) => [
      name, (p.requests.kv || 0) + p.requests.redis + p.requests.semantic,
      p.requests.miss + p.requests.bypass,
      p.requests.coalesced,
      usd(p.cost_usd), usd(p.saved_usd),
    ]));
    fillTable("events", d.events.slice().reverse().map((e) => [
      new Date(e.at * 1000).toLocaleTimeString(), e.provider,
      { text: e.from + " → " + e.to, className: e.to }, e.reason || "",
    ]));
  }

  async function refresh() {
    try {
      const response = await fetch("/dashboard/data", { credentials: "same-origin", cache: "no-store" });
      if (response.status === 401) {
        window.location.reload(); // the session ended: back to the sign-in form
        return;
      }
      if (!response.ok) throw new Error("HTTP " + response.status);
      const d = await response.json();
      render(d);
      state.last = d;
      state.updates += 1;
      const el = document.getElementById("status");
      el.className = "";
      el.textContent = "updated " + new Date().toLocaleTimeString() + " · " + d.t.length +
        " samples every " + d.interval + " s";
      setTimeout(refresh, Math.max(500, d.interval * 1000));
    } catch (error) {
      state.errors.push(String(error));
      const el = document.getElementById("status");
      el.className = "stale";
      el.textContent = "cannot reach the origin (" + error.message + "); retrying";
      setTimeout(refresh, 3000);
    }
  }

  window.addEventListener("resize", () => {
    for (const [id, chart] of Object.entries(state.charts)) {
      chart.plot.setSize({ width: width(document.getElementById(id)), height: 220 });
    }
  });
  refresh();
})();

// The Requests page: the request log's window, read from /dashboard/requests a page at a
// time (newest first; Next follows the page's cursor, Previous goes back to the one before),
// and one request whole from /dashboard/requests/{id}. Record data (user text, in bodies)
// reaches the page only through textContent.
(function () {
  const FILTERS = ["project", "key", "model", "layer", "status", "since", "until", "limit"];
  const state = { loads: 0, rows: [], detail: null, errors: [], cursors: [null], index: 0, query: "" };
  window.prismRequests = state;
  const $ = (id) => document.getElementById(id);

  function show(view) {
    for (const name of ["charts", "requests"]) {
      $("view-" + name).hidden = name !== view;
      $("tab-" + name).classList.toggle("active", name === view);
    }
    if (view === "requests" && state.loads === 0) search();
    // Charts drawn while hidden had no width to fit: fit them now they show.
    if (view === "charts") window.dispatchEvent(new Event("resize"));
  }

  function route() {
    show(window.location.hash === "#requests" ? "requests" : "charts");
  }

  function text(value) {
    return value == null || value === "" ? "–" : String(value);
  }

  function utc(ts) {
    return new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 23);
  }

  function money(v) {
    return v == null ? "–" : "$" + (v === 0 ? "0" : v >= 0.01 ? v.toFixed(4) : v.toPrecision(2));
  }

  function ms(v) {
    return v == null ? "–" : v.toFixed(1);
  }

  function tokens(r) {
    return r.tokens_in == null ? "–" : r.tokens_in + " → " + (r.tokens_out == null ? "?" : r.tokens_out);
  }

  function setStatus(message, isError) {
    const el = $("requests-status");
    el.textContent = message;
    el.className = isError ? "note error" : "note";
  }

  async function getJson(url) {
    const response = await fetch(url, { credentials: "same-origin", cache: "no-store" });
    if (response.status === 401) {
      window.location.reload(); // the session ended: back to the sign-in form
      return null;
    }
    const body = await response.json();
    if (!response.ok) {
      const error = new Error((body.error && body.error.message) || "HTTP " + response.status);
      error.status = response.status;
      throw error;
    }
    return body;
  }

  function search() {
    const form = $("request-filters");
    const params = new URLSearchParams();
    for (const name of FILTERS) {
      const value = form.elements[name].value.trim();
      if (value) params.set(name, value);
    }
    state.query = params.toString();
    state.cursors = [null];
    state.index = 0;
    load();
  }

  async function load() {
    const params = new URLSearchParams(state.query);
    const before = state.cursors[state.index];
    if (before) params.set("before", before);
    setStatus("loading…", false);
    try {
      const page = await getJson("/dashboard/requests?" + params.toString());
      if (page === null) return;
      state.cursors.length = state.index + 1;
      if (page.next) state.cursors.push(page.next);
      fillRows(page.records);
      $("requests-previous").disabled = state.index === 0;
      $("requests-next").disabled = !page.next;
      $("requests-page").textContent = "page " + (state.index + 1);
      // A page of a rare match may stop short (the reader's budget): Next reads on.
      const more = page.next ? "; Next reads further back" : "";
      setStatus((page.records.length ? page.records.length + " requests" :
        "no request matches" + (page.next ? " in the newest part read" : "")) + more, false);
      state.loads += 1;
    } catch (error) {
      state.errors.push(String(error));
      setStatus(error.message, true);
    }
  }

  function fillRows(records) {
    const body = document.querySelector("#requests tbody");
    body.textContent = "";
    state.rows = records.map((r) => r.id);
    for (const r of records) {
      const tr = document.createElement("tr");
      tr.dataset.id = r.id;
      const cells = [utc(r.ts), r.id, r.project, r.key, r.answered_model || r.model, r.layer,
        r.status, r.error, r.provider, ms(r.total_ms), tokens(r), money(r.cost_usd)];
      for (const cell of cells) {
        const td = document.createElement("td");
        td.textContent = text(cell);
        tr.appendChild(td);
      }
      tr.addEventListener("click", () => open(r.id));
      body.appendChild(tr);
    }
  }

  async function open(id) {
    try {
      const found = await getJson("/dashboard/requests/" + encodeURIComponent(id));
      if (found === null) return;
      detail(found.record);
    } catch (error) {
      state.errors.push(String(error));
      setStatus(error.status === 404 ? "request " + id + ": not in the window (any more)" : error.message, true);
    }
  }

  function detail(r) {
    state.detail = r.id;
    $("request-detail").hidden = false;
    $("detail-id").textContent = r.id;
    for (const tr of document.querySelectorAll("#requests tbody tr")) {
      tr.classList.toggle("selected", tr.dataset.id === r.id);
    }
    const facts = [
      ["time (UTC)", utc(r.ts)], ["source", r.source], ["region", r.region], ["pop", r.pop],
      ["project", r.project], ["key id", r.key], ["api", r.api], ["path", (r.method || "") + " " + (r.path || "")],
      ["model asked", r.model], ["answered by", r.answered_model], ["provider", (r.providers || []).join(", ") || r.provider],
      ["stream", r.stream], ["layer", r.layer], ["score", r.score], ["status", r.status], ["error", r.error],
      ["tokens", tokens(r)], ["cost", money(r.cost_usd)], ["saved", money(r.saved_usd)],
      ["first byte ms", ms(r.ttfb_ms)], ["total ms", ms(r.total_ms)], ["fingerprint", r.fingerprint],
    ];
    const dl = $("detail-facts");
    dl.textContent = "";
    for (const [name, value] of facts) {
      const dt = document.createElement("dt");
      dt.textContent = name;
      const dd = document.createElement("dd");
      dd.textContent = text(value);
      dl.append(dt, dd);
    }
    const stages = Object.entries(r.stages || {});
    // Each bar its share of the whole request (a stage is part of total_ms; an edge's
    // record may have no total: then of the longest stage).
    const longest = Math.max(0.001, r.total_ms || 0, ...stages.map(([, v]) => v));
    const box = $("detail-stages");
    box.textContent = "";
    for (const [name, value] of stages) {
      const label = document.createElement("span");
      label.textContent = name;
      const track = document.createElement("div");
      track.className = "stage-track";
      const bar = document.createElement("div");
      bar.className = "stage-bar";
      bar.dataset.stage = name;
      bar.style.width = (100 * value / longest).toFixed(1) + "%";
      track.appendChild(bar);
      const figure = document.createElement("span");
      figure.textContent = ms(value);
      box.append(label, track, figure);
    }
    if (!stages.length) box.textContent = "no stages recorded";
    const attempts = document.querySelector("#detail-attempts tbody");
    attempts.textContent = "";
    (r.attempts || []).forEach((a, i) => {
      const tr = document.createElement("tr");
      for (const cell of [i + 1, a.provider, a.model, a.status, a.error, ms(a.ms)]) {
        const td = document.createElement("td");
        td.textContent = text(cell);
        tr.appendChild(td);
      }
      attempts.appendChild(tr);
    });
    const body = r.body;
    $("detail-body").hidden = !body;
    $("detail-request").textContent = body ? JSON.stringify(body.request, null, 2) : "";
    $("detail-response").textContent = body && body.response != null ? body.response : "(not kept: a streamed or empty answer)";
  }

  $("request-filters").addEventListener("submit", (event) => {
    event.preventDefault();
    search();
  });
  $("request-find").addEventListener("submit", (event) => {
    event.preventDefault();
    const id = event.target.elements.id.value.trim();
    if (id) open(id);
  });
  $("requests-next").addEventListener("click", () => {
    if (state.index + 1 < state.cursors.length) {
      state.index += 1;
      load();
    }
  });
  $("requests-previous").addEventListener("click", () => {
    if (state.index > 0) {
      state.index -= 1;
      load();
    }
  });
  window.addEventListener("hashchange", route);
  route();
})();
