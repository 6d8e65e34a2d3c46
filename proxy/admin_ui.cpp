// The status page (GET /ui): the HTML, CSS and JavaScript of one self-contained document, and the
// headers it is served with. See admin_ui.h; its requests are listed in docs/operations.md.
#include "proxy/admin_ui.h"

namespace fencegate::proxy {

namespace {

constexpr std::string_view kPage = R"FGUI(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>fencegate status</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1em 2em; color: #1d2330; background: #fafbfc; }
h1 { font-size: 1.4em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
table { border-collapse: collapse; width: 100%; background: #fff; }
th, td { border: 1px solid #d6dae1; padding: .25em .5em; text-align: left; white-space: nowrap; }
th { background: #eef1f5; font-weight: 600; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.bar { display: flex; gap: 1em; align-items: center; flex-wrap: wrap; margin: .4em 0; }
.ok { color: #126b2f; font-weight: 600; } .bad { color: #b3261e; font-weight: 600; } .muted { color: #6b7280; }
#tail { max-height: 22em; overflow-y: auto; }
#error { color: #b3261e; min-height: 1.2em; }
code { font-size: .95em; }
</style>
</head>
<body>
<h1>fencegate status</h1>
<div class="bar">
  <span id="ready" class="muted">readiness: ?</span>
  <label>admin token <input id="token" type="password" size="24" autocomplete="off"></label>
  <span class="muted">updated <span id="updated">never</span></span>
</div>
<div id="error"></div>

<h2>Resources</h2>
<div class="bar">
  <label>name prefix <input id="prefix" size="16"></label>
  <label>mode <select id="mode"><option value="">any</option><option>enforce</option><option>observe</option>
    <option>off</option><option>unrouted</option></select></label>
  <button id="first">first page</button> <button id="next" disabled>next page</button>
  <span class="muted" id="count"></span>
</div>
<table id="resources">
<thead><tr><th>resource</th><th>mode</th><th>generation</th><th>leader</th><th>advanced at</th>
<th>in flight</th><th>writes/s</th><th>refusals/s</th></tr></thead>
<tbody></tbody>
</table>

<h2>Ready to enforce (observe resources)</h2>
<div class="bar"><label>window <select id="window"><option>1h</option><option selected>24h</option>
  <option>7d</option></select></label>
  <span class="muted">ready: no write without a valid token and no stale write within the window</span></div>
<table id="readiness">
<thead><tr><th>resource</th><th>verdict</th><th>missing token</th><th>stale</th><th>other</th><th>last seen</th>
<th>callers</th></tr></thead>
<tbody></tbody>
</table>

<h2>Refused and would-be-refused writes (live)</h2>
<div id="tail"><table id="tailtable">
<thead><tr><th>time</th><th>resource</th><th>decision</th><th>presented</th><th>current</th><th>method</th>
<th>target</th><th>client</th><th>leader</th></tr></thead>
<tbody></tbody>
</table></div>

<h2>Callers writing without a valid token</h2>
<table id="unfenced">
<thead><tr><th>resource</th><th>client</th><th>user agent</th><th>leader</th><th>count</th><th>last seen</th></tr></thead>
<tbody></tbody>
</table>

<h2>Manual fence</h2>
<div class="bar">
  <label>resource <input id="fence-resource" size="20"></label>
  <label>generation <input id="fence-generation" size="8"></label>
  <label>leader <input id="fence-leader" size="12"></label>
  <button id="fence">fence</button> <span id="fence-result" class="muted">needs the admin token</span>
</div>

<script>
"use strict";
const $ = (id) => document.getElementById(id);
const tokenBox = $("token");
tokenBox.value = sessionStorage.getItem("fencegate-token") || "";
tokenBox.addEventListener("change", () => { sessionStorage.setItem("fencegate-token", tokenBox.value); refreshAll(); });

// Reads: same-origin GETs (with the token when one is given).
async function get(path) {
  const h = {};
  if (tokenBox.value) h["Authorization"] = "Bearer " + tokenBox.value;
  const r = await fetch(path, { headers: h, credentials: "omit", cache: "no-store" });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(path + ": " + r.status + " " + (body.detail || body.reason || body.title || ""));
  return body;
}
function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}
function showError(e) { $("error").textContent = e ? String(e.message || e) : ""; }

// Resources, a page at a time; rates from the counters' change between two polls.
let cursor = "", nextCursor = "", last = new Map(), lastAt = 0;
async function loadResources() {
  let q = "/v1/resources?limit=200";
  if ($("prefix").value) q += "&prefix=" + encodeURIComponent($("prefix").value);
  if ($("mode").value) q += "&mode=" + encodeURIComponent($("mode").value);
  if (cursor) q += "&cursor=" + encodeURIComponent(cursor);
  const j = await get(q);
  const now = Date.now(), dt = lastAt ? (now - lastAt) / 1000 : 0;
  const seen = new Map();
  const tb = $("resources").tBodies[0];
  tb.replaceChildren();
  for (const r of j.resources) {
    const tr = document.createElement("tr");
    tr.dataset.resource = r.resource;
    cell(tr, r.resource); cell(tr, r.mode, "mode"); cell(tr, r.generation, "num generation");
    cell(tr, r.advanced_by, "leader"); cell(tr, r.advanced_at, "advanced"); cell(tr, r.in_flight, "num");
    const prev = last.get(r.resource);
    const rate = (k) => (prev && dt > 0 && r[k] !== null && prev[k] !== null) ? ((r[k] - prev[k]) / dt).toFixed(1) : "";
    cell(tr, r.writes === null ? "n/a" : rate("writes"), "num");
    cell(tr, r.refusals === null ? "n/a" : rate("refusals"), "num");
    tb.appendChild(tr);
    seen.set(r.resource, { writes: r.writes, refusals: r.refusals });
  }
  last = seen; lastAt = now;
  nextCursor = j.next_cursor || "";
  $("next").disabled = !nextCursor;
  $("count").textContent = j.resources.length + " shown" + (nextCursor ? ", more on the next page" : "");
  return j.resources;
}
$("first").onclick = () => { cursor = ""; last = new Map(); lastAt = 0; refreshAll(); };
$("next").onclick = () => { cursor = nextCursor; last = new Map(); lastAt = 0; refreshAll(); };
$("prefix").onchange = $("mode").onchange = $("first").onclick;
$("window").onchange = () => loadReadiness();

// The ready-to-enforce verdict of each observe resource on the page.
let observed = [];
async function loadReadiness() {
  const tb = $("readiness").tBodies[0];
  const rows = [];
  for (const name of observed.slice(0, 50)) {
    const j = await get("/v1/resources/" + encodeURIComponent(name) + "/readiness?window=" + $("window").value);
    const tr = document.createElement("tr");
    tr.dataset.resource = name;
    cell(tr, name);
    cell(tr, j.ready ? "ready to enforce" : "not ready", j.ready ? "ok verdict" : "bad verdict");
    cell(tr, j.missing, "num"); cell(tr, j.stale, "num"); cell(tr, j.other, "num"); cell(tr, j.last_seen);
    cell(tr, j.callers.map((c) => c.client + " " + (c.user_agent || "-") + (c.leader ? " (" + c.leader + ")" : "") +
      ": " + (c.missing + c.stale + c.other)).join("; "));
    rows.push(tr);
  }
  tb.replaceChildren(...rows);
}

// The live tail: refusals (rejected_*) and would-be refusals (would_reject_*), newest on top.
let tailId = 0;
async function loadTail() {
  const j = await get("/v1/audit?limit=100");
  const tb = $("tailtable").tBodies[0];
  const fresh = j.rows.filter((r) => r.id > tailId && /^(rejected_|would_reject_)/.test(r.decision)).reverse();
  for (const r of fresh) {
    const tr = document.createElement("tr");
    tr.dataset.id = r.id;
    cell(tr, r.time); cell(tr, r.resource, "resource"); cell(tr, r.decision, "decision");
    cell(tr, r.presented_generation, "num presented"); cell(tr, r.current_generation, "num");
    cell(tr, r.method); cell(tr, r.target); cell(tr, r.client); cell(tr, r.leader);
    tb.insertBefore(tr, tb.firstChild);
  }
  if (j.rows.length) tailId = Math.max(tailId, j.rows[0].id);
  while (tb.rows.length > 500) tb.deleteRow(tb.rows.length - 1);
}

async function loadUnfenced() {
  const j = await get("/v1/audit/unfenced?limit=100");
  const tb = $("unfenced").tBodies[0];
  tb.replaceChildren();
  for (const g of j.callers) {
    const tr = document.createElement("tr");
    cell(tr, g.resource); cell(tr, g.client); cell(tr, g.user_agent); cell(tr, g.leader);
    cell(tr, g.count, "num"); cell(tr, g.last_seen);
    tb.appendChild(tr);
  }
}

async function loadReady() {
  const r = await fetch("/readyz", { cache: "no-store" });
  const j = await r.json().catch(() => ({}));
  $("ready").textContent = r.ok ? "ready" : "not ready: " + (j.reason || r.status);
  $("ready").className = r.ok ? "ok" : "bad";
}

// The one state-changing action: it needs the admin token and sends the Fencegate-UI header.
$("fence").onclick = async () => {
  const name = $("fence-resource").value, g = Number($("fence-generation").value);
  const h = { "Content-Type": "application/json", "Fencegate-UI": "1" };
  if (tokenBox.value) h["Authorization"] = "Bearer " + tokenBox.value;
  const body = { generation: g };
  if ($("fence-leader").value) body.leader = $("fence-leader").value;
  const r = await fetch("/v1/resources/" + encodeURIComponent(name) + "/fence",
                        { method: "POST", headers: h, body: JSON.stringify(body), credentials: "omit" });
  const j = await r.json().catch(() => ({}));
  $("fence-result").textContent = r.status + " " + (r.ok ? "fenced at " + j.generation : (j.detail || j.title || ""));
  refreshAll();
};

let busy = false;
async function refreshAll() {
  if (busy) return;
  busy = true;
  try {
    await loadReady();
    const rs = await loadResources();
    observed = rs.filter((r) => r.mode === "observe").map((r) => r.resource);
    await loadTail();
    await loadUnfenced();
    await loadReadiness();
    $("updated").textContent = new Date().toLocaleTimeString();
    showError(null);
  } catch (e) {
    showError(e);
  } finally {
    busy = false;
  }
}
refreshAll();
setInterval(refreshAll, 1000);
</script>
</body>
</html>
)FGUI";

constexpr std::string_view kHeaders =
    "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\n"
    "X-Frame-Options: DENY\r\nX-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n";

}  // namespace

std::string_view admin_ui_page() { return kPage; }
std::string_view admin_ui_headers() { return kHeaders; }

}  // namespace fencegate::proxy
