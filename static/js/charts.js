/* RankOps charts: one small helper over the vendored uPlot (js/uplot.iife.min.js) for every chart.

   Markup (templates/charts/_chart.html renders it):
     <figure data-rankops-chart data-series="ID" data-x-label="Time (UTC)" data-y-label="Requests / s"
             data-units="req/s" data-x-time="true" data-x-range="0,1" data-y-range="0,1">
       <figcaption>...</figcaption><div class="chart-plot"></div><p class="chart-empty">No data yet: ...</p>
     </figure>
     <script type="application/json" id="ID">{"x": [...], "series": [{"label": "p50", "values": [...]}]}</script>

   The data: "x" (epoch seconds when data-x-time, labelled in UTC; else numbers; category indices
   when "x_labels" names them, with optional shorter "x_ticks" under the axis), "series" (label, values, optional color, units, kind: line|step|bars|points, dash),
   optional "bands" ([{upper, lower, fill}], 1-based series indices, e.g. an interval around a line).
   Hovering shows each series' value with its units in uPlot's legend. With no points the server's
   empty-state text stays and nothing is drawn. rankopsChart.update(el, data) redraws live charts. */
(function () {
  "use strict";

  var PALETTE = ["#2563eb", "#d97706", "#059669", "#dc2626", "#7c3aed", "#6b7280"];
  var HEIGHT = 220;

  function fmtNumber(v) {
    if (v === null || v === undefined || isNaN(v)) return "–";
    var a = Math.abs(v);
    if (a !== 0 && (a < 0.001 || a >= 1e6)) return v.toExponential(2);
    return String(+v.toPrecision(4));
  }

  function withUnits(v, units) {
    var text = fmtNumber(v);
    if (text === "–" || !units) return text;
    return units === "%" ? text + "%" : text + " " + units;
  }

  function pad(n) { return n < 10 ? "0" + n : String(n); }

  function utcLabel(seconds) {
    var d = new Date(seconds * 1000);
    var months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    return d.getUTCDate() + " " + months[d.getUTCMonth()] + " " + d.getUTCFullYear() + ", " +
      pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds()) + " UTC";
  }

  // Tick labels in UTC, 24-hour: "14:05", with the day when the axis spans more than a day.
  function timeTick(seconds, span) {
    var d = new Date(seconds * 1000);
    var months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    var clock = pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes());
    if (span < 120) clock += ":" + pad(d.getUTCSeconds());
    return span > 86400 ? d.getUTCDate() + " " + months[d.getUTCMonth()] + " " + clock : clock;
  }

  function range(text) {
    if (!text) return undefined;
    var parts = text.split(",").map(Number);
    return parts.length === 2 && !isNaN(parts[0]) && !isNaN(parts[1]) ? parts : undefined;
  }

  function hasPoints(data) {
    return !!(data && data.x && data.x.length && data.series && data.series.length);
  }

  function options(el, data) {
    var ds = el.dataset;
    var xTime = ds.xTime === "true";
    var units = ds.units || "";
    var categories = data.x_labels || null;
    var many = data.x.length >= 40;
    var series = [{
      label: ds.xLabel || "x",
      value: function (u, v) {
        if (v === null || v === undefined) return "–";
        if (xTime) return utcLabel(v);
        if (categories) return categories[v] === undefined ? "–" : categories[v];
        return withUnits(v, ds.xUnits || "");
      }
    }];
    data.series.forEach(function (s, i) {
      var colour = s.color || PALETTE[i % PALETTE.length];
      var cfg = {
        label: s.label,
        stroke: colour,
        width: s.width === undefined ? 2 : s.width,
        spanGaps: true,
        value: (function (seriesUnits) {
          return function (u, v) { return withUnits(v, seriesUnits); };
        })(s.units === undefined ? units : s.units),
        points: { show: !many }
      };
      if (s.dash) cfg.dash = s.dash;
      if (s.kind === "bars") {
        cfg.paths = uPlot.paths.bars({ size: [0.7, 48] });
        cfg.fill = colour + "aa";
        cfg.points = { show: false };
      } else if (s.kind === "step") {
        cfg.paths = uPlot.paths.stepped({ align: 1 });
      } else if (s.kind === "points") {
        cfg.paths = function () { return null; };
        cfg.points = { show: true, size: 7, fill: colour };
      } else if (s.kind === "edge") {  // the edge of a band: drawn thin, no points
        cfg.width = 1;
        cfg.points = { show: false };
      }
      series.push(cfg);
    });
    // A time axis spans at least two minutes, so that a few close points (or one) still get
    // readable ticks instead of a range of milliseconds or of years.
    var xScale = { time: xTime };
    if (xTime) {
      xScale.range = function (u, min, max) {
        return max - min < 120 ? [(min + max) / 2 - 60, (min + max) / 2 + 60] : [min, max];
      };
    }
    if (categories) {
      xScale = { time: false, range: [-0.5, categories.length - 0.5] };
    } else if (range(ds.xRange)) {
      xScale.range = range(ds.xRange);
    }
    var yScale = { auto: true };
    if (range(ds.yRange)) yScale = { range: range(ds.yRange) };
    var xAxis = { label: ds.xLabel || "", labelSize: 20 };
    if (categories) {
      var ticks = data.x_ticks || categories;
      xAxis.splits = function () { return categories.map(function (_, i) { return i; }); };
      xAxis.values = function (u, splits) { return splits.map(function (i) { return ticks[i]; }); };
      xAxis.grid = { show: false };
    } else if (xTime) {
      xAxis.values = function (u, splits) {
        var span = splits.length > 1 ? splits[splits.length - 1] - splits[0] : 0;
        return splits.map(function (t) { return timeTick(t, span); });
      };
    } else {
      xAxis.values = function (u, splits) { return splits.map(fmtNumber); };
    }
    var opts = {
      width: Math.max(el.clientWidth || 0, 280),
      height: HEIGHT,
      series: series,
      scales: { x: xScale, y: yScale },
      axes: [
        xAxis,
        {
          label: ds.yLabel || "",
          labelSize: 20,
          size: 56,
          values: function (u, splits) {
            return splits.map(function (v) { return units === "%" ? fmtNumber(v) + "%" : fmtNumber(v); });
          }
        }
      ],
      legend: { live: true },
      cursor: { drag: { x: !categories, y: false } }
    };
    if (xTime) opts.tzDate = function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); };
    if (data.bands) {
      opts.bands = data.bands.map(function (b) {
        return { series: [b.upper, b.lower], fill: b.fill || "rgba(37, 99, 235, 0.12)" };
      });
    }
    return opts;
  }

  function columns(data) {
    return [data.x].concat(data.series.map(function (s) { return s.values; }));
  }

  function draw(el, data) {
    var plot = el.querySelector(".chart-plot") || el;
    var empty = el.querySelector(".chart-empty");
    if (el._rankopsChart) { el._rankopsChart.destroy(); el._rankopsChart = null; }
    if (!hasPoints(data) || typeof uPlot === "undefined") {
      if (empty) empty.hidden = false;
      el.dataset.drawn = "false";
      return null;
    }
    if (empty) empty.hidden = true;
    var chart = new uPlot(options(el, data), columns(data), plot);
    el._rankopsChart = chart;
    el._rankopsSeries = data.series.length;
    el.dataset.drawn = "true";
    return chart;
  }

  function update(el, data) {
    var chart = el._rankopsChart;
    if (chart && hasPoints(data) && el._rankopsSeries === data.series.length) {
      chart.setData(columns(data));
      return chart;
    }
    return draw(el, data);
  }

  function rankopsChart(el, data) {
    if (!el) return null;
    if (data === undefined) {
      var source = document.getElementById(el.dataset.series);
      data = source ? JSON.parse(source.textContent) : null;
    }
    return draw(el, data);
  }

  function drawAll() {
    document.querySelectorAll("[data-rankops-chart]").forEach(function (el) { rankopsChart(el); });
  }

  var resizeTimer = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () {
      document.querySelectorAll("[data-rankops-chart]").forEach(function (el) {
        if (el._rankopsChart) {
          el._rankopsChart.setSize({ width: Math.max(el.clientWidth || 0, 280), height: HEIGHT });
        }
      });
    }, 150);
  });

  rankopsChart.update = update;
  rankopsChart.drawAll = drawAll;
  rankopsChart.format = withUnits;
  window.rankopsChart = rankopsChart;

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", drawAll);
  } else {
    drawAll();
  }
})();
