/* Tuning pages: the trials table sorts by a column (click its heading; again to reverse; the
   order is kept in the URL's #sort= across the page's refreshes), the page refreshes while the
   tuning job runs, and the Tune form swaps in the picked template's default search space
   unless the space was edited. */
var rankopsTuning = (function () {
  "use strict";

  function sortable(table) {
    if (!table) return;
    var body = table.tBodies[0];
    var heads = table.querySelectorAll("th[data-sort]");

    function key(row, name) {
      var raw = row.dataset[name];
      if (raw === undefined || raw === "") return null;
      var number = Number(raw);
      return isNaN(number) ? raw : number;
    }

    function apply(name, descending) {
      var rows = Array.prototype.slice.call(body.rows).filter(function (r) { return r.dataset.trial !== undefined; });
      rows.sort(function (a, b) {
        var x = key(a, name), y = key(b, name);
        if (x === null && y === null) return Number(a.dataset.number) - Number(b.dataset.number);
        if (x === null) return 1;  // no value: last, whichever way
        if (y === null) return -1;
        var order = x < y ? -1 : x > y ? 1 : Number(a.dataset.number) - Number(b.dataset.number);
        return descending ? -order : order;
      });
      rows.forEach(function (r) { body.appendChild(r); });
      heads.forEach(function (h) {
        h.setAttribute("aria-sort", h.dataset.sort === name ? (descending ? "descending" : "ascending") : "none");
      });
      history.replaceState(null, "", "#sort=" + name + (descending ? "-desc" : ""));
    }

    heads.forEach(function (head) {
      head.querySelector("button").addEventListener("click", function () {
        var descending = head.getAttribute("aria-sort") === "ascending";
        apply(head.dataset.sort, descending);
      });
    });
    var saved = /#sort=(\w+?)(-desc)?$/.exec(location.hash);
    if (saved && table.querySelector('th[data-sort="' + saved[1] + '"]')) apply(saved[1], !!saved[2]);
  }

  function refreshWhileRunning(marker, seconds) {
    if (!marker || marker.dataset.running !== "true") return;
    setTimeout(function () { location.reload(); }, (seconds || 5) * 1000);
  }

  function followTemplate(form, defaults) {
    if (!form) return;
    var select = form.querySelector("select[name=template]");
    var space = form.querySelector("textarea[name=space]");
    if (!select || !space) return;
    var shown = select.value;
    select.addEventListener("change", function () {
      var previous = JSON.stringify(defaults[shown] || {});
      var current = space.value.trim();
      var untouched = !current || current === previous;
      try { untouched = untouched || JSON.stringify(JSON.parse(current)) === previous; } catch (e) { /* edited */ }
      if (untouched) space.value = JSON.stringify(defaults[select.value] || {});
      shown = select.value;
    });
  }

  return {sortable: sortable, refreshWhileRunning: refreshWhileRunning, followTemplate: followTemplate};
})();
