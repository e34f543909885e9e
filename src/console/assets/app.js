// tollgate console: reads the admin listener's JSON every few seconds and draws it. Every
// piece of data goes into the page as text (textContent), never as markup.
"use strict";

const REFRESH_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";

let lastCaller = null;
let actions = "token";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "class") node.className = value;
    else if (name.startsWith("data-")) node.setAttribute(name, value);
    else node[name] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  return node;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

function seconds(s) {
  if (s === null || s === undefined) return "—";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${Math.round(s * 10) / 10} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${Math.round(s / 3600)} h`;
}

async function getJson(url) {
  const response = await fetch(url, { cache: "no-store", credentials: "omit" });
  const body = await response.json().catch(() => ({}));
  return { status: response.status, ok: response.ok, body };
}

// Rates per second between consecutive cumulative samples: [[allowed, limited, shed,
// would shed], ...], the i-th ending at times[i + 1].
function rates(times, counts) {
  const out = [];
  for (let i = 1; i < counts.length; i++) {
    const dt = Math.max(0.001, (times[i] - times[i - 1]) / 1000);
    out.push(counts[i].map((c, k) => Math.max(0, (c - counts[i - 1][k]) / dt)));
  }
  return out;
}

// A route's chart: allowed requests per second above, refused ones (limited, shed) below,
// each on its own scale, so that a spike of one never flattens the other to the floor. The
// last minute is shaded, and its averages are the chart's caption; hovering a sample shows
// its values instead.
const CHART = { width: 520, panel: 58, gap: 16, top: 16 };
const SPAN_MS = 600000;
const LAST_MINUTE_MS = 60000;
const hovered = new Map();

// `shadow`: the protection in shadow mode would have shed some of this route's requests; its
// rate is then shown too.
function rateText(r, shadow) {
  const n = (v) => (v >= 10 ? Math.round(v) : Math.round(v * 10) / 10);
  const text = `${n(r[0])} allowed/s · ${n(r[1])} limited/s · ${n(r[2])} shed/s`;
  return shadow ? `${text} · ${n(r[3])} would shed/s` : text;
}

function clock(ms) {
  return new Date(ms).toISOString().slice(11, 19);
}

function panel(root, y, points, picks, names, label) {
  const { width, panel: height } = CHART;
  const max = Math.max(1, ...points.flatMap((p) => picks.map((k) => p.r[k])));
  const top = Math.ceil(max);
  root.append(svg("line", { x1: 0, x2: width, y1: y + height, y2: y + height, class: "axis" }));
  const note = svg("text", { x: 4, y: y + 10, class: "chart-note" });
  note.textContent = `${label} (top ${top}/s)`;
  root.append(note);
  // The last minute drawn bolder: from the sample before it, so that the line is unbroken.
  const first = Math.max(0, points.findIndex((p) => p.recent) - 1);
  picks.forEach((k, i) => {
    const line = points.map((p) => `${p.x.toFixed(1)},${(y + height - (p.r[k] / top) * (height - 4)).toFixed(1)}`);
    root.append(svg("polyline", { points: line.join(" "), class: `line ${names[i]}`, fill: "none" }));
    if (points.some((p) => p.recent)) {
      root.append(svg("polyline", { points: line.slice(first).join(" "), class: `line recent ${names[i]}`, fill: "none" }));
    }
  });
}

function chart(route, times, series) {
  const { width, panel: height, gap, top } = CHART;
  const total = top + 2 * height + gap + 12;
  const root = svg("svg", { width, height: total, viewBox: `0 0 ${width} ${total}`, class: "chart", role: "img", "data-route": route });
  root.append(svg("rect", { x: 0, y: 0, width, height: total, class: "chart-bg" }));
  const caption = svg("text", { x: width - 4, y: 12, class: "chart-caption", "text-anchor": "end" });
  root.append(caption);
  if (series.length < 2) {
    caption.textContent = "collecting…";
    return root;
  }
  const end = times[times.length - 1];
  const x = (t) => Math.max(0, ((t - (end - SPAN_MS)) / SPAN_MS) * (width - 2) + 1);
  const points = series.map((r, i) => ({ t: times[i + 1], x: x(times[i + 1]), r, recent: times[i + 1] > end - LAST_MINUTE_MS }));
  // The last minute, shaded and named.
  const from = x(end - LAST_MINUTE_MS);
  root.append(svg("rect", { x: from, y: top, width: width - from, height: 2 * height + gap, class: "last-minute" }));
  const lm = svg("text", { x: width - 3, y: total - 2, class: "chart-note", "text-anchor": "end" });
  lm.textContent = "last minute";
  root.append(lm);
  const ten = svg("text", { x: 2, y: total - 2, class: "chart-note" });
  ten.textContent = "10 min ago";
  root.append(ten);
  panel(root, top, points, [0], ["allowed"], "allowed");
  // What shadow mode would have shed is drawn dashed under the refusals (nothing was refused),
  // only where there was some.
  const shadow = points.some((p) => p.r[3] > 0);
  if (shadow) {
    panel(root, top + height + gap, points, [1, 2, 3], ["limited", "shed", "would-shed"], "refused: limited, shed; would shed (dashed)");
  } else {
    panel(root, top + height + gap, points, [1, 2], ["limited", "shed"], "refused: limited, shed");
  }
  const recent = points.filter((p) => p.recent);
  const average = [0, 1, 2, 3].map((k) => recent.reduce((a, p) => a + p.r[k], 0) / Math.max(1, recent.length));
  const idle = `last minute: ${rateText(average, shadow)}`;
  caption.textContent = idle;
  // Hover: a column per sample shows its time and rates in the caption and a cursor line.
  const cursor = svg("line", { x1: 0, x2: 0, y1: top, y2: top + 2 * height + gap, class: "cursor", visibility: "hidden" });
  root.append(cursor);
  const show = (p) => {
    if (p) {
      caption.textContent = `${clock(p.t)} UTC: ${rateText(p.r, shadow)}`;
      cursor.setAttribute("x1", p.x);
      cursor.setAttribute("x2", p.x);
      cursor.setAttribute("visibility", "visible");
    } else {
      caption.textContent = idle;
      cursor.setAttribute("visibility", "hidden");
    }
  };
  points.forEach((p, i) => {
    const left = i === 0 ? p.x - 4 : (points[i - 1].x + p.x) / 2;
    const right = i === points.length - 1 ? width : (p.x + points[i + 1].x) / 2;
    const column = svg("rect", { x: left, y: top, width: Math.max(1, right - left), height: 2 * height + gap, class: "hover", "data-at": p.t });
    const title = svg("title");
    title.textContent = `${clock(p.t)} UTC\n${rateText(p.r, shadow)}`;
    column.append(title);
    column.addEventListener("mouseenter", () => { hovered.set(route, p.t); show(p); });
    root.append(column);
  });
  root.addEventListener("mouseleave", () => { hovered.delete(route); show(null); });
  // Redrawn every refresh: the sample under the pointer stays shown.
  if (hovered.has(route)) show(points.find((p) => p.t === hovered.get(route)));
  return root;
}

function renderRoutes(data) {
  const body = document.querySelector("#routes tbody");
  clear(body);
  for (const route of data.routes) {
    const m = route.match;
    const match = [
      m.methods ? m.methods.join(",") : "any method",
      m.host ? `host ${m.host}` : null,
      m.path_prefix ? `${m.path_prefix}*` : "any path",
    ].filter(Boolean).join(" ");
    const limits = el("div", {}, el("code", { class: "policy" }, route.policy || "no limits"));
    for (const l of route.limits) {
      limits.append(el("div", { class: "muted small" }, `${l.name}: ${l.algorithm} ${l.summary}`));
    }
    for (const tier of route.tiers) {
      limits.append(el("div", { class: "small" }, `tier ${tier.name} (by ${tier.identity}): `, el("code", {}, tier.policy)));
    }
    const wouldShed = (data.history.would_shed || {})[route.name] || [];
    const counts = (data.history.routes[route.name] || []).map((c, i) => [...c, wouldShed[i] || 0]);
    const series = rates(data.history.times, counts);
    body.append(el("tr", { "data-route": route.name },
      el("td", { class: "name" }, route.name),
      el("td", {}, match),
      el("td", {}, limits),
      el("td", { class: "priority" }, route.priority),
      el("td", { class: "mode" }, route.mode || "—"),
      el("td", {}, chart(route.name, data.history.times, series))));
  }
  document.getElementById("routes-note").textContent =
    `(${data.routes.length}; sampled every ${data.sample_seconds} s)`;
}

// The page names the caller it shows in its address: #caller=VALUE (a value or its short form).
function callerHash(identity) {
  return `#caller=${encodeURIComponent(identity)}`;
}

// A caller as the lists show it, linking to their panel.
function callerLink(identity) {
  const link = el("a", { href: callerHash(identity), class: "identity", title: "show this caller" }, identity);
  // The same address again fires no hashchange: look up again all the same.
  link.addEventListener("click", () => {
    if (location.hash === callerHash(identity)) lookUp(identity);
  });
  return link;
}

function renderTop(top) {
  const body = document.querySelector("#top tbody");
  clear(body);
  let rows = 0;
  for (const route of top.routes) {
    for (const caller of route.top) {
      rows++;
      const who = callerLink(caller.identity);
      body.append(el("tr", { class: "offender", "data-route": route.route, "data-identity": caller.identity },
        el("td", {}, route.route),
        el("td", {}, who, el("span", { class: "muted small" }, ` ${caller.source}`)),
        el("td", { class: "count" }, caller.error ? `${caller.count} ±${caller.error}` : caller.count),
        el("td", {}, caller.replicas)));
    }
  }
  document.getElementById("top-empty").hidden = rows > 0;
  const scope = top.scope === "fleet"
    ? `(last minute, fleet: ${top.replicas} replica${top.replicas === 1 ? "" : "s"})`
    : `(last minute, this replica only${top.reason ? ": " + top.reason : ""})`;
  document.getElementById("top-scope").textContent = scope;
}

function dl(node, pairs) {
  clear(node);
  for (const [name, value, cls] of pairs) {
    node.append(el("dt", {}, name), el("dd", { class: cls || "" }, value));
  }
}

function renderStore(store) {
  const pairs = [
    ["store", store.kind],
  ];
  if (store.kind === "redis") {
    pairs.push(["Redis", store.up ? "up" : (store.connected ? "down" : "not connected"), store.up ? "good" : "bad"]);
    pairs.push(["round trip", store.rtt_ms === null ? "no answer" : `${store.rtt_ms.toFixed(2)} ms`]);
    pairs.push(["circuit breaker", store.breaker, store.breaker === "open" ? "bad" : "good"]);
    pairs.push(["if the store fails", { allow: "allow every request", deny: "refuse every request", local: "limit in memory here" }[store.on_error] || store.on_error]);
    if (store.cause) {
      pairs.push(["cause", store.cause, "bad"]);
    }
    const p = store.persistence;
    if (p) {
      pairs.push(["persistence", p.persistence === null ? "not checked yet" : p.persistence, p.warning ? "bad" : ""]);
      if (p.warning) {
        pairs.push(["warning", p.warning, "bad"]);
      }
    }
  }
  pairs.push(["ready", store.ready ? "yes" : "no", store.ready ? "good" : "bad"]);
  pairs.push(["store errors", String(store.store_errors)]);
  if (store.local_first) {
    const lf = store.local_first;
    pairs.push(["local-first rounds", `${lf.rounds_ok} ok, ${lf.rounds_failed} failed`]);
    pairs.push(["drift", String(lf.drift)]);
    pairs.push(["replicas syncing", String(lf.replicas)]);
  }
  dl(document.getElementById("store"), pairs);
}

function ms(v) {
  return v === null || v === undefined ? "—" : `${v} ms`;
}

// GET /protect's reading in words: every field named for a person, not by its JSON name.
function protectPairs(s) {
  const pairs = [
    ["mode", s.mode],
    ["limit", `${s.limit} requests at once`],
    ["in flight", String(s.in_flight)],
    ["waiting", String(s.waiting)],
    ["latency now", ms(s.latency_ms)],
    ["baseline latency", ms(s.baseline_ms)],
    ["target", ms(s.target_ms)],
    ["errors", `${Math.round(s.error_share * 1000) / 10} % of the last window`],
    ["state", `${s.state} (window ${s.windows})`],
  ];
  if (s.good_limit !== null && s.good_limit !== undefined) {
    pairs.push(["served without a queue up to", String(s.good_limit)]);
  }
  if (s.paced) pairs.push(["paced", `at ${s.paced.level} for ${s.paced.windows_left} more windows`]);
  const cut = s.last_cut;
  pairs.push(["last cut", cut ? `${cut.from} → ${cut.to} by ${cut.cause}, ${seconds(cut.ago_ms / 1000)} ago` : "none"]);
  if (s.settings) {
    const t = s.settings;
    pairs.push(["settings", `latency ${t.latency}, max wait ${ms(t.max_wait_ms)}, limit ${t.min_limit} to ${t.max_limit}`]);
  }
  for (const priority of ["critical", "high", "normal", "low"].filter((p) => p in (s.admitted || {}))) {
    pairs.push([`${priority} priority`, `${s.admitted[priority]} admitted, ${(s.shed || {})[priority] ?? 0} ${s.mode === "shadow" ? "would have been shed" : "shed"}`]);
  }
  return pairs;
}

// The overload protection's panel, shown only while the admin listener has `GET /protect`.
async function renderProtect() {
  const section = document.getElementById("protect-section");
  try {
    const answer = await getJson("/console/api/protect");
    const state = answer.ok && answer.body.available ? answer.body.state : null;
    if (state === null || typeof state !== "object") {
      section.hidden = true;
      return;
    }
    dl(document.getElementById("protect"), protectPairs(state));
    section.hidden = false;
  } catch (e) {
    section.hidden = true;
  }
}

function when(rfc3339) {
  return rfc3339.slice(11, 19);
}

function ago(rfc3339, now) {
  const s = Math.max(0, (Date.parse(now) - Date.parse(rfc3339)) / 1000);
  return s < 1 ? "now" : `${seconds(s)} ago`;
}

// One line per caller, limit and reason over the last hour, the most recently denied first.
function renderDenials(denials, now) {
  const body = document.querySelector("#denials tbody");
  clear(body);
  const SHOWN = 30;
  for (const d of denials.slice(0, SHOWN)) {
    body.append(el("tr", { class: "denial", "data-identity": d.identity },
      el("td", {}, callerLink(d.identity), el("span", { class: "muted small" }, ` ${d.source}`)),
      el("td", {}, d.tier ? `${d.route} (tier ${d.tier})` : d.route),
      el("td", {}, d.limit),
      el("td", {}, d.reason),
      el("td", { class: "count" }, d.count),
      el("td", { class: "small" }, when(d.first)),
      el("td", { class: "small" }, `${when(d.last)} (${ago(d.last, now)})`)));
  }
  if (denials.length > SHOWN) {
    body.append(el("tr", {}, el("td", { colSpan: 7, class: "muted" }, `and ${denials.length - SHOWN} more (GET /console/api/overview lists them all)`)));
  }
  if (denials.length === 0) {
    body.append(el("tr", {}, el("td", { colSpan: 7, class: "muted" }, "nobody was denied here in the last hour")));
  }
}

// Suggested limits (GET /limits/suggest): a merge of the fleet's hourly records, read every
// 30 s rather than on every refresh.
const SUGGEST_MS = 30000;
let suggestedAt = 0;

async function renderSuggest() {
  if (Date.now() - suggestedAt < SUGGEST_MS) return;
  suggestedAt = Date.now();
  const answer = await getJson("/limits/suggest?window=24h&format=json");
  if (!answer.ok) return;
  const report = answer.body;
  const body = document.querySelector("#suggest tbody");
  clear(body);
  for (const r of report.routes) {
    const m = r.per_minute;
    const pick = r.suggestions.filter((s) => s.target === 0.01);
    const cell = el("td", {});
    for (const s of pick) {
      cell.append(el("div", { class: "small" }, s.sentence), el("pre", { class: "small" }, s.yaml));
    }
    body.append(el("tr", { class: "suggestion" },
      el("td", {}, r.tier ? `${r.route} (tier ${r.tier})` : r.route, el("span", { class: "muted small" }, ` key ${r.key}`)),
      el("td", {}, r.callers),
      el("td", {}, `${m.p50} / ${m.p90} / ${m.p99} / ${m["p99.9"]} / ${m.max}`),
      el("td", {}, `${r.refused.requests} requests of ${r.refused.callers} callers (shadow: ${r.refused.shadow_requests} of ${r.refused.shadow_callers})`),
      cell));
  }
  document.getElementById("suggest-empty").hidden = report.routes.length > 0;
  document.getElementById("suggest-scope").textContent = report.scope === "fleet"
    ? `(last 24 h, fleet: ${report.replicas} replica${report.replicas === 1 ? "" : "s"})`
    : `(last 24 h, this replica only${report.reason ? ": " + report.reason : ""})`;
}

// The audit trail (GET /limits/audit): every reset and override, whoever made it, newest
// first; the filter keeps the lines that contain what it holds, in any column.
const AUDIT_MS = 10000;
let auditedAt = 0;
let auditEntries = [];

function parametersText(p) {
  if (!p || typeof p !== "object") return "";
  return Object.entries(p).filter(([, v]) => v !== null && v !== undefined).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ");
}

function renderAuditRows() {
  const body = document.querySelector("#audit tbody");
  clear(body);
  const wanted = document.getElementById("audit-filter").value.trim().toLowerCase();
  let shown = 0;
  for (const e of auditEntries) {
    const cells = [e.at.replace("T", " ").replace("Z", ""), e.action, e.route, e.identity, parametersText(e.parameters), e.who, e.replica];
    if (wanted && !cells.join(" ").toLowerCase().includes(wanted)) continue;
    shown++;
    body.append(el("tr", { class: "audit-entry" },
      el("td", { class: "small" }, cells[0]),
      el("td", {}, cells[1]),
      el("td", {}, cells[2]),
      el("td", {}, callerLink(e.identity)),
      el("td", { class: "small" }, cells[4]),
      el("td", {}, cells[5]),
      el("td", { class: "small muted" }, cells[6])));
  }
  document.getElementById("audit-count").textContent = wanted
    ? `(${shown} of the last ${auditEntries.length} match)`
    : `(the last ${auditEntries.length}, newest first)`;
}

async function renderAudit(now) {
  if (!now && Date.now() - auditedAt < AUDIT_MS) return;
  auditedAt = Date.now();
  const answer = await getJson("/limits/audit?limit=100");
  if (!answer.ok) return;
  auditEntries = (answer.body.entries || []).slice().reverse();
  renderAuditRows();
}

// The overrides in force over the fleet (GET /limits/overrides), soonest to end first.
async function renderOverrides() {
  const answer = await getJson("/limits/overrides");
  if (!answer.ok) return;
  const list = answer.body.overrides || [];
  const body = document.querySelector("#overrides tbody");
  clear(body);
  for (const o of list) {
    const change = o.limit !== null && o.limit !== undefined ? `limit ${o.limit}` : `× ${o.multiply}`;
    body.append(el("tr", { class: "override-entry", "data-route": o.route, "data-identity": o.identity },
      el("td", {}, o.route),
      el("td", {}, callerLink(o.identity)),
      el("td", {}, o.limit_name || "every limit"),
      el("td", {}, change),
      el("td", {}, `${o.until.slice(11, 19)} UTC (in ${seconds(o.expires_in_seconds)})`),
      el("td", {}, o.set_by),
      el("td", { class: "small" }, o.set_at ? o.set_at.replace("T", " ").replace(/\.\d+Z$/, "") : "—"),
      el("td", { class: "small muted" }, o.set_on || "—")));
  }
  document.getElementById("overrides-empty").hidden = list.length > 0;
}

async function refresh() {
  try {
    const answer = await getJson("/console/api/overview");
    if (!answer.ok) throw new Error(answer.body.error || `HTTP ${answer.status}`);
    const data = answer.body;
    actions = data.actions;
    renderRoutes(data);
    renderTop(data.top);
    renderStore(data.store);
    renderDenials(data.denials, data.now);
    const status = document.getElementById("status");
    status.textContent = `updated ${data.now.replace("T", " ").replace("Z", " UTC")}`;
    status.className = "muted";
  } catch (e) {
    const status = document.getElementById("status");
    status.textContent = `cannot reach the admin listener: ${e.message}`;
    status.className = "bad";
  }
  renderProtect();
  renderSuggest().catch(() => {});
  renderAudit(false).catch(() => {});
  renderOverrides().catch(() => {});
  if (lastCaller !== null) renderCaller(lastCaller, false);
}

// A time `s` seconds from now, as the page shows times: HH:MM:SS UTC.
function inSeconds(s) {
  return `${clock(Date.now() + s * 1000)} UTC`;
}

// One limit of a caller on a route: a row of the panel's table.
function limitRow(l, override) {
  const name = `${l.limit_name}${l.tier ? " (tier " + l.tier + ")" : ""}`;
  const row = (kind, ...cells) => el("tr", { class: `limit-state ${kind}`, "data-limit": l.limit_name },
    el("td", { class: "name" }, name), ...cells);
  if (l.error) return row("bad", el("td", { colSpan: 5, class: "bad" }, l.error));
  if (l.unknown) return row("unknown", el("td", { colSpan: 5, class: "muted" }, `unknown: ${l.unknown}`));
  let now;
  if (l.blocked) now = el("strong", {}, "BLOCKED");
  else if (l.allowed) now = "a request would pass";
  else now = el("strong", {}, `LIMITED, ${l.retry_after_seconds < 0 ? "never at this cost" : "retry in " + seconds(l.retry_after_seconds)}`);
  const block = l.blocked
    ? `until ${l.blocked.until.slice(11, 19)} UTC (${seconds(l.blocked.remaining_s)} left, started by ${l.blocked.by})`
    : "—";
  const shared = l.shared_by_everyone ? " (shared by every caller)" : "";
  return row(l.blocked ? "blocked" : (l.allowed ? "ok" : "limited"),
    el("td", { class: "now" }, now),
    el("td", { class: "remaining" }, `${l.remaining} of ${l.limit}${l.allowed && !l.blocked ? " after a request" : ""}${l.overridden && l.configured_limit !== undefined && l.configured_limit !== l.limit ? ` (configured: ${l.configured_limit})` : ""}${shared}`),
    el("td", { class: "reset" }, `in ${seconds(l.reset_after_seconds)} (${inSeconds(l.reset_after_seconds)})`),
    el("td", { class: "block" }, block),
    el("td", { class: "override" }, l.overridden ? (overrideText(l.override) || override || "overridden") : "—"));
}

// An override as the panel shows it: what it sets, until when.
function overrideText(o) {
  if (!o) return null;
  const what = o.limit !== null && o.limit !== undefined ? `limit ${o.limit}` : `×${o.multiply}`;
  const on = o.limit_name ? ` on ${o.limit_name}` : " on every limit";
  return `${what}${on} until ${o.until.replace("T", " ").replace(/\.\d+Z$/, " UTC")}`;
}

function message(text, kind) {
  const node = document.getElementById("message");
  node.textContent = text;
  node.className = kind;
}

// Calls the admin API with the page's token; says in the message line how it went. Returns
// the answer's JSON when it succeeded, null otherwise.
async function act(method, path, params, what, done) {
  const token = document.getElementById("token").value.trim();
  const headers = {};
  if (token) headers.Authorization = `Bearer ${token}`;
  const query = new URLSearchParams(params).toString();
  let result = null;
  try {
    const response = await fetch(`${path}?${query}`, { method, headers, cache: "no-store", credentials: "omit" });
    const body = await response.json().catch(() => ({}));
    if (response.ok) {
      message(done ? done(body) : `${what}: done`, "done");
      result = body;
    } else if (response.status === 403) {
      message(`${what} refused (403): ${body.error || "not allowed"}`, "refused");
    } else {
      message(`${what} failed (${response.status}): ${body.error || "error"}`, "refused");
    }
  } catch (e) {
    message(`${what} failed: ${e.message}`, "refused");
  }
  if (params.dry_run !== "true") {
    if (lastCaller !== null) renderCaller(lastCaller, false);
    renderAudit(true).catch(() => {});
    renderOverrides().catch(() => {});
  }
  return result;
}

// A choice of the route's limits: `every` names what no choice does, `ask` a first option
// that is no choice (the operator must say which).
function limitChoice(cls, names, every, ask) {
  const select = el("select", { class: cls });
  if (ask) select.append(el("option", { value: "" }, ask));
  select.append(el("option", { value: "*" }, every));
  for (const name of names) select.append(el("option", { value: name }, `limit ${name}`));
  return select;
}

function withLimit(params, choice) {
  if (choice !== "*" && choice !== "") params.limit_name = choice;
  return params;
}

// What an override will make of each limit (its answer's `limits`), as a table.
function overrideTable(limits) {
  const table = el("table", { class: "override-preview" },
    el("thead", {}, el("tr", {}, ...["limit", "period", "now", "will be", ""].map((h) => el("th", {}, h)))));
  const body = el("tbody");
  for (const l of limits) {
    const note = !l.changed ? "unchanged" : (l.scaled ? "scaled in proportion" : "as given");
    body.append(el("tr", { class: `override-limit ${l.changed ? "changed" : "unchanged"}`, "data-limit": l.name },
      el("td", { class: "name" }, l.tier ? `${l.name} (tier ${l.tier})` : l.name),
      el("td", {}, l.period),
      el("td", {}, l.before),
      el("td", { class: "after" }, l.after),
      el("td", { class: "muted small" }, note)));
  }
  table.append(body);
  return table;
}

function actionsFor(route, identity, names) {
  const box = el("div", { class: "actions" });
  // Reset: the operator says which limit (every limit hands out a fresh month too).
  const resetWhich = limitChoice("reset-limit", names, "every limit", "which limit?");
  const reset = el("button", { type: "button", class: "reset", "data-route": route }, "reset");
  reset.addEventListener("click", () => {
    if (resetWhich.value === "") {
      message(`reset of ${route}: choose which limit to reset`, "refused");
      return;
    }
    const which = resetWhich.value === "*" ? "" : ` (limit ${resetWhich.value})`;
    act("POST", "/limits/reset", withLimit({ route, identity }, resetWhich.value), `reset of ${route}${which}`);
  });
  // Override: previewed (dry_run) before it is applied; any change asks for a new preview.
  // Override: one named limit unless the operator picks every limit (in proportion).
  const which = limitChoice("override-limit", names, "every limit (in proportion)", null);
  if (names.length > 0) which.value = names[0];
  const how = el("select", { class: "override-how" },
    el("option", { value: "multiply" }, "× multiply"), el("option", { value: "limit" }, "limit ="));
  const amount = el("input", { class: "override-amount", type: "text", size: 5, value: "10" });
  const duration = el("input", { class: "override-for", type: "text", size: 5, value: "1h" });
  const preview = el("button", { type: "button", class: "preview", "data-route": route }, "preview");
  const apply = el("button", { type: "button", class: "override", "data-route": route, disabled: true }, "apply");
  const shown = el("div", { class: "preview-box", "data-route": route });
  const params = () => {
    const p = withLimit({ route, identity, for: duration.value.trim() }, which.value);
    p[how.value] = amount.value.trim();
    return p;
  };
  const stale = () => {
    apply.disabled = true;
    clear(shown);
  };
  for (const input of [which, how, amount, duration]) {
    input.addEventListener("input", stale);
    input.addEventListener("change", stale);
  }
  preview.addEventListener("click", async () => {
    stale();
    const p = params();
    p.dry_run = "true";
    const answer = await act("POST", "/limits/override", p, `preview of the override on ${route}`,
      () => `preview of the override on ${route}: nothing changed yet; apply to make it so`);
    if (answer && Array.isArray(answer.limits)) {
      shown.append(el("p", { class: "small" }, `for ${duration.value.trim()}, each limit would become:`), overrideTable(answer.limits));
      apply.disabled = false;
    }
  });
  apply.addEventListener("click", async () => {
    apply.disabled = true;
    const answer = await act("POST", "/limits/override", params(), `override of ${route}`,
      (body) => `override of ${route}: done, until ${body.override ? body.override.until : "?"}`);
    clear(shown);
    if (answer && Array.isArray(answer.limits)) shown.append(el("p", { class: "small" }, "applied:"), overrideTable(answer.limits));
  });
  const remove = el("button", { type: "button", class: "unoverride", "data-route": route }, "end override");
  remove.addEventListener("click", () =>
    act("DELETE", "/limits/override", withLimit({ route, identity }, which.value), `end of the override on ${route}`));
  box.append(resetWhich, reset, el("span", { class: "sep" }, "|"), "override ", which, how, amount, " for ", duration, preview, apply, " ", remove);
  if (actions === "off") {
    box.append(el("span", { class: "muted small" }, " (actions are off: no admin token is configured and the listener is not loopback)"));
  }
  const outer = el("div", {}, box, shown);
  return outer;
}

// A caller's state on a route; `known`: false where the caller could not be found (a short
// form no value of that route has), which is no fault.
function stateOf(state, known) {
  const box = el("div", { class: "state" });
  if (state.error && known === false) {
    // The API's reason (where it looked) on hover: the line itself says what matters.
    box.append(el("p", { class: "muted", title: state.error }, "no caller of this route has this short form"));
    return box;
  }
  if (state.error) {
    box.append(el("p", { class: "bad" }, state.error));
    return box;
  }
  if (state.limits.length === 0) {
    box.append(el("p", { class: "muted" }, "no limit applies to this value"));
    return box;
  }
  const override = overrideText(state.override);
  const table = el("table", { class: "limits" },
    el("thead", {}, el("tr", {}, ...["limit", "now", "remaining", "full again", "block", "override"].map((h) => el("th", {}, h)))));
  const body = el("tbody");
  for (const l of state.limits) body.append(limitRow(l, override));
  table.append(body);
  box.append(table);
  return box;
}

// Draws the caller's routes (fresh: on a new lookup), or updates their state and explanation
// in place (on a refresh, so that what the operator types in the action fields stays).
async function renderCaller(identity, fresh) {
  const target = document.getElementById("caller");
  let answer;
  try {
    answer = await getJson(`/console/api/caller?identity=${encodeURIComponent(identity)}`);
  } catch (e) {
    message(`lookup failed: ${e.message}`, "refused");
    return;
  }
  if (identity !== lastCaller) return;
  if (!answer.ok) {
    message(`lookup failed: ${answer.body.error || answer.status}`, "refused");
    return;
  }
  const data = answer.body;
  if (fresh) {
    clear(target);
    // Which lookup the panel shows (a new lookup of the same heading is told apart by it).
    target.setAttribute("data-for", identity);
    target.append(el("h3", {}, `caller ${data.identity}`));
  }
  for (const route of data.routes) {
    const explained = route.explain;
    const text = explained ? explained.text + (explained.note ? `\nnote: ${explained.note}\n` : "") : null;
    let box = fresh ? null : target.querySelector(`.caller-route[data-route="${CSS.escape(route.route)}"]`);
    if (box) {
      box.querySelector(".state").replaceWith(stateOf(route.state, explained !== null));
      const pre = box.querySelector(".explain pre");
      if (pre && text !== null) pre.textContent = text;
      continue;
    }
    box = el("div", { class: "caller-route", "data-route": route.route });
    const here = route.state.identity && route.state.identity !== data.identity
      ? el("span", { class: "muted small" }, ` (this route shows them as ${route.state.identity})`)
      : null;
    box.append(el("h4", {}, `route ${route.route}`, here), stateOf(route.state, explained !== null));
    if (explained) {
      const details = el("details", { class: "explain" },
        el("summary", {}, "explain a request of theirs"), el("pre", {}, text));
      const names = [...new Set((route.state.limits || []).map((l) => l.limit_name))];
      box.append(details, actionsFor(route.route, identity, names));
    }
    target.append(box);
  }
  if (fresh) message("", "");
}

function lookUp(identity) {
  lastCaller = identity;
  message("looking up…", "muted");
  renderCaller(identity, true);
}

// The caller the address names (#caller=VALUE), if any.
function linkedCaller() {
  return new URLSearchParams(location.hash.slice(1)).get("caller");
}

// Shows `identity`'s panel: through the address, so that back, forward and a shared link
// show the same caller.
function show(identity) {
  if (location.hash === callerHash(identity)) lookUp(identity);
  else location.hash = callerHash(identity);
}

function followAddress() {
  const linked = linkedCaller();
  if (linked && linked !== lastCaller) {
    document.getElementById("identity").value = linked;
    lookUp(linked);
    document.getElementById("search-section").scrollIntoView();
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const identity = document.getElementById("identity").value.trim();
    if (identity) show(identity);
  });
  // A chart redrawn under a pointer that has left it shows no hovered sample.
  document.addEventListener("mousemove", (event) => {
    if (!(event.target instanceof Element) || !event.target.closest("svg.chart")) hovered.clear();
  });
  window.addEventListener("hashchange", followAddress);
  document.getElementById("audit-filter").addEventListener("input", renderAuditRows);
  followAddress();
  refresh();
  setInterval(refresh, REFRESH_MS);
});
