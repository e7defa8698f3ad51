// Live parts of the training pages: job list progress, a job's curves (drawn by the shared
// chart helper, static/js/charts.js, over uPlot), pipeline runs, copy buttons.
(function () {
  "use strict";
  function fmt(value, digits) { return value === null || value === undefined ? "–" : Number(value).toFixed(digits); }
  // Seconds in words, as the pages' `duration` filter writes them ("45 s", "3 h 12 min").
  function duration(value) {
    if (value === null || value === undefined || !isFinite(value)) return "–";
    const total = Math.round(Math.abs(value));
    if (total < 60) return `${total} s`;
    const minutes = Math.floor(total / 60);
    if (minutes < 60) return `${minutes} min`;
    const hours = Math.floor(minutes / 60), rest = minutes % 60;
    if (hours < 24) return rest ? `${hours} h ${rest} min` : `${hours} h`;
    const days = Math.floor(hours / 24), h = hours % 24;
    const d = `${days} day${days === 1 ? "" : "s"}`;
    return days >= 7 || !h ? d : `${d} ${h} h`;
  }
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
        set("eta_s", duration(job.eta_s)); set("auc", fmt(job.auc, 4));
      }
      setTimeout(tick, active ? 1500 : 10000);
    }
    setTimeout(tick, 1500);
  }

  // The job page's live curves: [chart name, series name in live.json, label, colour, units]
  // (the same as training.views.LIVE_CURVES, which draws the first frame).
  const LIVE_CURVES = [
    ["loss", "loss", "Training loss", "#2563eb", ""],
    ["auc", "holdout_auc", "Held-out AUC", "#059669", ""],
    ["rate", "samples_per_s", "Samples / s", "#d97706", "samples/s"],
    ["val", "val_logloss", "Validation logloss", "#7c3aed", ""],
  ];

  function drawCurves(series) {
    if (typeof window.rankopsChart === "undefined") return;
    for (const [chart, name, label, color, units] of LIVE_CURVES) {
      const el = document.querySelector(`[data-rankops-chart][data-chart="${chart}"]`);
      if (!el) continue;
      const points = series[name] || [];
      window.rankopsChart.update(el, points.length ? {
        x: points.map(p => p[0]),
        series: [{label, color, units, values: points.map(p => p[1])}],
      } : {x: [], series: []});
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
      document.querySelector('#job-numbers [data-field="eta_s"]').textContent = duration(job.eta_s);
      drawCurves(data.series);
      if (ACTIVE.includes(job.state)) setTimeout(tick, 1500);
      else if (running) window.location.reload();  // finished while open: show the evaluation
    }
    // The page drew the first frame; poll only while the job is active.
    if (!running) return;
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", tick);
    else tick();
  }

  // <button data-copy="ID">: copies the text of element ID (a run id, a tracking URI).
  function copyButtons() {
    for (const button of document.querySelectorAll("button[data-copy]")) {
      button.addEventListener("click", async () => {
        const source = document.getElementById(button.dataset.copy);
        if (!source || !navigator.clipboard) return;
        const label = button.textContent;
        try { await navigator.clipboard.writeText(source.textContent.trim()); button.textContent = "Copied"; }
        catch (e) { button.textContent = "Select and copy it"; }
        setTimeout(() => { button.textContent = label; }, 1500);
      });
    }
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", copyButtons);
  else copyButtons();

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
    // Only the latest request's answer is shown: the first load's can arrive after a change's.
    let latest = 0;
    async function show(apply) {
      const mine = ++latest;
      const picked = code ? code.value : "";
      const template = picked.startsWith("template:") ? picked.slice("template:".length) : "";
      const query = new URLSearchParams({template, dataset: dataset ? dataset.value : ""});
      let html;
      try {
        const r = await fetch(`${url}?${query}`, {credentials: "same-origin"});
        if (!r.ok) return;
        html = await r.text();
      } catch (e) { return; }
      if (mine !== latest) return;
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

  window.rankopsTraining = {pollJobs, liveJob, pollRuns, drawCurves, recommendResources};
})();
