"""The status page: one HTML document with its CSS and JavaScript inline.

:func:`render` returns the page cluster.console.httpd serves at ``/``.  Nothing comes from
another origin (the server's Content-Security-Policy forbids it too).  The script polls
``api/status`` (relative to the page: it works behind a proxy under a path prefix) every
:data:`POLL_SECONDS` seconds and draws four sections from the snapshot
(cluster.console.status's schema): the running runs, the queues, the nodes (above them,
when a provisioner runs, its last look: "from Slurm: wanted W, pending P, running R", its
jobs, its trouble) and the recent runs; clicking a run id opens the per-run view
(``#run=<id>``, from ``/api/runs/<id>``): which node ran which tests, and which failed.
Every value from the home is put into the page as text (``textContent``), never as HTML.

Hooks for scripts and tests (stable; keep them when restyling):

* ``body[data-polls]`` counts the snapshots drawn, ``body[data-state]`` is ``loading``,
  ``ok`` or ``error`` (the service did not answer: ``#conn`` says why);
* ``#running .run[data-run=<id>]``, inside it ``[data-field=done|total|running|left|rate|
  eta|elapsed|nodes]`` (the numbers as text) and ``.run-node[data-node=<name>]``;
* ``#queues tr.queued[data-priority=<p>][data-run=<id>]``;
* ``#nodes tr.node[data-node=<name>][data-state=up|down|disabled]``, its
  ``[data-field=state|last-heard|run|done|errors|timeouts|status|caps]`` cells, and in its
  name's cell ``[data-field=batch-job]`` ("Slurm job 42") for a node a batch job runs;
* ``#provision[data-state=ok|trouble|stale|error]`` (hidden when the home has no
  ``provision.json``: no provisioner), its ``[data-field=summary|trouble|pilots|stale|error]``
  and its ``li.provision-job[data-job=<id>][data-state=<state>]``;
* ``#recent tr.recent[data-run=<id>]``, its ``a.link-report``, ``a.link-tab``,
  ``a.link-bmpcmp``, ``a.link-junit`` and ``a.link-json``;
* ``#detail[data-run=<id>][data-state=queued|running|finished]``, its
  ``.detail-node[data-node=<name>]`` (``[data-field=count]``) and ``tr.failed``; a sweep
  run's ``#sweep-failed`` (``[data-field=not-ok]``) and its ``tr.sweep-failed[data-seq=<n>]``
  (``[data-task=<id>]`` while the run is served: the tries name no parameters).
"""

from __future__ import annotations

#: How often the page asks for a new snapshot [seconds].
POLL_SECONDS = 2.0
#: Tests listed per node, and failed tests listed, in the per-run view (the rest counted).
DETAIL_LIMIT = 500
#: The provisioner's batch jobs the page lists (the rest counted).
PROVISION_JOBS = 200

_STYLE = """
:root { --fg:#1d2330; --muted:#687083; --line:#dde1e8; --bg:#f6f7f9; --card:#fff;
        --ok:#1f8a4c; --bad:#c0392b; --warn:#b7791f; --accent:#2d5fd0; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif;
       color:var(--fg); background:var(--bg); }
header { display:flex; align-items:baseline; gap:1em; padding:.7em 1.2em;
         background:#1d2330; color:#fff; }
header h1 { font-size:1.15em; margin:0; font-weight:600; }
header .sub { color:#aeb6c6; font-size:.9em; }
#conn { margin-left:auto; font-size:.85em; padding:.1em .6em; border-radius:1em; }
#conn.ok { background:#24573a; } #conn.error { background:var(--bad); }
main { padding:1em 1.2em; display:grid; gap:1em; grid-template-columns: 1fr; }
section { background:var(--card); border:1px solid var(--line); border-radius:6px;
          padding:.6em 1em 1em; min-width:0; }
section h2 { font-size:1em; margin:.2em 0 .6em; display:flex; gap:.6em;
             align-items:baseline; }
section h2 .count { color:var(--muted); font-weight:normal; font-size:.9em; }
table { border-collapse:collapse; width:100%; }
th, td { text-align:left; padding:.25em .6em .25em 0; border-bottom:1px solid var(--line);
         vertical-align:top; }
th { color:var(--muted); font-weight:600; font-size:.85em; white-space:nowrap; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
td.wrap { max-width:28em; overflow-wrap:anywhere; }
td.caps { color:var(--muted); font-size:.8em; max-width:36em; }
.empty { color:var(--muted); font-style:italic; }
.small { font-size:.82em; font-weight:normal; }
.muted { color:var(--muted); }
a { color:var(--accent); text-decoration:none; } a:hover { text-decoration:underline; }
.nowrap, .run-link { white-space:nowrap; }
code, .mono { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size:.92em; }
.run { border:1px solid var(--line); border-radius:6px; padding:.6em .8em; margin:.4em 0; }
.run-head { display:flex; gap:.8em; flex-wrap:wrap; align-items:baseline; }
.run-head .what { color:var(--muted); }
.badge { display:inline-block; padding:0 .5em; border-radius:.8em; font-size:.8em;
         background:#e8ecf4; color:#334; }
.badge.p0 { background:#e3f0ff; } .badge.p1 { background:#eaf7ee; }
.badge.p2 { background:#fbf1e3; }
.bar { height:12px; background:#e9ecf1; border-radius:6px; overflow:hidden; display:flex;
       margin:.5em 0; }
.bar .done { background:var(--ok); } .bar .active { background:#7fc79b; }
.figures { display:flex; flex-wrap:wrap; gap:.3em 1.6em; margin:0; }
.figures div { display:flex; flex-direction:column; }
.figures dt { color:var(--muted); font-size:.8em; }
.figures dd { margin:0; font-weight:600; font-variant-numeric:tabular-nums; }
.run-nodes { display:flex; flex-wrap:wrap; gap:.4em; margin-top:.5em; }
.run-node { border:1px solid var(--line); border-radius:4px; padding:0 .5em; font-size:.85em; }
.note { color:var(--warn); margin-top:.4em; } .note.bad { color:var(--bad); }
#provision { margin:0 0 .8em; } #provision[hidden] { display:none; }
#provision .summary { font-weight:600; }
.provision-jobs { display:flex; flex-wrap:wrap; gap:.3em 1.2em; margin:.3em 0 0;
                  padding:0; list-style:none; font-size:.9em; }
.provision-job[data-state=pending] { color:var(--warn); }
tr.node[data-state=down] td[data-field=state] { color:var(--bad); font-weight:600; }
tr.node[data-state=disabled] td[data-field=state] { color:var(--warn); font-weight:600; }
tr.node[data-state=up] td[data-field=state] { color:var(--ok); }
tr.queued.running td { font-weight:600; }
.outcome-bad { color:var(--bad); font-weight:600; }
#detail[hidden] { display:none; }
#detail .close { margin-left:auto; font-weight:normal; font-size:.9em; }
.detail-grid { display:grid; grid-template-columns: repeat(auto-fit, minmax(22em, 1fr));
               gap:1em; }
details summary { cursor:pointer; }
pre.report { background:var(--bg); padding:.6em; overflow:auto; max-height:20em; }
"""

_BODY = """
<header>
  <h1>Regression cluster <span id="master" class="sub"></span></h1>
  <span id="updated" class="sub"></span>
  <span id="conn">connecting</span>
</header>
<main>
  <section id="detail" hidden>
    <h2>Run <span id="detail-id" class="mono"></span> <span id="detail-state" class="badge">
      </span><a class="close" id="detail-close" href="#">close</a></h2>
    <div id="detail-body"></div>
  </section>
  <section id="running">
    <h2>Running <span class="count" id="running-count"></span></h2>
    <div id="running-list"><p class="empty">No run is running.</p></div>
  </section>
  <section id="queues">
    <h2>Queues <span class="count" id="queue-count"></span></h2>
    <table><thead><tr><th>Priority</th><th>#</th><th>Run</th><th>Kind</th><th>Who</th>
      <th>Products</th><th>Options</th><th>Queued</th><th>State</th></tr></thead>
      <tbody id="queue-rows"></tbody></table>
  </section>
  <section id="nodes">
    <h2>Nodes <span class="count" id="node-count"></span></h2>
    <div id="provision" hidden></div>
    <table><thead><tr><th>Node</th><th>State</th><th>Last heard</th><th>Run</th>
      <th class="num">Done</th><th class="num">Failures</th><th class="num">Timeouts</th>
      <th>Status</th><th>Capabilities</th></tr></thead>
      <tbody id="node-rows"></tbody></table>
  </section>
  <section id="recent">
    <h2>Recent runs <span class="count" id="recent-count"></span></h2>
    <table><thead><tr><th>Ended</th><th>Run</th><th>What</th><th>Who</th><th>Took</th>
      <th class="num">Nodes</th><th class="num">Differences</th><th class="num">Errors</th>
      <th>Outcome</th><th>Files</th></tr></thead>
      <tbody id="recent-rows"></tbody></table>
  </section>
</main>
"""

_SCRIPT = """
"use strict";
const POLL_MS = __POLL_MS__;
const DETAIL_LIMIT = __DETAIL_LIMIT__;
const PROVISION_JOBS = __PROVISION_JOBS__;
const PRIORITY_NAMES = {0: "user", 1: "commits", 2: "auto"};
let polls = 0;
let snap = null;
let detailId = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("data-")) node.setAttribute(k, String(v));
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}
function td(text, attrs) { return el("td", Object.assign({text: text}, attrs || {})); }
function pad(n) { return String(n).padStart(2, "0"); }
function clock(epoch) {
  if (epoch === null || epoch === undefined) return "-";
  const d = new Date(epoch * 1000), now = new Date();
  const hms = pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  if (d.toDateString() === now.toDateString()) return hms;
  return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + hms;
}
function duration(s) {
  if (s === null || s === undefined || !isFinite(s)) return "-";
  s = Math.max(0, Math.round(s));
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + pad(s % 60) + " s";
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
  if (h < 48) return h + " h " + pad(m) + " min";
  return Math.floor(h / 24) + " d " + (h % 24) + " h";
}
function ago(epoch) {
  if (epoch === null || epoch === undefined || !snap) return "-";
  return duration(snap.now - epoch) + " ago";
}
function num(v) { return (v === null || v === undefined) ? "-" : String(v); }
/* Links and API calls are relative to the page, so it also works behind a reverse proxy
   that serves it under a path prefix (/cluster/). */
function safeLink(href) {
  return (typeof href === "string" && href.startsWith("/archive/")) ? "." + href : null;
}
function runLink(id) {
  return el("a", {href: "#run=" + encodeURIComponent(id), class: "run-link mono",
                  "data-run": id, text: id});
}
function fill(id, nodes, emptyText, columns) {
  const box = document.getElementById(id);
  box.replaceChildren(...nodes);
  if (!nodes.length) {
    box.append(columns ? el("tr", {}, el("td", {colspan: columns, class: "empty",
                                                text: emptyText}))
                       : el("p", {class: "empty", text: emptyText}));
  }
}

function drawRunning(runs) {
  document.getElementById("running-count").textContent = runs.length ? "(" + runs.length + ")" : "";
  fill("running-list", runs.map(drawRun), "No run is running.");
}
function drawRun(r) {
  const jobs = r.jobs || {};
  const total = jobs.total || 0, done = jobs.done || 0, active = jobs.running || 0;
  const pct = (x) => total ? (100 * x / total).toFixed(2) + "%" : "0%";
  const barDone = el("div", {class: "done"}), barActive = el("div", {class: "active"});
  barDone.style.width = pct(done);
  barActive.style.width = pct(Math.min(active, total - done));
  const nodeNames = Object.keys(r.nodes || {}).sort();
  const eta = (r.eta === null || r.eta === undefined) ? "unknown"
              : clock(r.eta) + " (in " + duration(r.eta - snap.now) + ")";
  const fig = (label, field, value) => el("div", {}, el("dt", {text: label}),
                                           el("dd", {"data-field": field, text: value}));
  const card = el("div", {class: "run", "data-run": r.run, "data-priority": r.priority,
                          "data-state": r.state || "running"},
    el("div", {class: "run-head"}, runLink(r.run),
       el("span", {class: "badge p" + r.priority, "data-lane": r.lane,
                   text: (r.lane_name || "priority " + r.priority) + " " + (r.kind || "")}),
       el("span", {class: "what", text: r.queue || ""}),
       el("span", {class: "products", text: (r.products || []).join(" ")}),
       r.state === "starting" ? el("span", {class: "badge", text: "building the job list"})
                              : null),
    el("div", {class: "bar", title: done + " of " + total + " done"}, barDone, barActive),
    el("dl", {class: "figures"},
       fig("done", "done", num(done)), fig("of", "total", num(total)),
       fig("running", "running", num(active)), fig("left", "left", num(jobs.left)),
       fig("results/s", "rate", r.rate === undefined ? "-" : Number(r.rate).toFixed(1)),
       fig("estimated end", "eta", eta),
       fig("elapsed", "elapsed", duration(r.elapsed)),
       fig("nodes", "nodes", String(nodeNames.length))),
    el("div", {class: "run-nodes"}, ...nodeNames.map((name) => {
      const n = r.nodes[name] || {};
      return el("span", {class: "run-node", "data-node": name,
                         title: (n.status || "") + (n.state ? " [" + n.state + "]" : "")},
                name + ": " + num(n.done) + " done, " + num(n.running) + " running"
                + (n.errors ? ", " + n.errors + " failed" : "")
                + (n.timeouts ? ", " + n.timeouts + " timed out" : "")
                + (n.moving ? ", leaving for " + n.moving : ""));
    })));
  if (r.run_options && r.run_options.length) {
    card.append(el("div", {class: "muted run-options",
                           text: "options: " + r.run_options.join(" ")}));
  }
  if (r.lost && r.lost.length) {
    card.append(el("div", {class: "note", text: "lost: " + r.lost.join(", ")}));
  }
  if (r.moves && r.moves.length) {
    card.append(el("div", {class: "note moves", "data-moves": String(r.moves.length)},
      "moves: ", ...r.moves.slice(-5).map((m) => el("div", {class: "move",
        text: clock(m.at) + " " + m.text}))));
  }
  if (r.waiting) card.append(el("div", {class: "note waiting", "data-waiting": r.waiting,
                                         text: "waiting: " + r.waiting}));
  if (r.stopping) card.append(el("div", {class: "note bad", text: "stopping: " + r.stopping}));
  else if (r.stop_requested) card.append(el("div", {class: "note bad",
                                                   text: "stop requested by " + r.stop_requested}));
  if (r.fatal) card.append(el("div", {class: "note bad", text: r.fatal}));
  if (r.status) card.append(el("div", {class: "muted status-line", text: r.status}));
  return card;
}

function drawQueues(queues) {
  const rows = [];
  let waiting = 0;
  for (const q of queues) {
    (q.runs || []).forEach((run, i) => {
      if (!run.running) waiting += 1;
      rows.push(el("tr", {class: "queued" + (run.running ? " running" : ""),
                          "data-priority": q.priority, "data-run": run.id || ""},
        td(q.priority + " " + (PRIORITY_NAMES[q.priority] || "")), td(String(i + 1)),
        el("td", {class: "wrap"}, run.id ? runLink(run.id) : null, " ",
           el("span", {class: "mono", text: run.line})),
        td(run.kind), td(run.who), td((run.products || []).join(" ")),
        td((run.run_options || []).join(" ") || "-", {class: "wrap mono run-options"}),
        td(run.queued ? clock(run.queued) + " (" + ago(run.queued) + ")" : "-",
           {class: "nowrap"}),
        td(run.running ? "running" : "waiting")));
    });
  }
  document.getElementById("queue-count").textContent = "(" + waiting + " waiting)";
  fill("queue-rows", rows, "No run is queued.", 9);
}

function nodeState(n) {
  if (n.disabled) return "disabled";
  if (n.down_since !== null && n.down_since !== undefined) return "down";
  if (n.last_heard === null || n.last_heard === undefined) return "down";
  return "up";
}
function drawNodes(nodes) {
  let up = 0, down = 0;
  const rows = nodes.map((n) => {
    const state = nodeState(n);
    if (state === "up") up += 1; else if (state === "down") down += 1;
    let stateText = state, stateNote = null;
    if (state === "down") stateText = n.down_since ? "down since " + clock(n.down_since)
                                                     + " (" + ago(n.down_since) + ")"
                                                   : "down (never heard)";
    if (state === "disabled") {
      stateNote = el("div", {class: "muted small",
                             text: String(n.disabled).replace(/^disabled /, "")
                                   + (n.disabled_reason ? ": " + n.disabled_reason : "")});
    }
    const job = n.batch_job;
    return el("tr", {class: "node", "data-node": n.name, "data-state": state},
      el("td", {class: "mono"}, n.name,
         job ? el("div", {class: "muted small", "data-field": "batch-job",
                          text: String(job.engine) + " job " + String(job.id)}) : null),
      el("td", {"data-field": "state"}, stateText, stateNote),
      td(n.last_heard ? clock(n.last_heard) + " (" + ago(n.last_heard) + ")" : "never",
         {"data-field": "last-heard", class: "nowrap"}),
      el("td", {"data-field": "run"}, n.run ? runLink(n.run) : "-"),
      td(num(n.done), {class: "num", "data-field": "done"}),
      td(num(n.errors), {class: "num", "data-field": "errors"}),
      td(num(n.timeouts), {class: "num", "data-field": "timeouts"}),
      td(n.status || "", {class: "wrap", "data-field": "status"}),
      td(n.caps || "", {class: "caps", "data-field": "caps"}));
  });
  document.getElementById("node-count").textContent =
    "(" + up + " up" + (down ? ", " + down + " down" : "") + " of " + nodes.length + ")";
  fill("node-rows", rows, "No node has reported yet.", 9);
}

/* The provisioner's last look (provision.json; none: no provisioner, nothing shown). */
function drawProvision(p) {
  const box = document.getElementById("provision");
  box.hidden = !p;
  if (!p) { box.replaceChildren(); return; }
  if (p.error) {
    box.dataset.state = "error";
    box.replaceChildren(el("div", {class: "note bad", "data-field": "error",
                                   text: "provisioner status file unusable: " + p.error}));
    return;
  }
  box.dataset.state = p.stale ? "stale" : (p.trouble ? "trouble" : "ok");
  const jobs = (p.jobs || []).slice(0, PROVISION_JOBS).map((j) =>
    el("li", {class: "provision-job mono", "data-job": j.job_id, "data-state": j.state,
              text: j.text}));
  const more = (p.jobs || []).length - jobs.length;
  if (more > 0) jobs.push(el("li", {class: "muted", text: "... and " + more + " more"}));
  box.replaceChildren(
    el("div", {class: "summary", "data-field": "summary", text: p.summary},
       el("span", {class: "muted small", text: "  (" + ago(p.written) + ")"})),
    p.stale_note ? el("div", {class: "note", "data-field": "stale", text: p.stale_note})
                 : null,
    p.trouble ? el("div", {class: "note bad", "data-field": "trouble",
                           text: "trouble: " + p.trouble}) : null,
    ...(p.pilot_notes || []).map((t) => el("div", {class: "note bad", "data-field": "pilots",
                                                   text: t})),
    jobs.length ? el("ul", {class: "provision-jobs"}, ...jobs) : null);
}

function link(href, text, cls) {
  const h = safeLink(href);
  return h ? el("a", {href: h, class: cls, text: text}) : null;
}
function drawRecent(recent) {
  const rows = recent.map((r) => {
    const links = r.links || {};
    const bad = r.outcome && r.outcome !== "done";
    return el("tr", {class: "recent", "data-run": r.run},
      td(clock(r.ended), {class: "nowrap"}), el("td", {}, runLink(r.run)),
      td(r.what, {class: "wrap mono"}), td(r.who), td(duration(r.elapsed)),
      td(num(r.nodes), {class: "num"}),
      td(num(r.differences) + (r.indeterminate ? " (+" + r.indeterminate +
         " indeterminate)" : ""), {class: "num", "data-indeterminate": num(r.indeterminate)}),
      td(num(r.errors), {class: "num"}),
      td(r.outcome || "", {class: bad ? "outcome-bad" : ""}),
      el("td", {}, link(links.report, "report", "link-report"), " ",
         link(links.tab, ".tab", "link-tab"), " ", link(links.bmpcmp, "bmpcmp", "link-bmpcmp"),
         " ", link(links.junit, "junit", "link-junit"), " ",
         link(links.json, "json", "link-json")));
  });
  document.getElementById("recent-count").textContent =
    recent.length ? "(newest " + recent.length + ")" : "";
  fill("recent-rows", rows, "No run has finished yet.", 10);
}

function draw(s) {
  snap = s;
  document.getElementById("master").textContent = s.master ? "on " + s.master : "";
  document.getElementById("updated").textContent = "updated " + clock(s.now);
  drawRunning(s.running || []);
  drawQueues(s.queues || []);
  drawProvision(s.provision || null);
  drawNodes(s.nodes || []);
  drawRecent(s.recent || []);
}

function setConn(ok, text) {
  const c = document.getElementById("conn");
  c.className = ok ? "ok" : "error";
  c.textContent = text;
  document.body.dataset.state = ok ? "ok" : "error";
}

async function getJSON(url) {
  const answer = await fetch(url, {cache: "no-store"});
  let body = null;
  try { body = await answer.json(); } catch (e) { body = null; }
  if (!answer.ok) throw new Error((body && body.error) || (url + ": HTTP " + answer.status));
  return body;
}

async function poll() {
  try {
    draw(await getJSON("api/status"));
    polls += 1;
    document.body.dataset.polls = String(polls);
    setConn(true, "live");
    if (detailId !== null) await loadDetail(false);
  } catch (e) {
    setConn(false, "status service: " + e.message);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

/* ---- the per-run view ---- */
function hashRun() {
  const m = /^#run=(.+)$/.exec(location.hash);
  return m ? decodeURIComponent(m[1]) : null;
}
async function loadDetail(fresh) {
  const box = document.getElementById("detail");
  const id = detailId;
  if (id === null) { box.hidden = true; return; }
  const current = box.dataset.state;
  if (!fresh && current === "finished" && box.dataset.run === id) return;  // it no longer changes
  box.hidden = false;
  document.getElementById("detail-id").textContent = id;
  if (fresh) fill("detail-body", [el("p", {class: "empty", text: "loading"})], "");
  try {
    const d = await getJSON("api/runs/" + encodeURIComponent(id));
    if (detailId !== id) return;
    drawDetail(d);
  } catch (e) {
    if (detailId !== id) return;
    box.dataset.run = id;
    box.dataset.state = "error";
    document.getElementById("detail-state").textContent = "error";
    fill("detail-body", [el("p", {class: "note bad", text: e.message})], "");
  }
}
function drawDetail(d) {
  const box = document.getElementById("detail");
  box.dataset.run = d.run;
  box.dataset.state = d.state;
  document.getElementById("detail-state").textContent = d.state + (d.ending ? " (ending)" : "");
  const info = d.info || {};
  const infoRows = Object.keys(info).map((k) => el("tr", {}, td(k, {class: "muted"}),
      td(Array.isArray(info[k]) ? info[k].join(" ") : String(info[k]), {class: "wrap mono"})));
  const counts = d.counts || {};
  const countText = Object.keys(counts).filter((k) => counts[k] !== null && counts[k] !== undefined)
                          .map((k) => k.replace("summary_", "") + " " + counts[k]).join(", ");
  const byNode = d.by_node || {};
  const nodeBlocks = Object.keys(byNode).sort().map((name) => {
    const tests = byNode[name] || [];
    const shown = tests.slice(0, DETAIL_LIMIT).map((t) => el("li", {class: "mono", text: t}));
    if (tests.length > DETAIL_LIMIT) {
      shown.push(el("li", {class: "muted",
                           text: "... and " + (tests.length - DETAIL_LIMIT) + " more"}));
    }
    return el("div", {class: "detail-node", "data-node": name},
      el("details", {}, el("summary", {}, el("b", {text: name}), ": ",
                           el("span", {"data-field": "count", text: String(tests.length)}),
                           " test(s)"),
         el("ul", {}, ...shown)));
  });
  const failed = d.failed || [];
  const failedRows = failed.slice(0, DETAIL_LIMIT).map((f) => el("tr",
      {class: "failed", "data-test": f.test},
      td(f.test, {class: "mono wrap"}), td(num(f.error), {class: "num"}), td(f.machine)));
  const parts = [
    el("p", {}, countText),
    el("div", {class: "detail-grid"},
       el("div", {}, el("h3", {text: "Description"}),
          el("table", {}, el("tbody", {}, ...infoRows))),
       el("div", {}, el("h3", {text: "Tests per node"}),
          nodeBlocks.length ? el("div", {}, ...nodeBlocks)
                            : el("p", {class: "empty", text: "no results yet"})),
       el("div", {}, el("h3", {text: "Failed tests (" + failed.length + ")"}),
          failed.length ? el("table", {}, el("thead", {}, el("tr", {}, el("th", {text: "test"}),
                                                  el("th", {class: "num", text: "error"}),
                                                  el("th", {text: "node"}))),
                             el("tbody", {}, ...failedRows))
                        : el("p", {class: "empty", text: "none"})))];
  if (failed.length > DETAIL_LIMIT) {
    parts.push(el("p", {class: "muted",
                        text: "... and " + (failed.length - DETAIL_LIMIT) + " more failed"}));
  }
  if (d.sweep) parts.push(drawSweep(d.sweep));
  if (d.confirm && d.confirm.length) {
    /* The changed tests run twice, each confirmed, indeterminate or unconfirmed. */
    parts.push(el("h3", {text: "Differences run twice (" + d.confirm.length + ")"}),
      el("table", {}, el("tbody", {}, ...d.confirm.map((v) => el("tr",
        {class: "confirm", "data-test": v.test, "data-kind": v.kind},
        td(v.test, {class: "mono wrap"}), td(v.kind), td(v.nodes.join(", ")),
        td(v.why || v.digests.join(" "), {class: "mono wrap"}))))));
  }
  const links = d.links || {};
  const fileLinks = [link(links.report, "report", "link-report"),
                     link(links.tab, ".tab", "link-tab"),
                     link(links.bmpcmp, "bmpcmp page", "link-bmpcmp"),
                     link(links.junit, "JUnit XML", "link-junit"),
                     link(links.json, "result JSON", "link-json")].filter((x) => x);
  if (fileLinks.length) parts.push(el("p", {}, "Files: ", ...fileLinks.flatMap((a) => [a, " "])));
  if (d.report_head && d.report_head.length) {
    parts.push(el("details", {}, el("summary", {text: "start of the report"}),
                  el("pre", {class: "report", text: d.report_head.join("\\n")})));
  }
  fill("detail-body", parts, "");
}
function drawSweep(sw) {
  const sets = sw.failed_sets || [];
  const rows = sets.map((f) => el("tr", Object.assign({class: "sweep-failed"},
        f.seq !== null && f.seq !== undefined ? {"data-seq": String(f.seq)} : {},
        f.task ? {"data-task": f.task} : {}),
      td(f.seq !== null && f.seq !== undefined ? "#" + f.seq : f.task, {class: "mono"}),
      td(Object.keys(f.params || {}).map((k) => k + "=" + f.params[k]).join(" "),
         {class: "mono wrap"}),
      td(f.status, {class: "wrap"}), td(f.host || "-")));
  const counts = ["ok", "invalid", "failed", "timeout"].map((k) => k + " " + num(sw[k]))
                   .join(", ");
  const box = el("div", {id: "sweep-failed"},
    el("h3", {}, "Failed parameter sets (",
       el("span", {"data-field": "not-ok", text: String(sw.not_ok)}), ")"),
    el("p", {class: "muted",
             text: (sw.tasks !== null ? num(sw.tasks) + " tasks: " : "tries so far: ")
                   + counts + " (from " + sw.source + ")"}));
  if (sw.note) box.appendChild(el("p", {class: "muted", text: sw.note}));
  box.appendChild(rows.length
    ? el("table", {}, el("thead", {}, el("tr", {}, el("th", {text: "task"}),
                                        el("th", {text: "parameters"}),
                                        el("th", {text: "status"}), el("th", {text: "node"}))),
         el("tbody", {}, ...rows))
    : el("p", {class: "empty", text: "none"}));
  if (sw.not_ok > sets.length) {
    box.appendChild(el("p", {class: "muted",
                             text: "... and " + (sw.not_ok - sets.length) + " more"}));
  }
  return box;
}
function openFromHash() {
  detailId = hashRun();
  if (detailId === null) { document.getElementById("detail").hidden = true; return; }
  loadDetail(true);
  document.getElementById("detail").scrollIntoView({block: "start"});
}
window.addEventListener("hashchange", openFromHash);
document.getElementById("detail-close").addEventListener("click", (e) => {
  e.preventDefault();
  history.replaceState(null, "", location.pathname);
  openFromHash();
});
document.body.dataset.state = "loading";
document.body.dataset.polls = "0";
openFromHash();
poll();
"""


def render(poll_seconds: float = POLL_SECONDS) -> str:
    """The whole page, polling every ``poll_seconds`` seconds."""
    script = (_SCRIPT.replace("__POLL_MS__", str(int(poll_seconds * 1000)))
              .replace("__DETAIL_LIMIT__", str(DETAIL_LIMIT))
              .replace("__PROVISION_JOBS__", str(PROVISION_JOBS)))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            "<title>Regression cluster status</title>\n"
            f"<style>{_STYLE}</style></head>\n<body data-state=\"loading\">{_BODY}"
            f"<script>{script}</script>\n</body></html>\n")
