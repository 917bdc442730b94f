// ctxprec view: the row table of one output (or two, paired by id) over the server's JSON API.
// Every value from the output reaches the page as text (textContent, createElement): never as
// markup, so a query, item or reason holding <script> or " onload= shows as what it is.
"use strict";

const S = {
  info: null, view: "a", q: "", status: "", band: "", group: "", sort: "", size: 50,
  page: 1, changed: false, total: 0, groups: [], seq: 0,
};

// control and bidi characters as escapes, as the reports show them: "\u202egnp.exe" must not
// read "exe.png", nor a value hide or reorder its neighbours
const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

function shown(value) {
  return String(value).replace(HIDDEN, (c) => {
    const code = c.charCodeAt(0);
    return code < 0x100 ? "\\x" + code.toString(16).padStart(2, "0") : "\\u" + code.toString(16).padStart(4, "0");
  });
}

function el(tag, cls, ...children) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : shown(child));
  }
  return node;
}

function $(id) { return document.getElementById(id); }

function num(value) {
  if (value === null || value === undefined) return "n/a";
  if (typeof value !== "number") return String(value);
  return Number.isInteger(value) ? value.toLocaleString("en-US") : String(value);
}

function signed(value) {
  if (value === null || value === undefined) return "n/a";
  const text = num(Math.round(value * 10000) / 10000);
  return value > 0 ? "+" + text : text;
}

function chip(text, cls) { return el("span", "chip " + cls, text); }

async function api(path, params) {
  const query = params ? "?" + new URLSearchParams(params).toString() : "";
  const response = await fetch(path + query, { headers: { Accept: "application/json" } });
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  if (!response.ok) {
    const why = data && data.error ? data.error : response.status + " " + response.statusText;
    throw new Error(why);
  }
  return data;
}

function showProblem(message) {
  const box = $("problem");
  box.hidden = !message;
  box.textContent = shown(message || "");
}

// -- the head: reports, figures, tabs ------------------------------------------------------
function renderReports(info) {
  const nav = $("reports");
  nav.replaceChildren();
  info.outputs.forEach((out, i) => {
    if (!out.summary_html) return;
    const a = el("a", null, info.outputs.length > 1 ? "summary.html (" + "AB"[i] + ")" : "summary.html");
    a.href = i === 0 ? "/summary.html" : "/b/summary.html";
    nav.append(a);
  });
}

function figure(name, label, value) {
  const box = el("div", null, el("dt", null, label), el("dd", null, num(value)));
  box.dataset.figure = name;
  box.querySelector("dd").dataset.value = value === null || value === undefined ? "" : String(value);
  return box;
}

function renderFigures(info) {
  const box = $("figures");
  box.replaceChildren();
  info.outputs.forEach((out, i) => {
    const s = out.summary || {};
    const rows = s.rows || {};
    const score = s.score || {};
    const card = el("section", "output");
    card.dataset.side = out.side;
    const title = (info.outputs.length > 1 ? "AB"[i] + ": " : "") + out.outdir;
    card.append(el("h2", null, title));
    const figs = el("dl", "figs",
      figure("rows", "rows", rows.total !== undefined ? rows.total : out.rows),
      figure("mean", "mean", score.mean),
      figure("median", "median", score.median),
      figure("coverage", "coverage", s.coverage),
      figure("failed", "failed", rows.failed));
    card.append(figs);
    if (Array.isArray(s.bands)) {
      const bar = el("div", "bandbar");
      bar.setAttribute("role", "img");
      const words = [];
      for (const b of s.bands) {
        const part = el("span", null);
        part.style.width = (100 * (b.share || 0)) + "%";
        part.style.background = "var(--" + String(b.band).replace(/[^a-z]/g, "") + ")";
        part.title = shown(b.band + ": " + num(b.rows));
        bar.append(part);
        words.push(b.band + " " + num(b.rows));
      }
      bar.setAttribute("aria-label", "score bands: " + words.join(", "));
      card.append(bar);
    }
    box.append(card);
  });
}

function renderTabs(info) {
  const nav = $("tabs");
  if (info.outputs.length < 2) { nav.hidden = true; return; }
  nav.hidden = false;
  nav.replaceChildren();
  const tabs = [["a", "A rows"], ["b", "B rows"], ["compare", "Compare A ↔ B"]];
  for (const [view, label] of tabs) {
    const b = el("button", null, label);
    b.type = "button";
    b.setAttribute("role", "tab");
    b.dataset.view = view;
    b.setAttribute("aria-selected", String(S.view === view));
    b.addEventListener("click", () => { S.view = view; S.page = 1; S.sort = ""; setup(); load(); });
    nav.append(b);
  }
}

// -- controls --------------------------------------------------------------------------------
function options(select, items, value) {
  select.replaceChildren();
  for (const [v, label] of items) {
    const o = el("option", null, label);
    o.value = v;
    select.append(o);
  }
  select.value = value;
  if (select.value !== value) select.value = items.length ? items[0][0] : "";
}

const SORT_WORDS = {
  "": "file order", score: "score, lowest first", "-score": "score, highest first", id: "id",
  delta: "B − A, losses first", "-delta": "B − A, wins first", change: "largest change first",
};

function setup() {
  const info = S.info;
  const compare = S.view === "compare";
  const out = compare ? null : info.outputs["ab".indexOf(S.view)];
  renderTabs(info);
  options($("status"), [["", "any"], ...info.statuses.map((s) => [s, s])], S.status);
  options($("band"), [["", "any"], ...info.bands.map((b) => [b.band, b.band + " (" + b.range + ")"])], S.band);
  $("band").disabled = compare;
  S.groups = [];
  const groupItems = [["", "any"]];
  if (out) {
    for (const [column, values] of Object.entries(out.groups)) {
      for (const v of values) {
        S.groups.push([column, v.value]);
        const text = v.value === null ? "(null)" : v.value.length > 60 ? v.value.slice(0, 59) + "…" : v.value;
        groupItems.push([String(S.groups.length - 1), column + " = " + text + " (" + num(v.rows) + ")"]);
      }
    }
  }
  options($("group"), groupItems, S.group);
  $("group-label").hidden = S.groups.length === 0;
  $("changed-label").hidden = !compare;
  $("changed").checked = S.changed;
  const sorts = compare ? info.compare.sorts : info.sorts;
  options($("sort"), sorts.map((s) => [s, SORT_WORDS[s] || s]), S.sort);
  const sizes = [10, 25, 50, 100, info.page_size.max].filter((n, i, a) => n <= info.page_size.max && a.indexOf(n) === i);
  options($("size"), sizes.map((n) => [String(n), String(n)]), String(S.size));
  $("q").value = S.q;
  // an output without its query texts is searched by id only: the box and a line say so
  $("q").placeholder = out && out.search_note ? "id (this output keeps no query text)" : "id or query text";
  renderHead(out, compare);
}

function readControls() {
  S.q = $("q").value;
  S.status = $("status").value;
  S.band = $("band").value;
  S.group = $("group").value;
  S.sort = $("sort").value;
  S.size = parseInt($("size").value, 10) || 50;
  S.changed = $("changed").checked;
}

function saveHash() {
  const p = new URLSearchParams();
  for (const key of ["view", "q", "status", "band", "group", "sort", "size", "page"]) {
    const v = S[key];
    if (v !== "" && !(key === "view" && v === "a") && !(key === "page" && v === 1) && !(key === "size" && v === 50)) p.set(key, String(v));
  }
  if (S.changed) p.set("changed", "1");
  history.replaceState(null, "", p.toString() ? "#" + p.toString() : location.pathname);
}

function loadHash() {
  const p = new URLSearchParams(location.hash.slice(1));
  const views = S.info.outputs.length > 1 ? ["a", "b", "compare"] : ["a"];
  if (views.includes(p.get("view"))) S.view = p.get("view");
  for (const key of ["q", "status", "band", "group", "sort"]) if (p.has(key)) S[key] = p.get(key);
  const size = parseInt(p.get("size") || "", 10);
  if (size > 0 && size <= S.info.page_size.max) S.size = size;
  const page = parseInt(p.get("page") || "", 10);
  if (page > 0) S.page = page;
  S.changed = p.get("changed") === "1";
}

// -- the table -------------------------------------------------------------------------------
function renderHead(out, compare) {
  const cols = compare
    ? ["id", "query", "score A", "score B", "B − A", "status A", "status B"]
    : ["id", out && out.query_column ? "query" : null, ...(out ? Object.keys(out.groups) : []), "score", "band", "status", "relevant", "items"];
  const narrow = new Set(["items", "band", "relevant", "status A", "status B", ...(out ? Object.keys(out.groups) : [])]);
  const tr = el("tr", null);
  for (const c of cols) {
    if (c === null) continue;
    const th = el("th", null, c);
    th.scope = "col";
    if (narrow.has(c)) th.className = "hide-narrow";
    if (c.startsWith("score") || c === "B − A" || c === "relevant") th.classList.add("num");
    tr.append(th);
  }
  $("rows").tHead.replaceChildren(tr);
}

function strip(verdicts) {
  const box = el("span", "strip");
  box.setAttribute("aria-label", verdicts.map((v) => (v === true ? "relevant" : v === false ? "not relevant" : "unjudged")).join(", "));
  for (const v of verdicts.slice(0, 30)) box.append(el("i", v === true ? "y" : v === false ? "n" : null));
  return box;
}

function cell(content, cls) { return el("td", cls, content); }

function rowLine(out, row) {
  const tr = el("tr", null);
  tr.tabIndex = 0;
  tr.dataset.id = String(row.id);
  tr.append(cell(String(row.id), "id"));
  if (out.query_column) tr.append(cell(row.query === null ? "" : row.query, "query"));
  for (const column of Object.keys(out.groups)) tr.append(cell(row[column] === null || row[column] === undefined ? "" : String(row[column]), "hide-narrow"));
  tr.append(cell(num(row.score), "num score" + (row.band ? " band-" + row.band : "")));
  tr.append(cell(row.band ? chip(row.band, "band-" + row.band) : "", "hide-narrow"));
  const status = el("td", null, chip(row.status, "st-" + row.status));
  if (row.error) status.title = shown(row.error);
  tr.append(status);
  tr.append(cell(row.relevant_count === null ? "" : num(row.relevant_count) + " / " + num(row.context_count), "num hide-narrow"));
  tr.append(cell(Array.isArray(row.verdicts) ? strip(row.verdicts) : "", "hide-narrow"));
  const open = () => openRow(S.view, row.id);
  tr.addEventListener("click", open);
  tr.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(); } });
  return tr;
}

function pairLine(row) {
  const tr = el("tr", null);
  tr.tabIndex = 0;
  tr.dataset.id = String(row.id);
  tr.append(cell(String(row.id), "id"));
  tr.append(cell(row.query === null ? "" : row.query, "query"));
  tr.append(cell(num(row.score_a), "num"));
  tr.append(cell(num(row.score_b), "num"));
  tr.append(cell(signed(row.delta), "num " + (row.delta > 0 ? "up" : row.delta < 0 ? "down" : "")));
  tr.append(cell(chip(row.status_a, "st-" + row.status_a), "hide-narrow"));
  tr.append(cell(chip(row.status_b, "st-" + row.status_b), "hide-narrow"));
  const open = () => openPair(row.id);
  tr.addEventListener("click", open);
  tr.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); open(); } });
  return tr;
}

function params() {
  const p = { page: String(S.page), size: String(S.size) };
  if (S.q.trim()) p.q = S.q.trim();
  if (S.status) p.status = S.status;
  if (S.sort) p.sort = S.sort;
  if (S.view === "compare") {
    if (S.changed) p.changed = "1";
    return p;
  }
  p.side = S.view;
  if (S.band) p.band = S.band;
  if (S.group !== "" && S.groups[Number(S.group)]) {
    const [column, value] = S.groups[Number(S.group)];
    p.group_by = column;
    p.group = value === null ? "" : value;
  }
  return p;
}

async function load() {
  const seq = ++S.seq;
  saveHash();
  const compare = S.view === "compare";
  let data;
  try {
    data = await api(compare ? "/api/compare" : "/api/rows", params());
  } catch (e) {
    if (seq === S.seq) showProblem("The server could not answer: " + e.message);
    return;
  }
  if (seq !== S.seq) return; // a newer query is on its way
  showProblem("");
  $("search-note").hidden = !data.note;
  $("search-note").textContent = data.note || "";
  S.total = data.total;
  const pages = Math.max(1, Math.ceil(data.total / S.size));
  if (S.page > pages && data.total > 0) { S.page = pages; load(); return; }
  const body = $("rows").tBodies[0];
  body.replaceChildren();
  const out = compare ? null : S.info.outputs["ab".indexOf(S.view)];
  for (const row of data.rows) body.append(compare ? pairLine(row) : rowLine(out, row));
  if (!data.rows.length) {
    const td = el("td", "empty", "No rows match.");
    td.colSpan = $("rows").tHead.rows[0].cells.length;
    body.append(el("tr", null, td));
  }
  const first = data.total ? (S.page - 1) * S.size + 1 : 0;
  const last = Math.min(S.page * S.size, data.total);
  const what = compare ? "pairs" : "rows";
  $("count").textContent = data.total
    ? what + " " + num(first) + "–" + num(last) + " of " + num(data.total)
    : "0 " + what;
  $("count").dataset.total = String(data.total);
  $("where").textContent = "page " + num(S.page) + " of " + num(pages);
  $("first").disabled = $("prev").disabled = S.page <= 1;
  $("next").disabled = $("last").disabled = S.page >= pages;
}

// -- one row ---------------------------------------------------------------------------------
function kv(pairs) {
  const dl = el("dl", "kv");
  for (const [k, v] of pairs) {
    if (v === null || v === undefined || v === "") continue;
    dl.append(el("dt", null, k), el("dd", null, v instanceof Node ? v : String(v)));
  }
  return dl;
}

function itemList(row) {
  const list = el("ol", "items");
  for (const item of row.items) {
    const cls = item.verdict === true ? "item y" : item.verdict === false ? "item n" : "item";
    const verdict = item.verdict === true ? "relevant" : item.verdict === false ? "not relevant" : "not judged";
    const head = el("div", "item-head", el("b", null, "#" + item.position), el("span", null, verdict));
    if (item.gain !== null) {
      head.append(el("span", null, "P@" + item.position + " = " + num(Math.round(item.precision * 10000) / 10000)));
      head.append(el("span", null, "adds " + num(Math.round(item.gain * 10000) / 10000) + " to AP"));
    }
    if (item.label !== null) head.append(el("span", null, "label: " + (item.label ? "relevant" : "not relevant")));
    const li = el("li", cls, head);
    if (item.text !== null) li.append(el("p", "text", item.text));
    if (item.reason !== null) li.append(el("p", "muted", "Judge: ", item.reason));
    list.append(li);
  }
  return list;
}

function rowBody(row) {
  const box = el("div", "side");
  box.append(kv([
    ["score", num(row.score)], ["band", row.band], ["status", row.status], ["query", row.query], ["error", row.error],
  ]));
  box.append(el("h3", null, "Items, in rank order"));
  if (!row.items.length) box.append(el("p", "note", "No context items."));
  else box.append(itemList(row));
  if (row.items_total > row.items.length) box.append(el("p", "note", num(row.items_total - row.items.length) + " more items not shown."));
  if (!row.texts && row.items.length) box.append(el("p", "note", "The output holds verdicts and reasons, not the item texts: score with --passthrough naming the context column to see them here."));
  if (row.reason) { box.append(el("h3", null, "Reason")); box.append(el("p", "text", row.reason)); }
  box.append(el("h3", null, "Columns"));
  box.append(kv(row.fields));
  return box;
}

function openDialog(title, body) {
  $("detail-title").textContent = shown(title);
  $("detail-body").replaceChildren(body);
  const dialog = $("detail");
  if (!dialog.open) dialog.showModal();
}

async function openRow(side, id) {
  try {
    const row = await api("/api/row/" + encodeURIComponent(String(id)), { side });
    openDialog((S.info.outputs.length > 1 ? side.toUpperCase() + " · " : "") + "row " + row.id, rowBody(row));
  } catch (e) { showProblem("The row could not be read: " + e.message); }
}

async function openPair(id) {
  try {
    const pair = await api("/api/pair/" + encodeURIComponent(String(id)));
    const grid = el("div", "pair");
    for (const [name, row] of [["A", pair.a], ["B", pair.b]]) {
      const col = el("div", "side", el("h3", null, name + ": " + S.info.outputs["AB".indexOf(name)].outdir));
      col.append(row ? rowBody(row) : el("p", "note", "No row with this id in " + name + "."));
      grid.append(col);
    }
    openDialog("row " + pair.id + " · B − A = " + signed(pair.delta), grid);
  } catch (e) { showProblem("The pair could not be read: " + e.message); }
}

// -- wiring ----------------------------------------------------------------------------------
function wire() {
  let timer = null;
  $("q").addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => { readControls(); S.page = 1; load(); }, 250);
  });
  for (const id of ["status", "band", "group", "sort", "size", "changed"]) {
    $(id).addEventListener("change", () => { readControls(); S.page = 1; load(); });
  }
  $("controls").addEventListener("submit", (e) => { e.preventDefault(); readControls(); S.page = 1; load(); });
  $("first").addEventListener("click", () => { S.page = 1; load(); });
  $("prev").addEventListener("click", () => { S.page = Math.max(1, S.page - 1); load(); });
  $("next").addEventListener("click", () => { S.page += 1; load(); });
  $("last").addEventListener("click", () => { S.page = Math.max(1, Math.ceil(S.total / S.size)); load(); });
  $("close").addEventListener("click", () => $("detail").close());
  $("detail").addEventListener("click", (e) => { if (e.target === $("detail")) $("detail").close(); });
}

async function start() {
  wire();
  try {
    S.info = await api("/api/info");
  } catch (e) {
    showProblem("The server could not describe the output: " + e.message);
    return;
  }
  loadHash();
  renderReports(S.info);
  renderFigures(S.info);
  setup();
  await load();
  document.body.dataset.ready = "1";
}

document.addEventListener("DOMContentLoaded", start);
