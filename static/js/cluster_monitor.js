// Cluster monitor (staff): every card's live numbers from /ws/monitor/cluster/, like nvidia-smi for the cluster.
(function () {
  const cfg = JSON.parse(document.getElementById("monitor-config").textContent);
  const conn = document.getElementById("conn");
  const latest = {}; // node name -> its newest document

  function show(doc) {
    if (doc.v !== 1) return;
    latest[doc.node] = doc;
    for (const g of doc.gpus) {
      const row = document.querySelector(`tr[data-uuid="${g.uuid}"]`);
      if (!row) continue;
      set(row, "util", g.util == null ? "—" : `${Math.round(g.util * 100)}%`);
      set(row, "mem", g.mem_used == null ? "—" : `${g.mem_used} / ${g.mem_total}`);
      set(row, "power", g.power == null ? "—" : `${g.power.toFixed(0)} / ${g.power_limit ?? "?"} W`);
      set(row, "temp", g.temp == null ? "—" : `${g.temp.toFixed(0)} °C`);
      set(row, "sm_clock", g.sm_clock == null ? "—" : `${g.sm_clock} MHz`);
      for (const t of g.tenants) {
        const held = row.querySelector(`[data-workload="${t.workload}"] [data-held="util"]`);
        if (held) held.textContent = `${ownUtil(t)} · ${t.mem_used ?? "—"}/${t.mem_cap} MiB`;
      }
    }
    totals();
  }

  // A fraction of a card under MPS has no utilization of its own (util null, util_absent "shared-card"): say so,
  // with its own memory; the card's utilization is in the row.
  const notMeasurable = document.getElementById("util-absent-text").textContent;
  function ownUtil(t) {
    if (t.util != null) return `busy ${Math.round(t.util * 100)}%`;
    return t.util_absent === "shared-card" ? notMeasurable : "—";
  }

  function set(row, field, text) { row.querySelector(`[data-field="${field}"]`).textContent = text; }

  function totals() {
    const sums = {};
    for (const doc of Object.values(latest)) for (const g of doc.gpus) {
      const s = (sums[g.model] ||= { util: 0, n: 0, used: 0, total: 0 });
      if (g.util != null) { s.util += g.util; s.n += 1; }
      s.used += g.mem_used || 0; s.total += g.mem_total || 0;
    }
    for (const [model, s] of Object.entries(sums)) {
      const row = document.querySelector(`tr[data-model="${model}"]:not([data-uuid])`);
      if (!row) continue;
      row.querySelector('[data-total="util"]').textContent = s.n ? `${Math.round((s.util / s.n) * 100)}%` : "—";
      row.querySelector('[data-total="mem"]').textContent = `${s.used} / ${s.total} MiB`;
    }
  }

  setInterval(() => {
    for (const [name, doc] of Object.entries(latest)) {
      const age = document.querySelector(`[data-node="${name}"] [data-age]`);
      if (age) age.textContent = `${Math.max(0, Math.round(Date.now() / 1000 - doc.t))} s ago`;
    }
  }, 1000);

  let delay = 1000;
  function connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const base = document.querySelector('meta[name="websocket-url"]').content || `${scheme}://${location.host}`;
    const socket = new WebSocket(base + cfg.socket);
    socket.onopen = () => { conn.dataset.state = "live"; conn.textContent = gettext("live"); delay = 1000; };
    socket.onmessage = (event) => {
      const message = JSON.parse(event.data);
      (message.type === "history" ? message.samples : [message]).forEach(show);
    };
    socket.onclose = (event) => {
      if (event.code >= 4400 && event.code < 4500) { conn.dataset.state = "refused"; conn.textContent = `${gettext("refused")} (${event.code})`; return; }
      conn.dataset.state = "reconnecting"; conn.textContent = gettext("reconnecting…");
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }
  connect();
})();
