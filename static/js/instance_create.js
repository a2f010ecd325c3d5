// Create instance: the price per hour of the configuration being chosen (on-demand and spot side by side);
// CPU and memory follow the cards (as AutoDL allots them per card) until the user sets them; and the
// "which GPU do I need?" helper fills the form in.
(function () {
  const box = document.getElementById("estimate");
  const form = box.closest("form");
  const field = (name) => form.querySelector(`[name="${name}"]`);
  const limits = JSON.parse(document.getElementById("node-limits").textContent);
  const allotmentNote = form.querySelector("[data-allotment]");
  // A form sent back with errors keeps what the user typed.
  const touched = new Set(form.dataset.bound ? ["cpu_cores", "memory_gb"] : []);
  let pending;

  async function price(params) {
    const response = await fetch(`${box.dataset.url}?${new URLSearchParams(params)}`, { headers: { Accept: "application/json" } });
    return response.ok ? response.json() : null;
  }

  function query() {
    return {
      gpu_type: field("gpu_type").value, gpus: field("gpus").value || "1",
      cpu_cores: field("cpu_cores").value || "1", memory_gb: field("memory_gb").value || "1",
    };
  }

  // At once (no request in between), so nothing is written after the user has moved on to these fields.
  function scale() {
    const per = limits[field("gpu_type").value];
    if (!per || per.cpus_per_card == null) return;
    const share = parseFloat(field("gpus").value) || 1;
    const fit = (wanted, most) => String(Math.max(1, most ? Math.min(wanted, most) : wanted));
    if (!touched.has("cpu_cores")) field("cpu_cores").value = fit(Math.ceil(per.cpus_per_card * share), per.cpu);
    if (!touched.has("memory_gb")) field("memory_gb").value = fit(Math.ceil(per.memory_gb_per_card * share), per.memory_gb);
    if (allotmentNote) {
      allotmentNote.textContent = interpolate(gettext("Included with each card: %(cpu)s cores and %(memory)s GB; more is charged extra."),
        { cpu: per.cpus_per_card, memory: per.memory_gb_per_card }, true);
    }
  }

  async function update() {
    const type = field("gpu_type").value;
    if (!type) { box.textContent = gettext("Price: choose a GPU type."); return; }
    const p = await price(query());
    if (!p) { box.textContent = gettext("Price: —"); return; }
    const spot = field("billing_mode") && field("billing_mode").value === "spot";
    const money = (value) => `<strong>${(+value).toFixed(2)}</strong> ${p.currency}/h`;
    box.innerHTML = interpolate(gettext("Price: %(on_demand)s on-demand · %(spot)s spot%(chosen)s"), {
      on_demand: money(p.on_demand_per_hour).replace("<strong>", "<strong data-on-demand>"),
      spot: money(p.spot_per_hour).replace("<strong>", "<strong data-spot>"),
      chosen: spot ? gettext(" (chosen)") : "",
    }, true) + ` <span class="muted small">${interpolate(gettext("spot card-hour %(card)s, band %(low)s–%(high)s"), {
      card: (+p.spot_card_hour).toFixed(2), low: (+p.spot_band[0]).toFixed(2), high: (+p.spot_band[1]).toFixed(2),
    }, true)}</span>`;
  }

  form.addEventListener("input", (event) => {
    const name = event.target.name;
    if (name === "cpu_cores" || name === "memory_gb") touched.add(name);  // set by hand: theirs from now on
    if (name === "gpus" || name === "gpu_type") scale();
    clearTimeout(pending);
    pending = setTimeout(update, 200);
  });
  form.addEventListener("change", (event) => {
    if (event.target.name === "gpu_type") scale();
    update();
  });
  if (!form.dataset.bound) scale();
  update();

  const helper = document.getElementById("recommend");
  const answer = document.querySelector("[data-recommendation]");
  helper.addEventListener("submit", async (event) => {
    event.preventDefault();
    const response = await fetch(`${helper.dataset.url}?${new URLSearchParams(new FormData(helper))}`, { headers: { Accept: "application/json" } });
    const body = await response.json();
    if (!response.ok) { answer.textContent = body.detail || Object.values(body).flat().join(" "); return; }
    field("gpu_type").value = String(body.gpu_type.id);
    field("gpus").value = String(body.cards);
    scale();
    answer.textContent = interpolate(gettext("%(cards)s × %(name)s (%(memory)s GB needed): %(reason)s"),
      { cards: body.cards, name: body.gpu_type.display_name, memory: Math.round(body.memory_gb), reason: body.reason }, true);
    update();
  });
})();
