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
