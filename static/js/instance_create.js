// Create instance: the price per hour of the configuration being chosen, on-demand and spot side by side.
(function () {
  const box = document.getElementById("estimate");
  const form = box.closest("form");
  const field = (name) => form.querySelector(`[name="${name}"]`);
  let pending;
  async function update() {
    const params = new URLSearchParams({
      gpu_type: field("gpu_type").value, gpus: field("gpus").value || "1",
      cpu_cores: field("cpu_cores").value || "1", memory_gb: field("memory_gb").value || "1",
    });
    if (!field("gpu_type").value) { box.textContent = gettext("Price: choose a GPU type."); return; }
    const response = await fetch(`${box.dataset.url}?${params}`, { headers: { Accept: "application/json" } });
    if (!response.ok) { box.textContent = gettext("Price: —"); return; }
    const p = await response.json();
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
  form.addEventListener("input", () => { clearTimeout(pending); pending = setTimeout(update, 200); });
  form.addEventListener("change", update);
  update();
})();
