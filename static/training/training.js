// Live parts of the training pages: job list progress, a job's curves, pipeline runs.
// Plain DOM and SVG, no dependencies.
(function () {
  "use strict";
  function fmt(value, digits) { return value === null || value === undefined ? "–" : Number(value).toFixed(digits); }
  async function getJSON(url) { const r = await fetch(url, {credentials: "same-origin"}); return r.json(); }
  const ACTIVE = ["pending", "admitted", "placed", "running"];

  function pollJobs(table) {
    if (!table) return;
    async function tick() {
      let data;
      try { data = await getJSON(table.dataset.url); } catch (e) { return setTimeout(tick, 5000); }
      let active = false;
      for (const job of data.jobs) {
        const row = table.querySelector(`tr[data-job="${job.id}"]`);
        if (!row) continue;
        active = active || ACTIVE.includes(job.state);
        const set = (f, v) => { const el = row.querySelector(`[data-field="${f}"]`); if (el) el.textContent = v; };
        set("state", job.state);
        const state = row.querySelector('[data-field="state"]'); if (state) state.className = `job-state job-${job.state}`;
        row.querySelector('[data-field="progress"]').style.width = `${Math.round(job.progress * 100)}%`;
        set("steps", `${job.step}/${job.total_steps}`);
        set("loss", fmt(job.loss, 4)); set("samples_per_s", fmt(job.samples_per_s, 0));
        set("eta_s", job.eta_s === null ? "–" : `${fmt(job.eta_s, 0)} s`); set("auc", fmt(job.auc, 4));
      }
      setTimeout(tick, active ? 1500 : 10000);
    }
    setTimeout(tick, 1500);
  }

  function drawSeries(svg, points) {
    if (!svg) return;
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const ns = "http://www.w3.org/2000/svg";
    const w = svg.width.baseVal.value, h = svg.height.baseVal.value, pad = 34;
    if (!points || points.length === 0) {
      const t = document.createElementNS(ns, "text"); t.setAttribute("x", 10); t.setAttribute("y", 20);
      t.setAttribute("class", "axis"); t.textContent = "no data yet"; svg.appendChild(t); return;
    }
    const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
    const x0 = Math.min(...xs), x1 = Math.max(...xs) || 1, y0 = Math.min(...ys), y1 = Math.max(...ys);
    const sx = x => pad + (x1 === x0 ? 0.5 : (x - x0) / (x1 - x0)) * (w - pad - 8);
    const sy = y => h - 18 - (y1 === y0 ? 0.5 : (y - y0) / (y1 - y0)) * (h - 30);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", points.map(p => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" "));
    svg.appendChild(line);
    for (const [text, x, y] of [[fmt(y1, 4), 2, 12], [fmt(y0, 4), 2, h - 20], [`step ${x1}`, w - 70, h - 4]]) {
      const t = document.createElementNS(ns, "text"); t.setAttribute("x", x); t.setAttribute("y", y);
      t.setAttribute("class", "axis"); t.textContent = text; svg.appendChild(t);
    }
  }

  function liveJob(url, running) {
    async function tick() {
      let data;
      try { data = await getJSON(url); } catch (e) { return setTimeout(tick, 5000); }
      const job = data.job;
      document.getElementById("job-progress").style.width = `${Math.round(job.progress * 100)}%`;
      const state = document.getElementById("job-state"); state.textContent = job.state; state.className = `job-state job-${job.state}`;
      for (const f of ["step", "total_steps", "epoch"]) { const el = document.querySelector(`#job-numbers [data-field="${f}"]`); if (el) el.textContent = job[f]; }
      document.querySelector('#job-numbers [data-field="loss"]').textContent = fmt(job.loss, 4);
      document.querySelector('#job-numbers [data-field="samples_per_s"]').textContent = fmt(job.samples_per_s, 0);
      document.querySelector('#job-numbers [data-field="eta_s"]').textContent = fmt(job.eta_s, 0);
      drawSeries(document.getElementById("chart-loss"), data.series.loss);
      drawSeries(document.getElementById("chart-auc"), data.series.holdout_auc);
      drawSeries(document.getElementById("chart-rate"), data.series.samples_per_s);
      if (ACTIVE.includes(job.state)) setTimeout(tick, 1500);
      else if (running) window.location.reload();  // finished while open: show the evaluation
    }
    tick();
  }

  function pollRuns(table) {
    if (!table) return;
    async function tick() {
      let data;
      try { data = await getJSON(table.dataset.url); } catch (e) { return setTimeout(tick, 5000); }
      let active = false;
      for (const run of data.runs) {
        active = active || run.state === "running";
        const row = table.querySelector(`tr[data-run="${run.id}"]`); if (!row) continue;
        const state = row.querySelector(".job-state"); state.textContent = run.state; state.className = `job-state job-${run.state}`;
        const chips = row.querySelectorAll(".stage-chip");
        run.stages.forEach((s, i) => { if (chips[i]) { chips[i].className = `stage-chip job-${s.state}`; chips[i].title = s.error || s.state; } });
      }
      setTimeout(tick, active ? 2000 : 10000);
    }
    setTimeout(tick, 2000);
  }

  // The new-job form: show the scheduler's resource recommendation for the picked template and
  // dataset (the scheduler's own HTML fragment) and, when the user changes either, copy its
  // values into the resource fields. On first load the server has already prefilled them.
  function recommendResources(form) {
    if (!form) return;
    const slot = form.querySelector("#recommendation");
    // Not form.dataset: a form's named controls shadow its properties, and one is "dataset".
    const url = form.getAttribute("data-recommendation-url");
    const code = form.elements.namedItem("code"), dataset = form.elements.namedItem("dataset");
    async function show(apply) {
      const picked = code ? code.value : "";
      const template = picked.startsWith("template:") ? picked.slice("template:".length) : "";
      const query = new URLSearchParams({template, dataset: dataset ? dataset.value : ""});
      let html;
      try {
        const r = await fetch(`${url}?${query}`, {credentials: "same-origin"});
        if (!r.ok) return;
        html = await r.text();
      } catch (e) { return; }
      slot.innerHTML = html;
      if (!apply) return;
      for (const el of slot.querySelectorAll("[data-field][data-value]")) {
        const input = form.elements.namedItem(el.dataset.field);
        if (input) input.value = el.dataset.value;
      }
    }
    for (const el of [code, dataset]) if (el) el.addEventListener("change", () => show(true));
    show(false);
  }

  window.rankopsTraining = {pollJobs, liveJob, pollRuns, drawSeries, recommendResources};
})();
