// The lineage graph page: cytoscape.js draws the neighbourhood the server embedded
// (#lineage-data), laid out left to right by dagre with one column per kind (feature groups,
// datasets, jobs, model versions, deployments, experiments). Click a node for its details and
// page, double-click to centre the page on it, expand upstream/downstream through the lineage
// API. The search box asks the suggest endpoint for names as you type.
(function () {
  "use strict";
  const COLUMN_GAP = 215;
  const NODE_W = 165, NODE_H = 48, ROW_GAP = 18;
  const COLOURS = ["#1a7f37", "#0969da", "#8250df", "#bf3989", "#bc4c00", "#9a6700"];
  const EDGE_LABELS_UP_TO = 40;

  function readJson(id) {
    const script = document.getElementById(id);
    return script ? JSON.parse(script.textContent) : null;
  }

  function initSearch(form) {
    const input = form.querySelector("input[name=q]");
    const kind = form.querySelector("select[name=kind]");
    const list = document.getElementById(input.getAttribute("list"));
    let timer = null, asked = "";
    input.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(async () => {  // debounce keystrokes, not a synchronisation
        const q = input.value.trim();
        if (!q || q === asked) return;
        asked = q;
        const params = new URLSearchParams({ q });
        if (kind && kind.value) params.set("kind", kind.value);
        const response = await fetch(`${form.dataset.suggest}?${params}`, {
          credentials: "same-origin", headers: { Accept: "application/json" },
        });
        if (!response.ok) return;
        const body = await response.json();
        list.replaceChildren(...body.results.map((r) => {
          const option = document.createElement("option");
          option.value = r.name;
          option.textContent = r.kind_name;
          return option;
        }));
      }, 150);
    });
    // Keep the address readable: no empty "&kind=" when any kind will do.
    form.addEventListener("submit", () => { if (kind && !kind.value) kind.disabled = true; });
    window.addEventListener("pageshow", () => { if (kind) kind.disabled = false; });
  }

  function initGraph(root) {
    const ranks = readJson("lineage-kind-ranks") || {};
    const rankOf = (kind) => (kind in ranks ? ranks[kind] : 2);
    const api = root.dataset.api, page = root.dataset.page;
    const detail = root.querySelector("[data-role=detail]");
    const status = root.querySelector("[data-role=status]");
    const cy = cytoscape({
      container: root.querySelector("[data-role=canvas]"),
      minZoom: 0.15,
      maxZoom: 3,
      wheelSensitivity: 0.3,
      boxSelectionEnabled: false,
      autoungrabify: true,
      style: [
        {
          selector: "node",
          style: {
            shape: "round-rectangle",
            width: NODE_W,
            height: NODE_H,
            "background-color": "#ffffff",
            "border-width": 1.5,
            "border-color": "data(colour)",
            label: "data(display)",
            "text-wrap": "wrap",
            "text-max-width": NODE_W - 14,
            "text-valign": "center",
            "text-halign": "center",
            "font-size": 12,
            color: "#24292f",
          },
        },
        { selector: "node.root", style: { "border-width": 3.5 } },
        { selector: "node.dead", style: { "border-style": "dashed", "background-color": "#f6f8fa" } },
        { selector: "node:selected", style: { "background-color": "#ddf4ff" } },
        {
          selector: "edge",
          style: {
            width: 1.3,
            "line-color": "#8c959f",
            "target-arrow-color": "#8c959f",
            "target-arrow-shape": "triangle",
            "arrow-scale": 0.8,
            "curve-style": "bezier",
          },
        },
        { selector: "edge.same-column", style: { "curve-style": "unbundled-bezier", "control-point-distances": 70 } },
        { selector: "edge.ended", style: { "line-style": "dashed", opacity: 0.5 } },
        {
          selector: "edge.labelled",
          style: {
            label: "data(type)",
            "font-size": 9,
            color: "#57606a",
            "text-rotation": "autorotate",
            "text-background-color": "#fbfcfd",
            "text-background-opacity": 1,
            "text-background-padding": 2,
          },
        },
      ],
    });
    root.cy = cy;  // for the browser tests and the console
    let selected = null;

    function pageOf(n) {
      if (n.page) return n.page;
      const params = n.label ? { kind: n.kind, q: n.label } : { node: n.key };
      return `${page}?${new URLSearchParams(params)}`;
    }

    function merge(graph) {
      cy.batch(() => {
        for (const n of graph.nodes) {
          if (cy.getElementById(n.key).nonempty()) continue;
          const rank = rankOf(n.kind);
          const kindName = n.kind_name || n.kind.replace(/_/g, " ");
          cy.add({
            group: "nodes",
            data: Object.assign({}, n, {
              id: n.key,
              rank,
              colour: COLOURS[rank] || "#57606a",
              display: `${kindName.toUpperCase()}\n${(n.label || n.object_id).slice(0, 24)}`,
            }),
            classes: [n.key === root.dataset.root ? "root" : "", n.live ? "" : "dead"].join(" "),
          });
        }
        for (const e of graph.edges) {
          const id = `${e.src}|${e.dst}|${e.type}`;
          if (cy.getElementById(id).nonempty()) continue;
          if (cy.getElementById(e.src).empty() || cy.getElementById(e.dst).empty()) continue;
          const same = rankOf(cy.getElementById(e.src).data("kind")) === rankOf(cy.getElementById(e.dst).data("kind"));
          cy.add({
            group: "edges",
            data: { id, source: e.src, target: e.dst, type: e.type.replace(/_/g, " "), active: e.active },
            classes: [e.active ? "" : "ended", same ? "same-column" : ""].join(" "),
          });
        }
        cy.edges().toggleClass("labelled", cy.edges().length <= EDGE_LABELS_UP_TO);
      });
      status.textContent = `${cy.nodes().length} objects, ${cy.edges().length} links` + (graph.truncated ? " (truncated)" : "");
    }

    // Dagre orders the nodes of each rank to keep edges apart; an edge asks for as many ranks as
    // its kinds' columns are apart, so the ranks are the kind columns. Nodes of one kind linked
    // to each other (a dataset derived from another) or a link against the flow would still
    // shift a node a rank, so the x is then set from the kind and each column re-spaced, in
    // dagre's vertical order, so that nothing overlaps.
    function layout() {
      return new Promise((resolve) => {
        const run = cy.layout({
          name: "dagre",
          rankDir: "LR",
          nodeSep: ROW_GAP,
          rankSep: COLUMN_GAP - NODE_W,
          minLen: (edge) => Math.max(1, edge.target().data("rank") - edge.source().data("rank")),
          edgeWeight: (edge) => (edge.target().data("rank") > edge.source().data("rank") ? 2 : 1),
          fit: false,
          animate: false,
        });
        run.one("layoutstop", () => {
          const columns = new Map();
          cy.nodes().forEach((n) => {
            const rank = n.data("rank");
            if (!columns.has(rank)) columns.set(rank, []);
            columns.get(rank).push(n);
          });
          cy.batch(() => {
            for (const [rank, list] of columns) {
              list.sort((a, b) => a.position("y") - b.position("y"));
              let last = -Infinity;
              for (const n of list) {
                const y = Math.max(n.position("y"), last + NODE_H + ROW_GAP);
                n.position({ x: rank * COLUMN_GAP, y });
                last = y;
              }
            }
          });
          cy.fit(undefined, 30);
          resolve();
        });
        run.run();
      });
    }

    function select(node) {
      selected = node;
      cy.elements().unselect();
      node.select();
      const n = node.data();
      detail.classList.add("open");
      detail.replaceChildren();
      const title = document.createElement("strong");
      title.textContent = `${n.kind_name || n.kind.replace(/_/g, " ")} ${n.label || n.object_id}`;
      const meta = document.createElement("p");
      meta.textContent = `owner ${n.owner || "—"} · ${n.live ? "live" : "not live"}${n.status ? " · " + n.status : ""}`;
      detail.append(title, meta);
      if (n.url) {
        const open = document.createElement("a");
        open.href = n.url;
        open.textContent = `Open the ${(n.kind_name || n.kind).replace(/_/g, " ")} page`;
        open.dataset.testid = "open-object";
        detail.append(open, document.createElement("br"));
      }
      const centre = document.createElement("a");
      centre.href = pageOf(n);
      centre.textContent = "Centre the graph here (and see its cost)";
      centre.dataset.testid = "open-node";
      detail.append(centre);
    }

    async function expand(direction) {
      if (!selected) { status.textContent = "Select a node first."; return; }
      status.textContent = "Loading…";
      const params = new URLSearchParams({ node: selected.id(), direction, depth: "1" });
      const response = await fetch(`${api}?${params}`, {
        credentials: "same-origin", headers: { Accept: "application/json" },
      });
      if (!response.ok) { status.textContent = `Could not load (${response.status})`; return; }
      merge(await response.json());
      await layout();
    }

    cy.on("tap", "node", (ev) => select(ev.target));
    cy.on("dbltap", "node", (ev) => { window.location = pageOf(ev.target.data()); });
    root.addEventListener("click", (ev) => {
      const action = ev.target.dataset && ev.target.dataset.action;
      const centre = { x: cy.width() / 2, y: cy.height() / 2 };
      if (action === "expand-up") expand("upstream");
      else if (action === "expand-down") expand("downstream");
      else if (action === "zoom-in") cy.zoom({ level: cy.zoom() * 1.25, renderedPosition: centre });
      else if (action === "zoom-out") cy.zoom({ level: cy.zoom() * 0.8, renderedPosition: centre });
      else if (action === "fit") cy.fit(undefined, 30);
    });

    merge(readJson("lineage-data") || { nodes: [], edges: [] });
    const start = cy.getElementById(root.dataset.root);
    layout().then(() => {
      if (start.nonempty()) select(start);
      root.dataset.ready = "1";
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("form.lineage-search[data-suggest]").forEach(initSearch);
    if (typeof cytoscape === "undefined") return;
    document.querySelectorAll(".lineage-graph[data-api]").forEach(initGraph);
  });
})();
