// The console's page: hash routes (#/ runs, #/run/NAME, #/sweep/ID, #/clusters), each drawn from the JSON API
// (launcher/console/app.py) and refreshed every REFRESH_MS while it is shown. Text is always set as text, never
// as HTML: names, reasons and logs come from files a run wrote.
"use strict";
const REFRESH_MS = 2000;
const SWEEP_REFRESH_MS = 5000;  // a sweep's page reads every run's metrics for its figures
const STATES = ["PENDING", "RUNNING", "REQUEUED", "RECOVERING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                "UNKNOWN", "DAMAGED"];
let timer = null, charts = {}, logState = null, runsQuery = {page: 0}, earlier = false;
// The route shown (a view still drawing for an older one stops at its next await), the refresh under way, what the
// run page shows (its buttons' questions read it), and what the last action said for the page it leads to.
let generation = 0, inFlight = null, runInfo = null, notice = null;
const gone = gen => gen !== generation;

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (value !== null && value !== undefined && value !== false) el.setAttribute(key, value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

async function api(path, options) {
  const response = await fetch(path, {credentials: "same-origin", ...(options || {})});
  const body = await response.json().catch(() => ({error: `${response.status} ${response.statusText}`}));
  if (!response.ok && !body.error) body.error = `${response.status}`;
  return body;
}

const num = (v, digits) => v === null || v === undefined ? "" : v !== 0 && Math.abs(v) < 0.01
  ? Number(v).toPrecision(3) : Number(v).toLocaleString(undefined, {maximumFractionDigits: digits === undefined ? 0 : digits});
const pct = v => v === null || v === undefined ? "" : (100 * v).toFixed(1) + "%";
function age(t) {
  const s = Date.now() / 1000 - t;
  if (s < 90) return Math.round(s) + "s";
  if (s < 5400) return Math.round(s / 60) + "m";
  if (s < 129600) return Math.round(s / 3600) + "h";
  return Math.round(s / 86400) + "d";
}
function statusCell(status, reason) {
  return h("td", {class: "status-cell"}, h("span", {class: `status ${status}`}, status),
           reason ? h("div", {class: "reason"}, reason) : null);
}
function progress(step, steps) {
  const done = step === null || step === undefined ? 0 : step;
  return h("td", {}, h("span", {class: "bar"}, h("span", {style: `width:${Math.min(100, 100 * done / steps)}%`})),
           ` ${step === null || step === undefined ? "-" : step}/${steps}`);
}
function banners(list) {
  const box = document.getElementById("banners");
  box.replaceChildren(...(list || []).map(text => h("div", {class: "banner"}, text)));
}
function stamp() { document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString(); }

// ---- the runs page
async function runsView(view, gen) {
  const params = new URLSearchParams(Object.entries(runsQuery).filter(([, v]) => v !== "" && v !== undefined));
  const data = await api("/api/runs?" + params);
  if (gone(gen)) return;
  if (data.error) { banners([data.error]); return; }
  banners(data.banners);
  let filters = document.getElementById("filters");
  if (!filters) {
    const field = (key, placeholder) => h("input", {id: `filter-${key}`, placeholder, value: runsQuery[key] || "",
      onchange: e => { runsQuery[key] = e.target.value; runsQuery.page = 0; refresh(); }});
    const status = h("select", {id: "filter-status", onchange: e => { runsQuery.status = e.target.value;
      runsQuery.page = 0; refresh(); }}, h("option", {value: ""}, "any status"),
      STATES.map(s => h("option", {value: s, selected: runsQuery.status === s}, s)));
    filters = h("div", {class: "filters", id: "filters"}, field("name", "name contains"),
                field("cluster", "cluster"), field("sweep", "sweep id"), status);
    view.replaceChildren(h("h2", {}, "Runs"), h("p", {id: "notice"}, notice), filters, h("div", {id: "runs-body"}));
    notice = null;  // said once, on the page the action led to
  }
  const rows = data.rows.map(row => h("tr", {"data-run": row.name},
    h("td", {}, h("a", {href: `#/run/${encodeURIComponent(row.name)}` +
                             (row.remote ? `?cluster=${encodeURIComponent(row.cluster)}` : "")}, row.name)),
    h("td", {}, row.cluster), h("td", {}, row.model), h("td", {class: "num"}, `${row.nodes}x${row.gpus_per_node}`),
    statusCell(row.status, row.reason), progress(row.step, row.steps),
    h("td", {class: "num loss"}, num(row.loss, 4)), rateCell(row.tokens_per_s, num, row.rates_over),
    rateCell(row.mfu, pct, row.rates_over), h("td", {class: "num"}, row.attempts || ""),
    h("td", {class: "num"}, pct(row.goodput)),
    h("td", {}, row.sweep ? h("a", {href: `#/sweep/${encodeURIComponent(row.sweep)}`}, row.sweep) : ""),
    h("td", {}, age(row.submitted_at))));
  const table = h("table", {id: "runs"}, h("thead", {}, h("tr", {}, ["Name", "Cluster", "Model", "GPUs", "Status",
    "Progress", "Loss", "Tok/s", "MFU", "Tries", "Goodput", "Sweep", "Age"]
      .map(t => h("th", {title: t === "Tok/s" || t === "MFU" ? RATES : null}, t)))),
    h("tbody", {}, rows));
  const pager = h("div", {class: "pager"},
    runsQuery.page > 0 ? h("button", {onclick: () => { runsQuery.page--; refresh(); }}, "newer") : null,
    data.more ? h("button", {id: "older", onclick: () => { runsQuery.page++; refresh(); }}, "older") : null,
    data.rows.length ? null : noRuns(data.left_out));
  document.getElementById("runs-body").replaceChildren(table, pager);
}

// Tokens/s and MFU in a row are the newest logged interval's while an attempt runs, and the attempt's mean once it
// ended (its final row): each cell says which.
const RATES = "last: the newest logged interval's; mean: the attempt's, once it ended";
function rateCell(value, format, over) {
  if (value === null || value === undefined) return h("td", {class: "num"});
  const which = over === "attempt" ? "mean" : "last";
  return h("td", {class: "num", title: which === "mean" ? "the attempt's mean" : "the newest logged interval's"},
           format(value), h("span", {class: "which"}, " " + which));
}
function noRuns(leftOut) {
  const states = Object.entries(leftOut || {}).map(([state, count]) => `${count} ${state}`);
  return states.length ? `No runs in the chosen state; the others: ${states.join(", ")}.` : "No runs.";
}

// ---- a run's page
const CHARTS = [
  ["loss", "Loss", ["loss", "eval_loss"]], ["lr", "Learning rate", ["lr"]], ["grad_norm", "Gradient norm", ["grad_norm"]],
  ["tokens", "Tokens/s (and per GPU)", ["tokens_per_s", "tokens_per_s_per_gpu"]], ["mfu", "MFU", ["mfu"]],
  ["memory", "Peak memory (GB)", ["peak_mem_gb"]],
];
const COLOURS = ["#0969da", "#cf222e", "#1a7f37", "#8250df"];
// An axis's labels: small values (a learning rate) in exponent form, large ones grouped, each with the fewest digits
// that still tell every tick from its neighbours (1.0e-3 three times says nothing).
const tick = (v, digits) => v === null || v === undefined ? "" : v === 0 ? "0"
  : Math.abs(v) < 0.01 ? v.toExponential(digits)
  : Math.abs(v) >= 1000 ? v.toLocaleString(undefined, {maximumFractionDigits: 0}) : String(+v.toPrecision(digits + 2));
function ticks(values) {
  for (let digits = 1; digits < 6; digits++) {
    const labels = values.map(v => tick(v, digits));
    if (new Set(labels).size === labels.length) return labels;
  }
  return values.map(v => tick(v, 6));
}

// A chart as wide as its panel, its y labels readable, its legend the series' names (the values are on the curve).
function plot(holder, options, data) {
  return new uPlot({width: Math.max(300, holder.clientWidth - 16), height: 220, legend: {live: false},
                    axes: [{}, {size: 64, values: (u, values) => ticks(values)}], ...options}, data, holder);
}

// The current attempt's series, then (on request) the earlier attempts', each at its steps on the steps of both.
function chartData(curves, keys) {
  const blocks = curves.earlier ? [curves, curves.earlier] : [curves];
  const steps = [...new Set(blocks.flatMap(b => b.step))].sort((a, b) => a - b);
  const at = (block, key) => {
    const byStep = new Map(block.step.map((step, i) => [step, block[key][i]]));
    return steps.map(step => byStep.has(step) && byStep.get(step) !== undefined ? byStep.get(step) : null);
  };
  return [steps, ...blocks.flatMap(block => keys.map(k => at(block, k)))];
}
function drawCharts(box, curves) {
  for (const [id, title, keys] of CHARTS) {
    const data = chartData(curves, keys);
    const chart = charts[id];  // emptied too: a new attempt that logged no step yet
    if (chart && chart.series.length === data.length) { chart.setData(data); continue; }
    if (chart) { chart.destroy(); document.getElementById(`chart-${id}`).remove(); delete charts[id]; }
    if (!data.slice(1).some(series => series.some(v => v !== null))) continue;
    const holder = h("div", {class: "chart", id: `chart-${id}`}, h("h3", {}, title));
    box.append(holder);
    const earlierSeries = curves.earlier ? keys.map((k, i) => ({label: `${k} (earlier attempts)`, stroke: COLOURS[i],
      dash: [4, 4], width: 1, spanGaps: true, points: {show: false}})) : [];
    // points drawn where the curve is sparse (uPlot's own rule): a curve of one point is a dot, not empty axes
    charts[id] = plot(holder, {cursor: {drag: {x: true, y: false}}, scales: {x: {time: false}},
      series: [{label: "step"}, ...keys.map((k, i) => ({label: k, stroke: COLOURS[i], spanGaps: true})),
               ...earlierSeries]}, data);
    holder.dataset.points = String(curves.step.length);
  }
  for (const [id] of CHARTS) {
    const holder = document.getElementById(`chart-${id}`);
    if (holder) holder.dataset.points = String(curves.step.length);
  }
  // The curves are the current attempt's; earlier attempts' rows are drawn on request, dashed.
  document.getElementById("earlier-box").hidden = !curves.earlier_rows;
  document.getElementById("curves-note").textContent = !curves.logged ? "this attempt has logged no step yet"
    : curves.earlier_rows ? `this attempt, from step ${curves.resumed_at}` : "";
}


function planTable(info) {
  const p = info.predicted || {}, m = info.latest_metrics || {};
  const rows = [["Memory per GPU (GB)", p.memory_gb, m.peak_mem_gb, 3], ["Step time (s)", p.step_time_s, m.step_time, 4],
                ["Tokens/s", p.tokens_per_s, m.tokens_per_s, 0], ["MFU", p.mfu, m.mfu, null]];
  // No figure is a dash: a speed the plan does not forecast (GPU type unknown, or a stand-in beside CPUs).
  const cell = (v, digits) => h("td", {class: "num"}, v === null || v === undefined ? "-"
    : digits === null ? pct(v) : num(v, digits));
  const table = h("table", {id: "plan"}, h("thead", {}, h("tr", {}, ["", `planned (${p.gpu || "?"})`,
                                                                     "measured (last interval)"]
      .map((t, i) => h("th", {class: i ? "num" : null}, t)))),
    h("tbody", {}, rows.map(([what, planned, measured, digits]) => h("tr", {}, h("td", {}, what),
      cell(planned, digits), cell(measured, digits)))));
  return h("div", {}, table, p.note ? h("p", {id: "plan-note"}, p.note) : null);
}

function cellText(key, value) {
  if (value === null || value === undefined) return "";
  if ((key === "start" || key === "end") && typeof value === "number") return new Date(1000 * value).toLocaleString();
  if (typeof value === "number" && !Number.isInteger(value)) return value.toFixed(1);
  return String(value);
}

function attemptsTable(info) {
  const rows = info.attempts || [];
  // queued (grey) then running (coloured by its outcome) for each attempt, in proportion to their times
  const span = a => Math.max(1, (a.end || Date.now() / 1000) - (a.start || 0));
  const total = rows.reduce((s, a) => s + span(a) + (a.queued_s || 0), 0) || 1;
  const colour = {COMPLETED: "#2da44e", FAILED: "#cf222e", REQUEUED: "#8250df", CANCELLED: "#6e7781"};
  const line = h("div", {class: "timeline", id: "timeline"}, rows.map(a => [
    h("span", {title: `attempt ${a.attempt}: queued ${cellText("", a.queued_s)} s`,
               style: `width:${100 * (a.queued_s || 0) / total}%;background:#d0d7de`}),
    h("span", {title: `attempt ${a.attempt}: ${a.outcome || "running"} ${a.cause || ""}`,
               style: `width:${100 * span(a) / total}%;background:${colour[a.outcome] || "#0969da"}`})]));
  const keys = rows.length ? Object.keys(rows[0]) : [];
  return h("div", {}, line, h("table", {id: "attempts"}, h("thead", {}, h("tr", {}, keys.map(k => h("th", {}, k)))),
    h("tbody", {}, rows.map(a => h("tr", {}, keys.map(k => h("td", {}, cellText(k, a[k]))))))),
    info.goodput ? h("p", {id: "goodput"}, info.goodput.line) : null,
    info.data ? h("p", {id: "data"}, info.data.line) : null);
}

// Each button says what it is about to do and acts once that is confirmed; while it acts, no button acts again (a
// stop waits for the run to save); then the page says what happened (after a Delete, the runs page it leads to).
let acting = false;
async function act(what, name, action, question, cluster, to) {
  if (!confirm(question)) return;
  const gen = generation, said = document.getElementById("said");
  acting = true;
  document.querySelectorAll("button.action").forEach(button => { button.disabled = true; });
  said.className = "";
  const doing = {delete: "Deleting", resume: "Resuming", move: "Moving"}[action] || "Stopping";
  said.textContent = `${doing} ${name}…`;
  const where = cluster ? `?cluster=${encodeURIComponent(cluster)}` : to ? `?to=${encodeURIComponent(to)}` : "";
  const answer = await api(`/api/${what}/${encodeURIComponent(name)}/${action}${where}`, {method: "POST"});
  acting = false;
  if (!answer.error && action === "delete") { notice = answer.said; location.hash = "#/"; return; }
  if (gone(gen)) return;
  said.className = answer.error ? "error" : "";
  said.textContent = answer.error ? "error: " + answer.error : answer.said;
  refresh();
}

// A button can act only where the service would (``refused``: why not, in its words, shown as the button's title).
function enable(id, why) {
  const button = document.getElementById(id);
  button.disabled = acting || Boolean(why);
  button.title = why || "";
}
function stopQuestion(name, info) {
  return info.state === "RUNNING" ? `Stop ${name}? Its ranks save the step they are at, then its job ${info.job_id} ` +
    "ends (cancelled if they have not saved in time); Resume goes on from there."
    : `Stop ${name}? Its job ${info.job_id} is ${info.state}: it is cancelled at once.`;
}
function moveQuestion(name, info, to) {
  return `Move ${name} to cluster ${to}? Its job ${info.job_id}, waiting on ${info.cluster}, is cancelled, and the ` +
    `run is submitted on ${to} as a new Slurm job.`;
}
function resumeQuestion(name, info) {
  const saved = (info.checkpoints || []).filter(c => !c.damaged).map(c => c.step);
  return `Resume ${name} as a new Slurm job, ` +
    (saved.length ? `from its checkpoint of step ${Math.max(...saved)}?` : "from the start (it has no checkpoint)?");
}

async function runView(view, name, cluster, gen) {
  // a run on a cluster reached over SSH: its record, curves and log tail come in one answer (two SSH commands)
  const far = cluster ? `?cluster=${encodeURIComponent(cluster)}&rank=${logState ? logState.rank : 0}` +
    (earlier && view.dataset.run === name ? "&earlier=1" : "") +
    (logState && logState.offset !== null && view.dataset.run === name ? `&log_offset=${logState.offset}` : "") : "";
  const info = await api(`/api/run/${encodeURIComponent(name)}${far}`);
  if (gone(gen)) return;
  if (info.error) { view.replaceChildren(h("p", {id: "said", class: "error"}, "error: " + info.error)); return; }
  banners([]);
  if (!document.getElementById("run-page") || view.dataset.run !== name) {
    charts = {}; logState = {rank: 0, offset: null, follow: true}; earlier = false;
    view.dataset.run = name;
    view.replaceChildren(h("div", {id: "run-page"},
      h("h2", {}, name), h("div", {id: "run-head"}),
      h("div", {}, h("button", {id: "stop", class: "action", disabled: true,
                                onclick: () => act("run", name, "stop", stopQuestion(name, runInfo), cluster)}, "Stop"),
        h("button", {id: "resume", class: "action", disabled: true,
                     onclick: () => act("run", name, "resume", resumeQuestion(name, runInfo), cluster)}, "Resume"),
        h("button", {id: "move", class: "action", disabled: true, onclick: () => {
          const to = document.getElementById("move-to").value;
          act("run", name, "move", moveQuestion(name, runInfo, to), "", to); }}, "Move"),
        h("select", {id: "move-to", title: "the cluster a waiting run moves to"}),
        h("button", {id: "delete", class: "action danger", disabled: true, onclick: () => act("run", name, "delete",
          `Delete run ${name}? Its job is cancelled if active, and its directory (checkpoints, logs, metrics) ` +
          "removed: this cannot be undone.", cluster)}, "Delete")),
      h("div", {id: "said"}), h("h3", {}, "Plan and measured"), h("div", {id: "plan-box"}),
      h("h3", {}, "Curves"), h("div", {class: "curves-head"}, h("span", {id: "curves-note"}),
        h("label", {id: "earlier-box", hidden: true}, h("input", {id: "earlier", type: "checkbox",
          onchange: e => { earlier = e.target.checked; refresh(); }}), " earlier attempts (dashed)")),
      h("div", {class: "charts", id: "charts"}),
      h("h3", {}, "Attempts"), h("div", {id: "attempts-box"}),
      h("h3", {}, "Log"), h("div", {}, "rank ", h("input", {id: "log-rank", type: "number", min: 0, value: 0,
        onchange: e => { logState = {...logState, rank: Number(e.target.value), offset: null};
                         document.getElementById("log").textContent = ""; refresh(); }}),
        h("label", {}, h("input", {id: "log-follow", type: "checkbox", checked: true,
          onchange: e => { logState.follow = e.target.checked; }}), " follow")),
      h("pre", {id: "log"}), h("h3", {}, "Checkpoints and exports"), h("div", {id: "files-box"}),
      h("h3", {}, "Run it again"), h("pre", {class: "config", id: "again"}),
      h("h3", {}, "run.yaml"), h("pre", {class: "config", id: "run-file"}),
      h("h3", {}, "config.yaml"), h("pre", {class: "config", id: "config"})));
  }
  runInfo = info;
  const targets = info.move_to || [], select = document.getElementById("move-to");
  if (select.dataset.for !== targets.join(",")) {  // the configured clusters but the run's own, kept as chosen
    select.replaceChildren(...targets.map(t => h("option", {value: t}, t)));
    select.dataset.for = targets.join(",");
  }
  const refused = {...(info.refused || {})};
  refused.move = refused.move || (targets.length ? null : `no cluster but ${info.cluster} is configured here`);
  for (const action of ["stop", "resume", "move", "delete"]) enable(action, refused[action]);
  select.disabled = Boolean(refused.move);
  document.getElementById("run-head").replaceChildren(h("table", {}, h("tbody", {}, h("tr", {},
    statusCell(info.state, info.reason), h("td", {}, `job ${info.job_id || "-"} on ${info.cluster}`),
    h("td", {id: "moves"}, (info.moves || []).join("; ")),
    h("td", {}, info.sweep ? h("a", {href: `#/sweep/${encodeURIComponent(info.sweep)}`}, "sweep " + info.sweep) : ""),
    h("td", {}, info.elapsed ? "elapsed " + info.elapsed : "")))),
    info.sooner ? h("p", {id: "sooner"}, info.sooner) : "");
  document.getElementById("plan-box").replaceChildren(planTable(info));
  document.getElementById("attempts-box").replaceChildren(attemptsTable(info));
  document.getElementById("files-box").replaceChildren(h("table", {id: "checkpoints"}, h("tbody", {},
    (info.checkpoints || []).map(c => h("tr", {}, h("td", {}, `step ${c.step}`), h("td", {}, c.path),
      h("td", {class: "num"}, num(c.bytes)), h("td", {}, c.damaged ? "damaged" : ""))),
    (info.exports || []).map(e => h("tr", {}, h("td", {}, "export"), h("td", {}, e.path || e.error || ""),
      h("td", {}, e.step === undefined ? "" : `step ${e.step}`), h("td", {}, ""))))));
  document.getElementById("again").textContent = info.again;
  document.getElementById("run-file").textContent = info.run_file || "(kept on the cluster: see its run directory)";
  document.getElementById("config").textContent = info.config;
  if (cluster) {
    drawCharts(document.getElementById("charts"), info.curves);
    showLog(info.log);
    return;
  }
  const curves = await api(`/api/run/${encodeURIComponent(name)}/curves?points=1000${earlier ? "&earlier=1" : ""}`);
  if (gone(gen)) return;
  if (!curves.error) drawCharts(document.getElementById("charts"), curves);
  const q = logState.offset === null ? "" : `&offset=${logState.offset}`;
  const tail = await api(`/api/run/${encodeURIComponent(name)}/log?rank=${logState.rank}${q}`);
  if (!gone(gen)) showLog(tail);
}

function showLog(tail) {
  const pre = document.getElementById("log");
  if (tail.error) { pre.textContent = "error: " + tail.error; return; }
  if (tail.missing) { pre.textContent = `(no log yet: ${tail.path})`; logState.offset = null; return; }
  if (logState.offset === null) pre.textContent = "";
  // where an attempt begins, the server put a line "==== attempt N (job J) ====": a heading between attempts
  for (const part of tail.text.split(/^(==== .* ====)$/m)) {
    pre.append(/^==== .* ====$/.test(part) ? h("span", {class: "attempt-mark"}, part) : document.createTextNode(part));
  }
  logState.offset = tail.offset;
  if (logState.follow) pre.scrollTop = pre.scrollHeight;
}

// ---- a sweep's page
// A chart kept across refreshes: made once, then given new data (made anew where its series change).
function keptChart(box, id, title, options, data) {
  const kept = charts[id];
  if (kept && kept.series.length === data.length) { kept.setData(data); return; }
  if (kept) { kept.destroy(); document.getElementById(`chart-${id}`).remove(); }
  const holder = h("div", {class: "chart", id: `chart-${id}`}, h("h3", {}, title));
  box.append(holder);
  charts[id] = plot(holder, options, data);
}
const colour = i => i < COLOURS.length ? COLOURS[i] : `hsl(${(i * 137) % 360}, 60%, 42%)`;

function scalingChart(box, runs) {
  const sized = runs.filter(r => r.tokens_per_s).sort((a, b) => a.gpus - b.gpus);
  if (sized.length < 2) return;
  const base = sized[0];
  const gpus = sized.map(r => r.gpus);
  const ideal = gpus.map(g => base.tokens_per_s * g / base.gpus);
  // ticks at the GPU counts measured, whole numbers (the labels kept on the chart: what a reader of the page sees)
  const counts = u => [...new Set(u.data[0])];
  const labels = (u, splits) => {
    if (u.root.parentNode) u.root.parentNode.dataset.ticks = splits.join(",");
    return splits.map(String);
  };
  keptChart(box, "scaling", "Tokens/s against GPUs (dashed: ideal)", {height: 260, scales: {x: {time: false}},
    axes: [{splits: counts, values: labels}, {size: 64, values: (u, values) => ticks(values)}],
    series: [{label: "GPUs"}, {label: "measured", stroke: COLOURS[0]},
             {label: "ideal", stroke: "#6e7781", dash: [6, 4]}]}, [gpus, sized.map(r => r.tokens_per_s), ideal]);
}

// Every run's loss against the step on one chart, as `launcher compare --plot` draws them.
function lossChart(box, losses) {
  const names = Object.keys(losses || {}).filter(name => losses[name].step.length);
  if (!names.length) return;
  const tables = names.map(name => {
    const byStep = new Map(losses[name].step.map((step, i) => [step, losses[name].loss[i]]));  // a step once
    const steps = [...byStep.keys()].sort((a, b) => a - b);
    return [steps, steps.map(step => byStep.get(step))];
  });
  keptChart(box, "losses", "Loss of each run", {scales: {x: {time: false}},
    series: [{label: "step"}, ...names.map((name, i) => ({label: name, stroke: colour(i), spanGaps: true}))]},
    uPlot.join(tables));
}

function searchBox(search) {
  const best = search.best ? search.best.number : null;
  const keys = search.space.map(p => p.key);
  const rows = search.trials.map(t => h("tr", {"data-trial": t.number, class: t.number === best ? "best" : null},
    h("td", {}, t.number), h("td", {}, t.state), keys.map(k => h("td", {class: "num"}, num(t.params[k], 6))),
    h("td", {class: "num"}, num(t.value, 5)), h("td", {}, t.run ? h("a", {href: `#/run/${t.run}`}, t.run) : ""),
    h("td", {}, t.number === best ? "best" : "")));
  const counts = Object.entries(search.counts || {}).map(([k, v]) => `${k} ${v}`).join(", ");
  return h("div", {id: "search"}, h("p", {}, `Search ${search.id}: ${counts}${search.ended ? "; " + search.ended : ""}`),
    h("table", {id: "trials"}, h("thead", {}, h("tr", {}, ["Trial", "State", ...keys, search.metric, "Run", ""]
      .map(t => h("th", {}, t)))), h("tbody", {}, rows)));
}

function paramCharts(box, search) {
  for (const p of search.space) {
    const done = search.trials.filter(t => t.value !== null && t.params[p.key] !== undefined)
      .sort((a, b) => a.params[p.key] - b.params[p.key]);
    if (!done.length) continue;
    keptChart(box, `param-${p.key}`, `${search.metric} against ${p.key}`,
      {scales: {x: {time: false, distr: p.log ? 3 : 1}},
      axes: [{values: (u, values) => ticks(values)}, {size: 64, values: (u, values) => ticks(values)}],
      series: [{label: p.key}, {label: search.metric, stroke: COLOURS[0], paths: () => null,
                                points: {show: true, size: 8}}]},
      [done.map(t => t.params[p.key]), done.map(t => t.value)]);
  }
}

function sweepQuestion(data) {
  const runs = `${data.active} active run${data.active === 1 ? "" : "s"}`;
  return data.search ? `Stop search ${data.id}? It submits no more trials, and its ${runs} each save the step ` +
    "they are at and end (one still waiting is cancelled at once)."
    : `Stop sweep ${data.id}? Its ${runs} each save the step they are at and end (one still waiting is cancelled ` +
    "at once).";
}

let sweepInfo = null;
async function sweepView(view, id, gen) {
  const data = await api(`/api/sweep/${encodeURIComponent(id)}`);
  if (gone(gen)) return;
  if (data.error) { view.replaceChildren(h("p", {id: "said", class: "error"}, "error: " + data.error)); return; }
  if (!document.getElementById("sweep-page") || view.dataset.sweep !== id) {
    charts = {};
    view.dataset.sweep = id;
    view.replaceChildren(h("div", {id: "sweep-page"}, h("h2", {}, `Sweep ${data.id}`),
      h("div", {}, h("button", {id: "stop-sweep", class: "action", disabled: true,
        onclick: () => act("sweep", data.id, "stop", sweepQuestion(sweepInfo))},
        data.search ? "Stop the search" : "Stop the sweep")),
      h("div", {id: "said"}), h("div", {id: "sweep-runs"}), h("div", {class: "charts", id: "sweep-charts"}),
      h("div", {id: "search-box"}), h("div", {class: "charts", id: "param-charts"})));
  }
  sweepInfo = data;
  enable("stop-sweep", data.active || (data.search && !data.search.ended) ? null
    : `${data.search ? "search" : "sweep"} ${data.id} has no active run; nothing to stop`);
  document.getElementById("sweep-runs").replaceChildren(h("table", {id: "sweep-runs-table"}, h("thead", {},
    h("tr", {}, ["Run", "Model", "GPUs", "Status", "Tok/s", "Tok/s per GPU", "Speedup", "Efficiency", "Final loss"]
      .map(t => h("th", {}, t)))), h("tbody", {},
    data.runs.map(r => h("tr", {}, h("td", {}, h("a", {href: `#/run/${r.name}`}, r.name)), h("td", {}, r.model),
      h("td", {class: "num"}, r.gpus), h("td", {class: `status ${r.status}`}, r.status),
      h("td", {class: "num"}, num(r.tokens_per_s)), h("td", {class: "num"}, num(r.tokens_per_s_per_gpu)),
      h("td", {class: "num"}, num(r.speedup, 2)), h("td", {class: "num"}, pct(r.scaling_efficiency)),
      h("td", {class: "num"}, num(r.final_loss, 4)))))));
  const box = document.getElementById("sweep-charts");
  scalingChart(box, data.runs);
  lossChart(box, data.losses);
  if (data.search) {
    document.getElementById("search-box").replaceChildren(searchBox(data.search));
    paramCharts(document.getElementById("param-charts"), data.search);
  }
}

// ---- the clusters page
// The run behind a job: a watcher's run, a run of this console's roots (its page), a sweep's job array (its page).
function behind(job) {
  if (job.watches) return `watcher of ${job.watches}`;
  if (job.run) return h("a", {href: `#/run/${encodeURIComponent(job.name)}`}, job.name);
  if (job.job_id.includes("_")) return h("a", {href: `#/sweep/${encodeURIComponent(job.name)}`}, `sweep ${job.name}`);
  return job.name;
}

async function clustersView(view, gen) {
  const data = await api("/api/clusters");
  if (gone(gen)) return;
  if (data.error) { banners([data.error]); return; }
  banners(data.filter(c => !c.reachable).map(c => `cluster ${c.cluster} is unreachable: ${c.error}`));
  // a slurm.conf configured under several names is one cluster: each name, the user's default marked
  const names = c => [c.cluster, ...(c.also || [])].map(n => n === c.default_name ? `${n} (default)` : n).join(", ");
  view.replaceChildren(h("h2", {}, "Clusters"), ...data.map(c => h("section", {"data-cluster": c.cluster},
    h("h3", {}, names(c) + (c.reachable ? "" : " — unreachable")),
    c.reachable ? h("table", {}, h("thead", {}, h("tr", {}, ["Partition", "GPU", "GPUs free/total", "Nodes idle/alloc/down",
      "Max run now", "Your max run", "Time limit"].map(t => h("th", {}, t)))), h("tbody", {},
      c.partitions.map(p => h("tr", {}, h("td", {}, p.name + (p.default ? "*" : "")), h("td", {}, p.gpu_type),
        h("td", {class: "num"}, `${p.gpus_free}/${p.gpus_total}`),
        h("td", {class: "num"}, `${p.nodes_idle}/${p.nodes_allocated}/${p.nodes_down}`),
        h("td", {class: "num"}, p.max_run_now), h("td", {}, p.yours || "-"), h("td", {}, p.time_limit))))) : null,
    (c.queue || []).length ? h("table", {class: "queue"}, h("thead", {}, h("tr", {}, ["Your job", "Run", "State",
      "Partition", "GPUs", "Why"].map(t => h("th", {}, t)))), h("tbody", {}, c.queue.map(j => h("tr",
      {"data-job": j.job_id},
      h("td", {}, j.job_id), h("td", {class: "behind"}, behind(j)), statusCell(j.state, ""), h("td", {}, j.partition),
      h("td", {class: "num"}, j.gpus), h("td", {class: "why"}, j.reason)))))
      : null)));
}

// ---- routing and refresh
async function refresh() {
  const gen = inFlight = generation;
  const view = document.getElementById("view");
  // an answer that is slow to come (Slurm slow to answer the server) says so, rather than an unchanged page
  const slow = setTimeout(() => { document.getElementById("updated").textContent = "loading…"; }, 500);
  const [, page, path, query] = (location.hash || "#/").match(/^#\/([^/]*)\/?([^?]*)\??(.*)$/) || [];
  const arg = decodeURIComponent(path || "");
  try {
    if (page === "run") await runView(view, arg, new URLSearchParams(query).get("cluster"), gen);
    else if (page === "sweep") await sweepView(view, arg, gen);
    else if (page === "clusters") await clustersView(view, gen);
    else await runsView(view, gen);
    if (!gone(gen)) stamp();
  } catch (err) {
    if (!gone(gen)) banners([`the console did not answer: ${err}`]);
  } finally {
    clearTimeout(slow);
    if (inFlight === gen) inFlight = null;
  }
}

function route() {
  generation++;
  clearInterval(timer);
  charts = {};
  document.getElementById("view").replaceChildren(h("p", {id: "loading", class: "loading"}, "loading…"));
  delete document.getElementById("view").dataset.run;
  delete document.getElementById("view").dataset.sweep;
  refresh();
  const page = (location.hash || "#/").split("/")[1];
  const far = location.hash.includes("?cluster=");  // a remote run's refresh costs SSH commands: every 10 s
  const every = page === "clusters" || far ? 10000 : page === "sweep" ? SWEEP_REFRESH_MS : REFRESH_MS;
  // a tick while the page's last refresh is still under way (Slurm or a cluster slow to answer) waits for the next
  timer = setInterval(() => { if (inFlight !== generation) refresh(); }, every);
}
window.addEventListener("hashchange", route);
route();
