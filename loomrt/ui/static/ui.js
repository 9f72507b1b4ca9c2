// loomrt ui: the tokens chart (uPlot) of a run page; everything else is htmx.
(function () {
  const box = document.getElementById("chart");
  if (!box || typeof uPlot === "undefined") return;
  fetch(box.dataset.src, { credentials: "same-origin" }).then(r => r.json()).then(series => {
    if (!series.data[0].length) { box.textContent = "No model call yet."; return; }
    const opts = {
      width: Math.max(320, box.clientWidth - 8), height: 220,
      scales: { x: { time: false } },
      axes: [{ label: "seq", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] }, { label: "input tokens", size: 70 }],
      series: [
        { label: "seq" },
        { label: "turn call", stroke: "#2563eb", points: { show: true }, spanGaps: true },
        { label: "distillation call", stroke: "#a855f7", points: { show: true, size: 8 }, paths: () => null },
        { label: "cached", stroke: "#9ca3af", dash: [4, 4] },
        { label: "budget", stroke: "#dc2626", dash: [8, 4], points: { show: false } },
      ],
    };
    box.dataset.points = String(series.data[0].length);
    new uPlot(opts, series.data, box);
  });
})();
