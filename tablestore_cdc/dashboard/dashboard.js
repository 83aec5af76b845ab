// tablestore-cdc dashboard: polls /api/progress every second and renders it.
// The document shape is $defs/snapshot of docs/progress-feed.schema.json (schema_version 1).
// All text goes through textContent (namespaces and ids come from the meta store).
"use strict";

const POLL_MS = 1000;
const SVG_NS = "http://www.w3.org/2000/svg";
let polls = 0;

function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// the smallest retention headroom of any channel (docs/resnapshot.md): hours before the
// service trims an unread change, flagged once a change is past 80 % of the retention
function retentionNote(lags) {
  const known = lags.filter(l => l.headroom_s !== undefined && l.headroom_s !== null);
  if (!known.length) return "";
  const least = Math.min(...known.map(l => l.headroom_s));
  const warn = known.some(l => l.retention_warning);
  return ` · ${warn ? "WARNING: " : ""}retention headroom ${fmtNum(least / 3600, 1)} h`;
}

function fmtNum(v, digits) {
  if (v === null || v === undefined) return "–";
  return Number(v).toLocaleString(undefined, { maximumFractionDigits: digits ?? 0 });
}

function fmtTime(epoch) {
  if (epoch === null || epoch === undefined) return "–";
  return new Date(epoch * 1000).toLocaleTimeString(undefined, { hour12: false });
}

function badge(text) { return el("span", { class: "badge " + (text || "") }, text || "?"); }

function setStatus(state, text) {
  const s = $("status");
  s.className = "status " + state;
  $("status-text").textContent = text;
}

function fmtAge(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

// The query's state (snapshot.activity), not the page's connection: a stopped query must not
// look alive. Returns the status line's text.
function queryStatus(snap) {
  const a = snap.activity || { state: "waiting" };
  document.body.dataset.queryState = a.state;
  const commit = a.last_commit_age_s === null ? "no commit yet"
    : `last commit ${fmtAge(a.last_commit_age_s)} ago`;
  switch (a.state) {
    case "live": return `live · ${commit}`;
    case "idle": return `idle (caught up) · ${commit}`;
    case "stale": return `stale: no progress for ${fmtAge(a.last_commit_age_s)} while records are behind, or the job's status is not refreshed — is the job running?`;
    case "unreachable": return `${a.reason || "source unreachable"} · ${commit}`;
    case "stopped": {
      const ago = a.stopped_at === null ? "" : ` ${fmtAge(snap.generated_at - a.stopped_at)} ago`;
      return `query stopped${ago}${a.reason ? " with an error" : ""} · ${commit}`;
    }
    case "restarting": return `restarting (${a.reason || "after a failure"}) · ${commit}`;
    case "failed": return `failed: ${a.reason || "see the job's log"} · ${commit}`;
    default: return "waiting for the first committed batch";
  }
}

function showError(message) {
  const box = $("error");
  box.hidden = !message;
  box.textContent = message || "";
}

function renderCards(snap) {
  $("batch-count").textContent = fmtNum(snap.batch_count);
  document.body.dataset.batchCount = String(snap.batch_count);
  $("state-counts").textContent = Object.entries(snap.state_counts)
    .map(([state, n]) => `${n} ${state}`).join(" · ");
  const tp = snap.throughput;
  const running = ["live", "idle"].includes((snap.activity || {}).state);
  $("rows-per-second").textContent = tp.rows_per_second === null ? "–"
    : fmtNum(tp.rows_per_second, 1) + " rows/s";
  $("rows-per-second").classList.toggle("frozen", !running);
  // the caption names exactly the rows and seconds the rate divides
  $("window").textContent = tp.rows_per_second === null
    ? `${tp.window_batches} committed batch(es)`
    : `${fmtNum(tp.rate_records)} rows / ${fmtNum(tp.seconds, 1)} s` +
      (tp.window_batches > 1 ? ` between ${tp.window_batches} batch commits` : " (one batch)") +
      (running ? "" : " · when last running");
  const real = snap.batches.filter(b => !b.initial);
  const last = real.length ? real[real.length - 1] : null;
  $("latest-batch").textContent = last ? `${last.uuid.slice(0, 8)}… ${last.state}` : "–";
  $("latest-batch-sub").textContent = last
    ? `spark id ${last.spark_batch_id ?? "?"} · ${last.records} rows · ${last.channel_count} channel(s)`
    : "no batch yet";
  // the figures of Spark's progress report: a total only when every channel's count is known
  // (Tablestore counts only near the head), the oldest unread change of any channel
  const lags = snap.channels.map(c => c.lag).filter(l => l);
  const counted = lags.length > 0 && lags.every(l => l.records_behind !== null);
  $("total-lag").textContent = counted
    ? fmtNum(lags.reduce((a, l) => a + l.records_behind, 0)) : "–";
  const aged = lags.filter(l => l.seconds_behind !== null);
  const oldest = Math.max(0, ...aged.map(l => l.seconds_behind));
  const reading = ["live", "idle", "waiting"].includes((snap.activity || {}).state);
  $("lag-sub").textContent = (aged.length ? `oldest unread change ${fmtNum(oldest, 1)} s old`
    : (snap.tunnel_error ? "tunnel unavailable" : "unknown")) +
    (aged.length && !counted ? " · records not counted" : "") +
    (aged.length && !reading ? " · nobody is reading" : "") + retentionNote(aged);
  const q = snap.query;
  $("spark-rate").textContent = q ? `${fmtNum(q.processed_rows_per_second, 1)} processed/s` : "–";
  $("spark-sub").textContent = q
    ? `batch ${q.batch_id} · ${fmtNum(q.input_rows_per_second, 1)} input/s · ${fmtNum(q.batch_duration_ms)} ms`
    : "no ProgressListener data";
  // the newest resnapshot signal (docs/resnapshot.md): running n %, or how the last one ended
  const r = (snap.resnapshots || []).slice(-1)[0];
  $("resnapshot").textContent = r
    ? `${r.state}${r.state === "running" && r.percent !== null ? ` ${fmtNum(r.percent, 0)} %` : ""}`
    : "none";
  $("resnapshot-sub").textContent = r
    ? `${r.table} · ${r.origin}` + Object.entries(r.counts).map(([k, v]) => ` · ${k} ${v}`).join("")
    : "";
  // the table's status as `replicate` recorded it (table_status): target version and the
  // newest schema change it made (what, when, the version of that commit)
  const t = snap.table_status;
  $("target-version").textContent = t
    ? (t.target_version === null ? "no commit yet" : `version ${t.target_version}`)
    : "–";
  $("schema-change").textContent = !t ? "no replicate job recorded"
    : t.last_schema_change === null ? "no schema change yet"
      : `last schema change: ${t.last_schema_change} · ${fmtAge(snap.generated_at - t.last_schema_change_at)} ago` +
        ` · version ${t.last_schema_change_version}`;
  // the job's own maintenance of the target (lakehouse/upkeep.py): when, and what it did
  // (files before -> after, snapshots expired, unreferenced files removed) or why it failed
  $("maintenance").textContent = !t ? ""
    : !t.last_maintenance_at ? "no maintenance yet"
      : `maintenance ${fmtAge(snap.generated_at - t.last_maintenance_at)} ago: ${t.last_maintenance}`;
}

function renderChart(snap) {
  const svg = $("throughput-chart");
  const width = Math.max(200, Math.round(svg.getBoundingClientRect().width || 800));
  const height = 160, top = 14, bottom = 18, left = 4;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.replaceChildren();
  const series = snap.throughput.series.filter(p => p.rows_per_second !== null);
  const axis = document.createElementNS(SVG_NS, "line");
  Object.entries({ x1: 0, x2: width, y1: height - bottom, y2: height - bottom, class: "axis" })
    .forEach(([k, v]) => axis.setAttribute(k, v));
  svg.append(axis);
  if (!series.length) {
    const t = document.createElementNS(SVG_NS, "text");
    t.setAttribute("x", 8); t.setAttribute("y", height / 2);
    t.textContent = "waiting for committed batches…";
    svg.append(t);
    return;
  }
  const max = Math.max(...series.map(p => p.rows_per_second), 1);
  const slot = (width - left) / Math.max(series.length, 10);
  series.forEach((p, i) => {
    const h = (height - top - bottom) * p.rows_per_second / max;
    const rect = document.createElementNS(SVG_NS, "rect");
    rect.setAttribute("class", "bar");
    rect.setAttribute("x", (left + i * slot + slot * 0.15).toFixed(1));
    rect.setAttribute("y", (height - bottom - h).toFixed(1));
    rect.setAttribute("width", Math.max(1, slot * 0.7).toFixed(1));
    rect.setAttribute("height", Math.max(0.5, h).toFixed(1));
    const title = document.createElementNS(SVG_NS, "title");
    title.textContent = `batch ${p.spark_batch_id ?? p.uuid.slice(0, 8)}: ` +
      `${fmtNum(p.rows_per_second, 1)} rows/s, ${p.records} rows`;
    rect.append(title);
    svg.append(rect);
  });
  const label = document.createElementNS(SVG_NS, "text");
  label.setAttribute("x", 6); label.setAttribute("y", 11);
  label.textContent = `max ${fmtNum(max, 1)} rows/s`;
  const foot = document.createElementNS(SVG_NS, "text");
  foot.setAttribute("x", 6); foot.setAttribute("y", height - 4);
  foot.textContent = `last ${series.length} committed batch(es)`;
  svg.append(label, foot);
}

function renderChannels(snap) {
  const body = $("channels").querySelector("tbody");
  body.replaceChildren(...snap.channels.map(c => {
    const lag = c.lag || {};
    return el("tr", { "data-channel": c.channel_id, "data-status": c.status || "",
                      "data-consumed": c.consumed ?? "" },
      el("td", { class: "mono" }, c.channel_id),
      el("td", {}, c.status ? badge(c.status) : "–"),
      el("td", { class: "mono" }, c.parent_ids.join(", ") || "–"),
      el("td", { class: "num" }, fmtNum(c.consumed)),
      el("td", { class: "num" }, c.latest ? fmtNum(c.latest.records) : "–"),
      el("td", { class: "num" }, c.pushed ? (c.pushed.finished ? "finished" : fmtNum(c.pushed.sequence_number)) : "–"),
      el("td", { class: "num" }, fmtNum(lag.records_behind)),
      el("td", { class: "num" }, fmtNum(lag.seconds_behind, 1)),
      el("td", { class: "mono" }, c.waiting_for.join(", ") || (c.status === "WAIT" ? "(parents unknown)" : "")));
  }));
  if (!snap.channels.length) {
    body.append(el("tr", {}, el("td", { colspan: 9, class: "muted" },
      snap.tunnel_error ? `tunnel unavailable: ${snap.tunnel_error}` : "no channels yet")));
  }
}

function renderTree(snap) {
  const build = nodes => el("ul", {}, ...nodes.map(n => el("li", { "data-channel": n.channel_id },
    el("span", { class: "mono" }, n.channel_id), " ", n.status ? badge(n.status) : null,
    n.waiting_for.length ? el("span", { class: "waiting" }, ` waiting for ${n.waiting_for.join(", ")}`) : null,
    n.also_under.length ? el("span", { class: "muted" }, ` (also child of ${n.also_under.join(", ")})`) : null,
    n.children.length ? build(n.children) : null)));
  $("tree").replaceChildren(snap.tree.length ? build(snap.tree) : el("span", { class: "muted" }, "–"));
}

function renderBatches(snap) {
  const rows = snap.batches.slice(-25).reverse();
  $("batches").querySelector("tbody").replaceChildren(...rows.map(b => {
    const t = b.times;
    const span = t.committed !== null && t.planned !== null ? t.committed - t.planned : null;
    return el("tr", { "data-uuid": b.uuid },
      el("td", { class: "num" }, b.initial ? "initial" : (b.spark_batch_id ?? "–")),
      el("td", { class: "mono", title: b.uuid }, b.uuid),
      el("td", {}, badge(b.state)),
      el("td", { class: "num" }, b.channel_count),
      el("td", { class: "num" }, fmtNum(b.records)),
      el("td", {}, fmtTime(t.planned)), el("td", {}, fmtTime(t.committed)), el("td", {}, fmtTime(t.pushed)),
      el("td", { class: "num" }, span === null ? "–" : fmtNum(span, 2)),
      el("td", { class: "mono" }, b.children_added.join(", ")));
  }));
}

function render(snap) {
  $("schema-version").textContent = snap.schema_version;
  if (!snap.namespace) {
    $("source").textContent = `${snap.meta_uri}: waiting for a query to write this meta store…`;
  } else {
    const info = snap.namespace_info || {};
    $("source").textContent = `${info.table ?? "?"} / tunnel ${info.tunnel ?? "?"} · ${snap.namespace} · meta ${snap.meta_uri}`;
  }
  renderCards(snap);
  renderChart(snap);
  renderChannels(snap);
  renderTree(snap);
  renderBatches(snap);
  const corrupt = (snap.corrupt || []).map(c => `corrupt meta row ${c.key} skipped (${c.reason})`);
  showError([snap.tunnel_error ? `tunnel: ${snap.tunnel_error}` : "", ...corrupt]
    .filter(Boolean).join(" · "));
}

// Several sources in one meta store: a table of them first; ?namespace=NS shows one.
const SELECTED = new URLSearchParams(window.location.search).get("namespace");

function sourceLink(ns) { return "?namespace=" + encodeURIComponent(ns); }

function sourcesText(n) { return `${n} source${n === 1 ? "" : "s"}`; }

function renderSources(doc) {
  document.body.dataset.view = "sources";
  document.body.dataset.sourceCount = String(doc.sources.length);
  $("source").textContent = `${sourcesText(doc.sources.length)} · meta ${doc.meta_uri}`;
  const body = $("sources").querySelector("tbody");
  body.replaceChildren(...doc.sources.map(src => {
    const a = src.activity || { state: "waiting" };
    return el("tr", { "data-namespace": src.namespace, "data-state": a.state },
      el("td", {}, el("a", { href: sourceLink(src.namespace) }, src.table ?? "?")),
      el("td", {}, src.tunnel ?? "?"),
      el("td", {}, badge(a.state)),
      el("td", {}, a.last_commit_age_s === null ? "no commit yet" : `${fmtAge(a.last_commit_age_s)} ago`),
      el("td", { class: "num" }, fmtNum(src.batch_count)),
      el("td", { class: "mono" }, src.namespace),
      el("td", { class: "muted" }, a.reason || ""));
  }));
}

// Each table a replicate job (--table or --tables) runs, as its driver recorded it
// (table_status of /api/sources: the record `tablestore-cdc meta tables` and the Prometheus
// metrics show too).
function renderTables(doc) {
  const rows = doc.sources.filter(src => src.table_status)
    .sort((a, b) => (a.table_status.job + "\0" + a.table_status.table)
      .localeCompare(b.table_status.job + "\0" + b.table_status.table));
  $("tables-panel").hidden = rows.length === 0;
  $("tables").querySelector("tbody").replaceChildren(...rows.map(src => {
    const t = src.table_status;
    const state = t.stale ? `${t.label} (not updated for ${fmtAge(t.age_s)})` : t.label;
    return el("tr", { "data-table": t.table, "data-state": t.state },
      el("td", {}, el("a", { href: sourceLink(src.namespace) }, t.table)),
      el("td", {}, badge(t.state), " ", el("span", { class: "muted" }, state === t.state ? "" : state)),
      el("td", { class: "num" }, fmtNum(t.records_behind)),
      el("td", { class: "num" }, t.seconds_behind === null ? "–" : t.seconds_behind.toFixed(1)),
      el("td", { class: "num" }, t.rows_per_second === null ? "–" : t.rows_per_second.toFixed(1)),
      el("td", {}, t.last_commit === null ? "no commit yet"
        : `${fmtAge(doc.generated_at - t.last_commit)} ago`),
      el("td", { class: "num", title: t.last_schema_change ? `last schema change: ${t.last_schema_change}` +
          ` (${fmtAge(doc.generated_at - t.last_schema_change_at)} ago, version ${t.last_schema_change_version})` : null },
        fmtNum(t.target_version),
        t.last_schema_change ? el("span", { class: "muted" }, " (schema changed)") : null),
      el("td", { class: "mono" }, `${t.selection} → ${t.job}`));
  }));
}

function showView(view) {
  for (const node of document.querySelectorAll("[data-view]")) {
    node.hidden = node.dataset.view !== view;
  }
}

async function getJson(url) {
  const response = await fetch(url, { cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

async function poll() {
  try {
    if (!SELECTED) {
      const doc = await getJson("api/sources");
      // the list first when there are several sources, or a table a replicate job records
      // (one too: --table T is a selection of one, and the list shows its table's status)
      if (doc.sources.length > 1 || doc.sources.some(src => src.table_status)) {
        showView("sources");
        renderSources(doc);
        renderTables(doc);
        polls += 1;
        document.body.dataset.polls = String(polls);
        const failing = doc.sources.filter(src => ["stale", "stopped", "restarting", "failed",
          "unreachable"].includes(src.table_status && src.table_status.stale ? "stale"
          : (src.table_status || src.activity || {}).state)).length;
        setStatus(failing ? "stale" : "live", sourcesText(doc.sources.length) +
          (failing ? ` · ${failing} not running` : "") + " · page updated " + fmtTime(doc.generated_at));
        showError("");
        return;
      }
    }
    showView("detail");
    document.body.dataset.view = "detail";
    $("all-sources").hidden = !SELECTED;
    const body = await getJson("api/progress" + (SELECTED ? sourceLink(SELECTED) : ""));
    render(body);
    polls += 1;
    document.body.dataset.polls = String(polls);
    setStatus((body.activity || {}).state || "waiting",
      queryStatus(body) + " · page updated " + fmtTime(body.generated_at));
  } catch (err) {
    setStatus("down", "dashboard disconnected");
    showError(String(err.message || err));
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

poll();
