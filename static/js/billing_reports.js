// Billing reports: revenue and billed GPU-hours per day, as uPlot bar charts.
(function () {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  const times = data.days.map((d) => Date.parse(d + "T00:00:00Z") / 1000);
  const bars = uPlot.paths.bars({ size: [0.6, 40] });
  for (const [name, label, color] of [["revenue", "revenue", "#2f6fed"], ["gpu_hours", "GPU-hours", "#1a8a3a"]]) {
    const el = document.querySelector(`[data-chart="${name}"]`);
    if (!times.length) { el.innerHTML = `<p class="muted">${gettext("Nothing billed in this range.")}</p>`; continue; }
    const plot = new uPlot({
      width: Math.max(el.clientWidth, 280), height: 220,
      // Half a day either side, so one day's bar is a bar and not a sliver on a years-long axis.
      scales: { x: { time: true, auto: false, range: [times[0] - 43200, times[times.length - 1] + 43200] } },
      series: [{}, { label, stroke: color, fill: color + "99", paths: bars, points: { show: false } }],
      axes: [{}, { size: 64 }],
    }, [times, data[name]], el);
    el.dataset.drawn = String(plot.data[0].length);
  }
})();
