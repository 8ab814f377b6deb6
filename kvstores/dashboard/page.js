"use strict";
const B = document.body.dataset, BASE = B.base, WRITABLE = B.writable === "true", CSRF = B.csrf;
const COLORS = {working:"#4aa3ff", input_required:"#e5b637", completed:"#3fb950", failed:"#f85149", cancelled:"#a371f7"};
const $ = (id) => document.getElementById(id);
let token = null, armed = null, filters = {state:"", tool:"", after:null, trail:[]}, openTask = null, lastState = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children) if (child !== null && child !== undefined)
    node.append(child instanceof Node ? child : String(child));
  return node;
}
function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}
function ago(s) {
  if (s === null || s === undefined) return "-";
  const a = Math.abs(s), sign = s < 0 ? "-" : "";
  if (a < 120) return sign + a.toFixed(0) + "s";
  if (a < 7200) return sign + (a / 60).toFixed(0) + "m";
  if (a < 172800) return sign + (a / 3600).toFixed(1) + "h";
  return sign + (a / 86400).toFixed(1) + "d";
}
function ms(v) { return v === null || v === undefined ? "-" : (v < 10 ? v.toFixed(2) : v.toFixed(1)) + " ms"; }
function num(value, label, cls) { return el("div", {class: "num " + (cls || "")}, el("b", {}, value), el("span", {}, label)); }
function fill(id, ...children) { const node = $(id); node.replaceChildren(...children); return node; }

function lines(series, keys, colors, height) {
  const w = 600, h = height || 120, box = svg("svg", {viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: "none", height: h});
  const values = series.flatMap((p) => keys.map((k) => p[k])).filter((v) => typeof v === "number");
  const top = Math.max(1, ...values), n = Math.max(series.length - 1, 1);
  box.append(svg("line", {x1: 0, x2: w, y1: h - 0.5, y2: h - 0.5, stroke: "#2a3541"}));
  keys.forEach((k, i) => {
    let d = "", pen = "M";
    series.forEach((p, j) => {
      const v = p[k];
      if (typeof v !== "number") { pen = "M"; return; }
      d += `${pen}${(j / n * w).toFixed(1)},${(h - 3 - v / top * (h - 6)).toFixed(1)} `; pen = "L";
    });
    if (d) box.append(svg("path", {d, fill: "none", stroke: colors[i], "stroke-width": 2, "vector-effect": "non-scaling-stroke"}));
  });
  return el("div", {class: "chart"}, el("span", {class: "scale"}, "max " + (+top.toFixed(2))), box);
}

function drawStore(s) {
  const st = s.store;
  fill("backend", st.backend + (st.url ? " · " + st.url : ""));
  fill("version", "kvstores " + st.kvstores);
  const enc = $("encryption");
  enc.textContent = st.encryption ? "encryption on · key ids " + st.key_ids.join(", ") : "encryption off";
  enc.className = "badge " + (st.encryption ? "ok" : "dim");
  const last = s.series[s.series.length - 1] || {};
  fill("latency", num(ms(last.get), "get"), num(ms(last.put), "put"), num(ms(last.signal), "signal round trip", last.signal === null ? "bad" : ""));
  $("latency-chart").replaceChildren(lines(s.series, ["get", "put"], ["#4aa3ff", "#3fb950"], 70));
  $("signal-chart").replaceChildren(lines(s.series, ["signal"], ["#a371f7"], 50));
  fill("errors", ...s.errors.map((e) => el("div", {class: "alert"}, e)));
}

function drawTasks(s) {
  const t = s.tasks;
  if (!t) { fill("task-counts", el("span", {class: "alert"}, "tasks cannot be read now")); return; }
  const counts = Object.entries(t.states).map(([k, v]) => num(v, k.replace("_", " "), ""));
  counts.push(num(t.stuck.length, "stuck", t.stuck.length ? "bad" : ""));
  fill("task-counts", ...counts);
  $("task-scope").textContent = t.complete ? `· ${t.total}` : `· ${t.total} so far (first sweep)`;
  const keys = Object.keys(COLORS);
  const series = s.series.map((p) => Object.assign({}, p.states || {}));
  $("task-chart").replaceChildren(lines(series, keys, keys.map((k) => COLORS[k]), 130));
  const legendNode = $("task-legend"); legendNode.replaceChildren();
  keys.forEach((k) => { const i = el("i"); i.style.background = COLORS[k]; legendNode.append(el("span", {}, i, k.replace("_", " "))); });
  const attention = [];
  for (const row of t.stuck) attention.push(el("li", {onclick: () => showTask(row.task)},
    el("span", {class: "mono"}, row.task), " ", el("b", {}, row.tool), " — ", el("span", {class: "bad"}, row.stuck)));
  for (const [kid, n] of Object.entries(t.sealed))
    attention.push(el("li", {class: "alert"}, `${n} task(s) sealed with key id ${kid}, which this dashboard lacks`));
  fill("attention", ...(attention.length ? attention : [el("li", {class: "ok"}, "nothing stuck")]));
  const tool = $("filter-tool"), chosen = tool.value;
  const tools = Object.keys(t.tools).sort();
  if (tool.options.length - 1 !== tools.length || tools.some((name, i) => tool.options[i + 1].value !== name)) {
    tool.replaceChildren(el("option", {value: ""}, "every tool"), ...tools.map((name) => el("option", {value: name}, name)));
    tool.value = tools.includes(chosen) ? chosen : "";
  }
}

function drawSessions(s) {
  const x = s.sessions;
  if (!x) { fill("sessions", el("span", {class: "alert"}, "sessions cannot be read now")); return; }
  const idle = Object.entries(x.idle), top = Math.max(1, ...idle.map(([, n]) => n));
  const sealed = Object.entries(x.sealed).map(([kid, n]) => el("div", {class: "alert"}, `${n} record(s) ${kid === "unreadable" ? "unreadable" : "sealed with key id " + kid + ", which this dashboard lacks"}`));
  fill("sessions", el("div", {class: "nums"}, num(x.live, "live"), num(x.terminated, "terminated")),
    el("table", {}, el("tbody", {}, ...idle.map(([name, n]) => {
      const bar = el("div", {class: "hbar"}); bar.style.width = (n / top * 100) + "%";
      return el("tr", {}, el("td", {class: "dim"}, "idle " + name), el("td", {}, n), el("td", {class: "wide-cell"}, bar));
    }))),
    el("div", {class: "dim"}, "clients: " + (Object.entries(x.clients).map(([k, v]) => `${k} (${v})`).join(", ") || "-")),
    ...sealed);
}

function drawEvents(s) {
  const e = s.events;
  if (!e) { fill("events", el("span", {class: "alert"}, "event streams cannot be read now")); return; }
  fill("events", el("div", {class: "nums"}, num(e.streams, "streams"), num(e.events, "events stored"), num(e.ended, "ended"), num(e.replicas.length, "live replicas")),
    lines(s.series, ["events"], ["#4aa3ff"], 50),
    el("div", {class: "dim"}, "largest: " + (e.largest.map((l) => `${l.stream} (${l.events})`).join(", ") || "-")),
    el("div", {class: "dim"}, "replicas: " + (e.replicas.join(", ") || "none holding a lease")));
}

async function getJSON(path) {
  const response = await fetch(BASE + path, {headers: {Accept: "application/json"}, cache: "no-store"});
  if (!response.ok) throw new Error(response.status + " " + (await response.text()));
  return response.json();
}

async function refreshState() {
  try {
    const s = await getJSON("api/state");
    lastState = s;
    drawStore(s); drawTasks(s); drawSessions(s); drawEvents(s);
    const live = $("live"); live.textContent = "● live · sampled in " + s.sample_ms + " ms"; live.className = "ok";
    live.dataset.sampled = s.now;
  } catch (err) {
    const live = $("live"); live.textContent = "● cannot reach the dashboard: " + err.message; live.className = "bad";
  }
}

async function refreshTasks() {
  const query = new URLSearchParams();
  if (filters.state) query.set("state", filters.state);
  if (filters.tool) query.set("tool", filters.tool);
  if (filters.after) query.set("after", filters.after);
  try {
    const page = await getJSON("api/tasks?" + query);
    const rows = page.rows.map((r) => el("tr", {class: r.stuck ? "stuck" : "", "data-task": r.task, onclick: () => showTask(r.task), title: r.stuck || ""},
      el("td", {class: "mono"}, r.task), el("td", {}, r.tool ?? "-"),
      stateCell(r),
      el("td", {}, ago(r.age)), el("td", {}, r.attempts ?? "-"), el("td", {class: "mono"}, r.worker ?? "-"),
      el("td", {class: r.lease_left !== null && r.lease_left < 0 ? "bad" : ""}, r.lease_left === null || r.lease_left === undefined ? "-" : ago(r.lease_left)),
      el("td", {class: "msg"}, r.progress ? `${r.progress[0]}/${r.progress[1]} ` : "", r.message ?? "")));
    fill("task-rows", ...(rows.length ? rows : [el("tr", {}, el("td", {colspan: 8, class: "dim"}, "no tasks here"))]));
    $("next").disabled = !page.next; $("next").dataset.after = page.next || "";
    $("first").disabled = !filters.after;
    $("page-note").textContent = `${rows.length} shown · ${page.scanned} keys read`;
  } catch (err) { fill("task-rows", el("tr", {}, el("td", {colspan: 8, class: "alert"}, String(err.message)))); }
}

function stateCell(r) {
  const cell = el("td", {class: "state"}, r.state + (r.sealed ? " (key id " + r.sealed + ")" : ""));
  cell.style.color = COLORS[r.state] || "#f85149";
  return cell;
}

async function showTask(label) {
  openTask = label;
  $("detail").style.top = document.querySelector("header").offsetHeight + "px";  // the token form stays usable
  $("detail").hidden = false;
  await refreshDetail();
}
async function refreshDetail() {
  if (!openTask) return;
  let d;
  try { d = await getJSON("api/tasks/" + encodeURIComponent(openTask)); }
  catch (err) { fill("detail-body", el("p", {class: "alert"}, err.message)); return; }
  const fields = [["task", d.task], ["tool", d.tool], ["state", d.state], ["age", ago(d.age)], ["last change", ago(d.updated) + " ago"],
    ["attempts", d.attempts], ["worker", d.worker ?? "-"], ["lease expires in", d.lease_left === null || d.lease_left === undefined ? "-" : ago(d.lease_left)],
    ["message", d.message ?? "-"], ["error", d.error ?? "-"], ["re-runs allowed", d.reruns === undefined ? "-" : String(d.reruns)],
    ["kept for", d.ttl ? ago(d.ttl) + " after its last change" : "-"]];
  if (d.sealed) fields.push(["sealed with", "key id " + d.sealed + " (this dashboard lacks it)"]);
  const history = (d.history || []).map((a) => el("li", {}, `attempt ${a.token}: `, el("span", {class: "mono"}, a.worker),
    ` · seen ${ago(lastState ? lastState.now - a.first_seen : 0)} ago` + (a.ended ? ` · ended ${a.ended}` : "")));
  const missing = d.attempts && d.history ? d.attempts - d.history.length : 0;
  fill("detail-body",
    d.stuck ? el("p", {class: "alert"}, "stuck: " + d.stuck) : null,
    el("dl", {}, ...fields.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
    el("h3", {}, "Attempts"),
    el("ul", {class: "plain", id: "history"}, ...(history.length ? history : [el("li", {class: "dim"}, "no lease seen by this dashboard")])),
    missing > 0 ? el("p", {class: "dim"}, `${missing} earlier attempt(s) ran before this dashboard watched`) : null,
    cancelButton(d));
}
function cancelButton(d) {
  if (!WRITABLE) return el("p", {class: "dim"}, "read-only: start the dashboard with an operator token to cancel tasks");
  if (d.terminal || d.state === "sealed" || d.state === "unreadable") return null;
  if (!token) return el("p", {class: "dim"}, "enter the operator token (top right) to cancel this task");
  const button = el("button", {class: "danger", id: "cancel", onclick: async () => {
    if (armed !== d.task) { armed = d.task; button.textContent = "Really cancel " + d.task + "?"; return; }
    armed = null;
    button.disabled = true;
    const response = await fetch(BASE + "api/tasks/" + encodeURIComponent(d.task) + "/cancel", {method: "POST",
      headers: {Authorization: "Bearer " + token, "X-CSRF-Token": CSRF, "Content-Type": "application/json"}, body: "{}"});
    const answer = await response.json().catch(() => ({}));
    fill("cancel-result", response.ok ? `${d.task}: ${answer.state}` : `refused: ${answer.error || response.status}`);
    $("cancel-result").className = response.ok ? "ok" : "alert";
    await refreshDetail(); await refreshTasks();
  }}, armed === d.task ? "Really cancel " + d.task + "?" : "Cancel task");
  return el("div", {}, button);
}

async function unlock(event) {
  event.preventDefault();
  const input = $("token"), given = input.value;
  input.value = "";
  const response = await fetch(BASE + "api/unlock", {method: "POST", headers: {Authorization: "Bearer " + given, "X-CSRF-Token": CSRF}});
  if (response.ok) { token = given; fill("unlock-state", "unlocked"); $("unlock-state").className = "ok"; }
  else { token = null; const a = await response.json().catch(() => ({})); fill("unlock-state", "refused: " + (a.error || response.status)); $("unlock-state").className = "bad"; }
  await refreshDetail();
}

function start() {
  $("filter-state").addEventListener("change", (e) => { filters.state = e.target.value; filters.after = null; filters.trail = []; refreshTasks(); });
  $("filter-tool").addEventListener("change", (e) => { filters.tool = e.target.value; filters.after = null; filters.trail = []; refreshTasks(); });
  $("next").addEventListener("click", (e) => { filters.trail.push(filters.after); filters.after = e.target.dataset.after || null; refreshTasks(); });
  $("first").addEventListener("click", () => { filters.after = null; filters.trail = []; refreshTasks(); });
  $("close").addEventListener("click", () => { openTask = null; armed = null; $("detail").hidden = true; fill("cancel-result"); });
  if (WRITABLE) $("unlock").addEventListener("submit", unlock); else $("unlock").hidden = true;
  const tick = async () => { await Promise.all([refreshState(), refreshTasks(), refreshDetail()]); setTimeout(tick, +B.interval * 1000); };
  tick();
}
start();
