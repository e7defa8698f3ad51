/* Draws the feature-group health chart (freshness lag and coverage over time) with uPlot.
   The data comes from a json_script element named by the container's data-series attribute. */
(function () {
  "use strict";

  function drawHealth(container) {
    var source = document.getElementById(container.dataset.series);
    if (!source || typeof uPlot === "undefined") return;
    var series = JSON.parse(source.textContent);
    if (!series.t || !series.t.length) return;
    var sla = series.t.map(function () { return series.sla_hours; });
    var options = {
      width: Math.max(container.clientWidth, 320),
      height: 260,
      scales: { x: { time: true }, hours: { auto: true }, share: { range: [0, 1] } },
      series: [
        {},
        { label: "Freshness lag (h)", scale: "hours", stroke: "#2458d6", width: 2,
          points: { show: series.t.length < 60 } },
        { label: "SLA (h)", scale: "hours", stroke: "#c0362c", width: 1, dash: [6, 4],
          points: { show: false } },
        { label: "Coverage", scale: "share", stroke: "#1d7f4e", width: 2,
          points: { show: series.t.length < 60 } }
      ],
      axes: [
        {},
        { scale: "hours", label: "hours" },
        { scale: "share", side: 1, label: "coverage", grid: { show: false },
          values: function (u, ticks) { return ticks.map(function (v) { return Math.round(v * 100) + "%"; }); } }
      ]
    };
    var chart = new uPlot(options, [series.t, series.freshness_hours, sla, series.coverage], container);
    container.dataset.drawn = "true";
    window.addEventListener("resize", function () {
      chart.setSize({ width: Math.max(container.clientWidth, 320), height: 260 });
    });
  }

  function drawAll() {
    document.querySelectorAll('[data-chart="health"]').forEach(drawHealth);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", drawAll);
  } else {
    drawAll();
  }
})();
