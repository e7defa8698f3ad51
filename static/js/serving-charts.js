// Small bar charts for the deployment page, drawn as plain SVG from the JSON stats (no library).
(function () {
  var el = document.getElementById("serving-stats");
  if (!el) return;
  var stats = JSON.parse(el.textContent);
  var NS = "http://www.w3.org/2000/svg";
  function bars(svg, labels, values, color) {
    var w = +svg.getAttribute("width"), h = +svg.getAttribute("height");
    var max = Math.max.apply(null, values.concat([1e-9]));
    var bw = w / Math.max(values.length, 1);
    values.forEach(function (v, i) {
      var r = document.createElementNS(NS, "rect");
      var bh = (h - 16) * v / max;
      r.setAttribute("x", i * bw + 1); r.setAttribute("y", h - 14 - bh);
      r.setAttribute("width", Math.max(bw - 2, 1)); r.setAttribute("height", bh);
      r.setAttribute("fill", color);
      var t = document.createElementNS(NS, "title"); t.textContent = labels[i] + ": " + v;
      r.appendChild(t); svg.appendChild(r);
    });
    var cap = document.createElementNS(NS, "text");
    cap.setAttribute("x", 2); cap.setAttribute("y", 10); cap.setAttribute("font-size", "10");
    cap.textContent = "max " + (Math.round(max * 1000) / 1000);
    svg.appendChild(cap);
  }
  function q(name) { return document.querySelector('svg[data-chart="' + name + '"]'); }
  bars(q("qps"), stats.qps.map(function (p) { return p.minutes_ago + " min ago"; }),
       stats.qps.map(function (p) { return p.qps; }), "#3b82f6");
  bars(q("latency"), stats.latency_histogram.map(function (b) { return "<= " + b.le; }),
       stats.latency_histogram.map(function (b) { return b.count; }), "#10b981");
  bars(q("errors"), stats.errors.map(function (p) { return p.minutes_ago + " min ago"; }),
       stats.errors.map(function (p) { return p.errors; }), "#ef4444");
  var mix = Object.keys(stats.version_mix);
  bars(q("mix"), mix.map(function (k) { return "v" + k; }),
       mix.map(function (k) { return stats.version_mix[k]; }), "#8b5cf6");
})();
