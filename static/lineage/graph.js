// The interactive lineage graph: plain SVG, no library. Pan by dragging, zoom with the wheel or
// the +/- buttons, click a node to select it (details, links), expand upstream/downstream of the
// selected node, double-click to centre the page on a node.
(function () {
  "use strict";
  const NS = "http://www.w3.org/2000/svg";
  const W = 170, H = 40, GAP_X = 220, GAP_Y = 56;

  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (parent) parent.appendChild(node);
    return node;
  }

  function init(root) {
    const api = root.dataset.api, page = root.dataset.page;
    const svg = root.querySelector("svg");
    const detail = root.querySelector("[data-role=detail]");
    const status = root.querySelector("[data-role=status]");
    const view = el("g", {}, svg);
    const edgeLayer = el("g", {}, view), nodeLayer = el("g", {}, view);
    const nodes = new Map(), edges = new Map();
    let selected = root.dataset.root;
    let tx = 40, ty = 40, scale = 1;

    function apply() { view.setAttribute("transform", `translate(${tx},${ty}) scale(${scale})`); }

    function merge(data, baseLevel) {
      for (const n of data.nodes) {
        if (!nodes.has(n.key)) nodes.set(n.key, Object.assign({}, n, { level: baseLevel + n.level }));
      }
      for (const e of data.edges) edges.set(`${e.src}|${e.dst}|${e.type}`, e);
    }

    async function load(key, direction, depth, baseLevel) {
      status.textContent = "Loading…";
      const url = `${api}?node=${encodeURIComponent(key)}&direction=${direction}&depth=${depth}`;
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) { status.textContent = `Could not load (${response.status})`; return; }
      const data = await response.json();
      merge(data, baseLevel);
      status.textContent = `${nodes.size} nodes, ${edges.size} edges` + (data.truncated ? " (truncated)" : "");
      draw();
    }

    function positions() {
      const byLevel = new Map();
      for (const n of nodes.values()) {
        if (!byLevel.has(n.level)) byLevel.set(n.level, []);
        byLevel.get(n.level).push(n);
      }
      const pos = new Map();
      const min = Math.min(...byLevel.keys());
      for (const [level, list] of byLevel) {
        list.sort((a, b) => (a.kind + a.label).localeCompare(b.kind + b.label));
        list.forEach((n, i) => pos.set(n.key, { x: (level - min) * GAP_X, y: i * GAP_Y }));
      }
      return pos;
    }

    function draw() {
      const pos = positions();
      edgeLayer.replaceChildren();
      nodeLayer.replaceChildren();
      for (const e of edges.values()) {
        const a = pos.get(e.src), b = pos.get(e.dst);
        if (!a || !b) continue;
        const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
        el("path", { d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`,
          class: "lineage-edge" + (e.active ? "" : " ended"), "marker-end": "url(#arrow)" }, edgeLayer);
        const label = el("text", { x: mx, y: (y1 + y2) / 2 - 3, class: "lineage-edge-label", "text-anchor": "middle" }, edgeLayer);
        label.textContent = e.type.replace("_", " ");
      }
      for (const n of nodes.values()) {
        const p = pos.get(n.key);
        const cls = ["lineage-node"];
        if (n.key === root.dataset.root) cls.push("root");
        if (!n.live) cls.push("dead");
        if (n.key === selected) cls.push("selected");
        const g = el("g", { class: cls.join(" "), transform: `translate(${p.x},${p.y})`, "data-key": n.key, tabindex: "0", role: "button" }, nodeLayer);
        el("rect", { width: W, height: H }, g);
        el("text", { x: 8, y: 13, class: "kind" }, g).textContent = n.kind.replace("_", " ");
        el("text", { x: 8, y: 30 }, g).textContent = (n.label || n.object_id).slice(0, 26);
        g.addEventListener("click", (ev) => { ev.stopPropagation(); select(n.key); });
        g.addEventListener("dblclick", () => { window.location = `${page}?node=${encodeURIComponent(n.key)}`; });
        g.addEventListener("keydown", (ev) => { if (ev.key === "Enter") select(n.key); });
      }
    }

    function select(key) {
      selected = key;
      const n = nodes.get(key);
      detail.classList.add("open");
      detail.replaceChildren();
      const title = document.createElement("strong");
      title.textContent = `${n.kind} ${n.label || n.object_id}`;
      detail.appendChild(title);
      const meta = document.createElement("p");
      meta.textContent = `id ${n.object_id} · owner ${n.owner || "—"} · ${n.live ? "live" : "not live"}${n.status ? " · " + n.status : ""}`;
      detail.appendChild(meta);
      const open = document.createElement("a");
      open.href = `${page}?node=${encodeURIComponent(key)}`;
      open.textContent = "Open this node";
      open.dataset.testid = "open-node";
      detail.appendChild(open);
      if (n.url) {
        detail.appendChild(document.createTextNode(" · "));
        const page = document.createElement("a");
        page.href = n.url;
        page.textContent = `Open the ${n.kind.replace("_", " ")} page`;
        page.dataset.testid = "open-object";
        detail.appendChild(page);
      }
      draw();
    }

    function expand(direction) {
      const n = nodes.get(selected);
      if (!n) return;
      load(selected, direction, 1, n.level);
    }

    // Pan and zoom.
    let drag = null;
    svg.addEventListener("pointerdown", (ev) => {
      if (ev.target.closest(".lineage-node")) return;
      drag = { x: ev.clientX - tx, y: ev.clientY - ty };
      svg.classList.add("dragging");
      svg.setPointerCapture(ev.pointerId);
    });
    svg.addEventListener("pointermove", (ev) => {
      if (!drag) return;
      tx = ev.clientX - drag.x; ty = ev.clientY - drag.y; apply();
    });
    svg.addEventListener("pointerup", () => { drag = null; svg.classList.remove("dragging"); });
    function zoom(factor, cx, cy) {
      const next = Math.min(4, Math.max(0.15, scale * factor));
      tx = cx - (cx - tx) * (next / scale); ty = cy - (cy - ty) * (next / scale); scale = next; apply();
    }
    svg.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      const box = svg.getBoundingClientRect();
      zoom(ev.deltaY < 0 ? 1.15 : 1 / 1.15, ev.clientX - box.left, ev.clientY - box.top);
    }, { passive: false });
    function fit() {
      const box = nodeLayer.getBBox(), frame = svg.getBoundingClientRect();
      if (!box.width) return;
      scale = Math.min(2, (frame.width - 40) / (box.width + 20), (frame.height - 40) / (box.height + 20));
      tx = 20 - box.x * scale; ty = 20 - box.y * scale; apply();
    }
    root.addEventListener("click", (ev) => {
      const action = ev.target.dataset && ev.target.dataset.action;
      if (action === "expand-up") expand("upstream");
      else if (action === "expand-down") expand("downstream");
      else if (action === "zoom-in") zoom(1.25, svg.clientWidth / 2, svg.clientHeight / 2);
      else if (action === "zoom-out") zoom(0.8, svg.clientWidth / 2, svg.clientHeight / 2);
      else if (action === "fit") fit();
    });

    const defs = el("defs", {}, svg);
    const marker = el("marker", { id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto" }, defs);
    el("path", { d: "M0,0 L10,5 L0,10 z", fill: "#8c959f" }, marker);
    apply();
    load(root.dataset.root, "both", 2, 0).then(() => { fit(); root.dataset.ready = "1"; });
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll(".lineage-graph[data-api]").forEach(init);
  });
})();
