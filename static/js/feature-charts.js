/* Draws the feature-group health chart (freshness lag and coverage over time) with uPlot: a UTC
   time axis, hours and coverage axes, hover values with units, and an empty state when there is
   no point yet. The data comes from a json_script element named by the container's data-series
   attribute. */
(function () {
  "use strict";

  function drawHealth(container) {
    var source = document.getElementById(container.dataset.series);
    if (!source || typeof uPlot === "undefined") return;
    var series = JSON.parse(source.textContent);
    if (!series.t || !series.t.length) {
      var empty = document.createElement("p");
      empty.className = "chart-empty muted";
      empty.textContent = "No data yet: freshness and coverage will show here once the group " +
        "has ingested a batch and its health check has run.";
      container.appendChild(empty);
      container.dataset.drawn = "empty";
      return;
    }
    function unit(suffix, scale) {
      return function (u, v) {
        return v === null || v === undefined ? "–" : (Math.round(v * scale * 100) / 100) + suffix;
      };
    }
    var sla = series.t.map(function () { return series.sla_hours; });
    var options = {
      width: Math.max(container.clientWidth, 320),
      height: 260,
      scales: { x: { time: true }, hours: { auto: true }, share: { range: [0, 1] } },
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); },
      series: [
        { label: "Time (UTC)" },
        { label: "Freshness lag", scale: "hours", stroke: "#2458d6", width: 2,
          value: unit(" h", 1), points: { show: series.t.length < 60 } },
        { label: "SLA", scale: "hours", stroke: "#c0362c", width: 1, dash: [6, 4],
          value: unit(" h", 1), points: { show: false } },
        { label: "Coverage", scale: "share", stroke: "#1d7f4e", width: 2,
          value: unit("%", 100), points: { show: series.t.length < 60 } }
      ],
      axes: [
        { label: "Time (UTC)" },
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
