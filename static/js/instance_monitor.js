// Instance monitor: live charts of the instance's GPUs and container from /ws/monitor/instances/<id>/.
// The socket sends {"type": "history", "samples": [...]} first (a compact backfill: points over the last
// 15 minutes with only what the charts draw, then the newest sample whole, so the charts draw at once, also
// after a reconnect), then one sample document per second (see the README for its shape). A share whose own
// utilization is absent (util null, util_absent "shared-card": a fraction of a card under MPS) is drawn as a gap,
// never 0, beside its card's utilization (dashed), with the page's sentence saying why.
(function () {
  const cfg = JSON.parse(document.getElementById("monitor-config").textContent);
  const conn = document.getElementById("conn");
  const smi = document.getElementById("smi");
  const COLORS = ["#2f6fed", "#1a8a3a", "#d9822b", "#8a6df0", "#c43d3d", "#0f9fb0", "#a0522d", "#6b7385"];
  let docs = [];          // sample documents in the window, oldest first
  let gpus = [];          // card uuids, in the order the documents list them
  const charts = {};

  const perGpu = (field, scale) => gpus.map((uuid, k) => ({
    label: `GPU${indexOf(uuid)}`, color: COLORS[k % COLORS.length],
    get: (d) => { const g = d.gpus.find((x) => x.uuid === uuid); return g && g[field] != null ? g[field] * scale : null; },
  }));
  const limitLine = (label, get) => ({ label, color: "#c43d3d", dash: [6, 4], get });
  const cardLines = () => gpus.map((uuid, k) => ({
    label: `GPU${indexOf(uuid)} card`, color: COLORS[k % COLORS.length], dash: [3, 3],
    get: (d) => { const g = d.gpus.find((x) => x.uuid === uuid); return g && g.card_util != null ? g.card_util * 100 : null; },
  }));
  const DEFS = {
    util: () => perGpu("util", 100).concat(cardLines()),
    mem: () => perGpu("mem_used", 1).concat(gpus.length ? [limitLine("cap", (d) => (d.gpus[0] || {}).mem_cap)] : []),
    power: () => perGpu("power", 1),
    temp: () => perGpu("temp", 1),
    cpu: () => [{ label: "cores", color: COLORS[0], get: (d) => d.cpu }, limitLine("limit", (d) => d.cpu_limit)],
    cmem: () => [{ label: "MiB", color: COLORS[0], get: (d) => d.mem_used }, limitLine("limit", (d) => d.mem_limit)],
  };

  function indexOf(uuid) {
    for (let i = docs.length - 1; i >= 0; i--) {
      const g = docs[i].gpus.find((x) => x.uuid === uuid);
      if (g && g.i != null) return g.i;
    }
    return "?";
  }

  function size(el) { return { width: Math.max(el.clientWidth, 280), height: 200 }; }

  function build(name, lines, data) {
    const el = document.querySelector(`[data-chart="${name}"]`);
    if (charts[name]) charts[name].destroy();
    el.innerHTML = "";
    const opts = {
      ...size(el),
      scales: { x: { time: true } },
      series: [{}].concat(lines.map((l) => ({ label: l.label, stroke: l.color, width: 1.5, dash: l.dash, spanGaps: false }))),
      axes: [{}, { size: 64 }],
      legend: { live: true },
    };
    charts[name] = new uPlot(opts, data, el);
    charts[name].lines = lines.length;
  }

  function redraw() {
    const t = docs.map((d) => d.t);
    for (const [name, def] of Object.entries(DEFS)) {
      const lines = def();
      const data = [t].concat(lines.map((l) => docs.map(l.get)));
      if (!charts[name] || charts[name].lines !== lines.length) build(name, lines, data);
      else charts[name].setData(data);
      document.querySelector(`[data-chart="${name}"]`).dataset.points = String(t.length);
    }
    const last = docs[docs.length - 1];
    if (last) smi.textContent = nvidiaSmi(last);
    document.querySelector("[data-util-absent]").hidden = !(last && last.gpus.some((g) => g.util_absent === SHARED));
  }

  const SHARED = "shared-card";
  function ownUtil(g) {
    if (g.util != null) return `util ${fmt(g.util, 100, "%")} of share`;
    return g.util_absent === SHARED ? "util not measurable (shared card)" : "util —";
  }

  function nvidiaSmi(d) {
    const when = new Date(d.t * 1000).toLocaleTimeString();
    const rows = d.gpus.map((g) => [
      `GPU${g.i ?? "?"}  ${(g.model || "").padEnd(12)}  share ${g.share.toFixed(2)}`,
      ownUtil(g),
      `mem ${g.mem_used ?? "—"} / ${g.mem_cap} MiB`,
      `${fmt(g.power, 1, " W")}  ${fmt(g.temp, 1, " °C")}  card util ${fmt(g.card_util, 100, "%")}`,
    ].join("  │  "));
    const cpu = `container  cpu ${fmt(d.cpu, 1, "")} / ${d.cpu_limit} cores  │  mem ${d.mem_used ?? "—"} / ${d.mem_limit} MiB`;
    return `${when}  node ${d.node}${d.simulated ? "  (simulated GPU)" : ""}\n${rows.join("\n")}\n${cpu}`;
  }

  function fmt(v, scale, unit) { return v == null ? "—" : `${(v * scale).toFixed(scale === 100 ? 0 : 1)}${unit}`; }

  function add(samples) {
    const lastT = docs.length ? docs[docs.length - 1].t : 0;
    for (const d of samples) if (d.v === 1 && d.t > lastT) docs.push(d);
    const cutoff = (docs.length ? docs[docs.length - 1].t : 0) - cfg.window_s;
    docs = docs.filter((d) => d.t >= cutoff);
    const seen = [];
    for (const d of docs) for (const g of d.gpus) if (!seen.includes(g.uuid)) seen.push(g.uuid);
    gpus = seen;
    const cap = document.querySelector("[data-cap]");
    if (cap && docs.length) cap.textContent = docs[docs.length - 1].gpus.map((g) => `${g.mem_cap} MiB`).join(", ");
    redraw();
  }

  function drawDay() {
    const el = document.querySelector('[data-chart="day"]');
    const uuids = [...new Set(cfg.minutes.map((m) => m[1]))];
    const times = [...new Set(cfg.minutes.map((m) => m[0]))];
    if (!times.length) { el.innerHTML = `<p class="muted">${gettext("No minutes recorded in the last 24 hours.")}</p>`; return; }
    const lines = [], data = [times];
    uuids.forEach((uuid, k) => {
      const rows = new Map(cfg.minutes.filter((m) => m[1] === uuid).map((m) => [m[0], m]));
      lines.push({ label: `GPU${k} avg`, color: COLORS[k % COLORS.length] });
      lines.push({ label: `GPU${k} peak`, color: COLORS[k % COLORS.length], dash: [4, 3] });
      data.push(times.map((t) => (rows.has(t) && rows.get(t)[2] != null ? rows.get(t)[2] * 100 : null)));
      data.push(times.map((t) => (rows.has(t) && rows.get(t)[3] != null ? rows.get(t)[3] * 100 : null)));
    });
    build("day", lines, data);
    document.querySelector("[data-day-unread]").hidden = !cfg.minutes.some((m) => m[2] == null);
  }

  let delay = 1000;
  function setState(state, text) { conn.dataset.state = state; conn.textContent = text; }
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const base = document.querySelector('meta[name="websocket-url"]').content || `${scheme}://${location.host}`;
    const socket = new WebSocket(base + cfg.socket);
    socket.onopen = () => { setState("live", gettext("live")); delay = 1000; };
    socket.onmessage = (event) => {
      const message = JSON.parse(event.data);
      add(message.type === "history" ? message.samples : [message]);
    };
    socket.onclose = (event) => {
      if (event.code >= 4400 && event.code < 4500) { setState("refused", `${gettext("refused")} (${event.code})`); return; }
      setState("reconnecting", gettext("reconnecting…"));
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }

  window.addEventListener("resize", () => { for (const [name, c] of Object.entries(charts)) c.setSize(size(document.querySelector(`[data-chart="${name}"]`))); });
  drawDay();
  redraw();
  connect();
})();
