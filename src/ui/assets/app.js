// The agent-sandbox dashboard. Plain JavaScript, no dependencies: every view reads and writes
// through the server's resource API and /v1 with the session cookie; state-changing requests
// repeat the CSRF cookie in X-CSRF-Token. Views are chosen by the URL's fragment.
"use strict";

const API = "/apis/agent-sandbox.io/v1";
const PAGE_SIZE = 50;
const STATS_EVERY_MS = 5000;
// Stats requests in flight at once from one page (a browser has six connections to a host).
const STATS_AT_ONCE = 3;
const HISTORY_MS = 60 * 60 * 1000;

// ---- helpers ---------------------------------------------------------------------------------

function csrfToken() {
  const pair = document.cookie.split(";").map((c) => c.trim().split("="))
    .find(([name]) => name === "agent_sandbox_csrf");
  return pair ? pair[1] : "";
}

class HttpError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// One request to this server. `body`: an object (sent as JSON), a Blob/File (sent raw) or none.
async function call(method, path, body, signal) {
  const headers = {};
  if (method !== "GET" && method !== "HEAD") headers["X-CSRF-Token"] = csrfToken();
  let payload;
  if (body instanceof Blob) {
    payload = body;
    headers["Content-Type"] = "application/octet-stream";
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers["Content-Type"] = "application/json";
  }
  const response = await fetch(path, { method, headers, body: payload, credentials: "same-origin", signal });
  if (response.status === 401) {
    // The session ended (or the server's keys changed): the page itself now asks to sign in.
    location.reload();
    throw new HttpError(401, "signed out");
  }
  const text = await response.text();
  let data = null;
  if (text && (response.headers.get("content-type") || "").startsWith("application/json")) {
    data = JSON.parse(text);
  }
  if (!response.ok) {
    const message = data && data.error ? data.error.message : text || response.statusText;
    throw new HttpError(response.status, message);
  }
  return data;
}

// Reads an NDJSON stream, calling `onLine` with each parsed line, until it ends or `signal` aborts.
async function stream(path, onLine, signal, onChunkEnd) {
  const response = await fetch(path, { credentials: "same-origin", signal });
  if (response.status === 401) { location.reload(); return; }
  if (!response.ok) throw new HttpError(response.status, await response.text());
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let pending = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pending += decoder.decode(value, { stream: true });
    let newline;
    while ((newline = pending.indexOf("\n")) >= 0) {
      const line = pending.slice(0, newline).trim();
      pending = pending.slice(newline + 1);
      if (line) onLine(JSON.parse(line));
    }
    if (onChunkEnd) onChunkEnd();
  }
}

// An element: el("td", {class: "num"}, "text", child, ...). Text is always text, never HTML.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function toast(message, isError) {
  const box = document.getElementById("toast");
  box.textContent = message;
  box.className = isError ? "error" : "";
  box.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { box.hidden = true; }, isError ? 8000 : 3000);
}

function age(timestamp) {
  if (!timestamp) return "";
  const seconds = Math.max(0, (Date.now() - Date.parse(timestamp)) / 1000);
  if (seconds < 120) return `${Math.floor(seconds)}s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)}m`;
  if (seconds < 172800) return `${Math.floor(seconds / 3600)}h`;
  return `${Math.floor(seconds / 86400)}d`;
}

function bytes(n) {
  if (n === null || n === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

// The filled part of a bar (set through the CSSOM: the page's policy refuses style attributes).
function share(fraction) {
  const fill = el("span", {});
  fill.style.width = `${Math.min(100, Math.max(0, 100 * fraction)).toFixed(0)}%`;
  return fill;
}

function phaseBadge(phase) {
  return el("span", { class: `phase ${phase || "Unknown"}` }, phase || "Unknown");
}

const escapeName = encodeURIComponent;
// An object's key: its name in `default`, `namespace.name` in any other (as `/v1` IDs are).
const keyOf = (meta) => (!meta.namespace || meta.namespace === "default") ? meta.name : `${meta.namespace}.${meta.name}`;
// The namespace and name of a key.
const splitKey = (key) => { const dot = key.indexOf("."); return dot < 0 ? ["default", key] : [key.slice(0, dot), key.slice(dot + 1)]; };
// The resource API path of the object of key `key` (namespaced outside `default`).
const objectPath = (plural, key) => {
  const [ns, name] = splitKey(key);
  return ns === "default" ? `${API}/${plural}/${escapeName(name)}` : `${API}/namespaces/${escapeName(ns)}/${plural}/${escapeName(name)}`;
};

// ---- YAML (spec and status are shown as YAML; environment values are never shown) -------------

function yamlScalar(value) {
  if (value === null || value === undefined) return "null";
  if (typeof value === "number" || typeof value === "boolean") return String(value);
  const s = String(value);
  if (s === "" || /^[\s]|[\s]$|[:#\-?{}[\],&*!|>'"%@`]|^(true|false|null|yes|no|~|[-+.\d].*)$/i.test(s) || s.includes("\n")) {
    return JSON.stringify(s);
  }
  return s;
}

function toYaml(value, indent) {
  indent = indent || "";
  if (Array.isArray(value)) {
    if (value.length === 0) return "[]";
    return value.map((item) => {
      const inner = toYaml(item, indent + "  ");
      return typeof item === "object" && item !== null && !Array.isArray(item) && Object.keys(item).length
        ? `\n${indent}- ${inner.trimStart()}`
        : `\n${indent}- ${inner}`;
    }).join("");
  }
  if (typeof value === "object" && value !== null) {
    const keys = Object.keys(value);
    if (keys.length === 0) return "{}";
    return keys.map((k) => {
      const v = value[k];
      const nested = typeof v === "object" && v !== null && (Array.isArray(v) ? v.length : Object.keys(v).length);
      return nested ? `\n${indent}${yamlScalar(k)}:${toYaml(v, indent + "  ")}` : `\n${indent}${yamlScalar(k)}: ${toYaml(v, indent + "  ")}`;
    }).join("");
  }
  return yamlScalar(value);
}

// A copy of a sandbox's spec with its environment's values hidden (they often hold secrets).
function maskedSpec(spec) {
  const copy = JSON.parse(JSON.stringify(spec || {}));
  if (copy.env) for (const k of Object.keys(copy.env)) copy.env[k] = "(hidden)";
  return copy;
}

// ---- usage samples: the server's last hour, then this tab's own, kept in its session storage --

// A sample of a /stats answer or a history point taken at `at`, with the CPU use (cores) since
// `last` when it can be told (a later sample whose CPU seconds did not go back).
function usageSample(last, at, point) {
  const cores = last && at > last.at && point.cpuSeconds >= last.cpu ? (point.cpuSeconds - last.cpu) / ((at - last.at) / 1000) : null;
  return { at, cpu: point.cpuSeconds, mem: point.memoryBytes, limit: point.memoryLimitBytes, cores };
}

const usage = {
  key: (name) => `usage:${name}`,
  load(name) {
    try { return JSON.parse(sessionStorage.getItem(this.key(name)) || "[]"); } catch (_) { return []; }
  },
  // Adds a /stats answer; returns the CPU use (cores) since the previous sample, if there is one.
  add(name, stats) {
    const samples = this.load(name);
    const last = samples[samples.length - 1];
    const next = usageSample(last, Date.parse(stats.sampledAt), stats);
    if (!last || next.at > last.at) samples.push(next);
    const kept = samples.filter((s) => s.at >= Date.now() - HISTORY_MS);
    try { sessionStorage.setItem(this.key(name), JSON.stringify(kept)); } catch (_) { /* full: keep going */ }
    return next.cores;
  },
  // Puts the server's last hour (`…/stats/history`) before what this tab sampled itself.
  seed(name, history) {
    const mine = this.load(name);
    const samples = [];
    for (const p of history.items) samples.push(usageSample(samples[samples.length - 1], Date.parse(p.at), p));
    const newest = samples.length ? samples[samples.length - 1].at : -Infinity;
    const kept = samples.concat(mine.filter((s) => s.at > newest)).filter((s) => s.at >= Date.now() - HISTORY_MS);
    try { sessionStorage.setItem(this.key(name), JSON.stringify(kept)); } catch (_) { /* full: keep going */ }
  },
};

// `task` for a timer: a tick that comes while the last run is still going is skipped, so a slow
// server sees fewer requests instead of a growing queue of them.
function whenIdle(task) {
  let running = null;
  return () => {
    if (!running) running = Promise.resolve(task()).finally(() => { running = null; });
    return running;
  };
}

async function fetchStats(name, signal) {
  const stats = await call("GET", `${objectPath("sandboxes", name)}/stats`, undefined, signal);
  return { stats, cores: usage.add(name, stats) };
}

// A line chart of `points` ([at, value]) over the last hour, as an SVG string of numbers only.
function chart(points, max, label) {
  const width = 600, height = 120, now = Date.now();
  const x = (at) => ((at - (now - HISTORY_MS)) / HISTORY_MS) * width;
  const y = (v) => height - 14 - (max > 0 ? (v / max) * (height - 24) : 0);
  const coords = points.filter(([, v]) => v !== null && Number.isFinite(v)).map(([at, v]) => `${x(at).toFixed(1)},${y(v).toFixed(1)}`);
  const line = coords.length ? `<polyline class="line" points="${coords.join(" ")}"/>` : "";
  const area = coords.length > 1
    ? `<polygon class="area" points="${coords[0].split(",")[0]},${height - 14} ${coords.join(" ")} ${coords[coords.length - 1].split(",")[0]},${height - 14}"/>`
    : "";
  const box = el("div", { class: "chart" });
  box.innerHTML = `<svg viewBox="0 0 ${width} ${height}" preserveAspectRatio="none">`
    + `<line class="axis" x1="0" y1="${height - 14}" x2="${width}" y2="${height - 14}"/>${area}${line}`
    + `<text x="2" y="10">${Number(max).toFixed(2)}</text><text x="2" y="${height - 2}">-60 min</text>`
    + `<text x="${width - 30}" y="${height - 2}">now</text></svg>`;
  return el("div", {}, el("div", { class: "muted" }, label), box);
}

// ---- views -----------------------------------------------------------------------------------
// A view draws into `main` and returns a function that stops whatever it keeps running.

function sandboxLimits(sandbox) {
  const applied = (sandbox.status && sandbox.status.appliedLimits) || {};
  const spec = sandbox.spec || {};
  const cpus = applied.cpus ?? spec.cpus;
  const memory = applied.memoryMB ?? spec.memoryMB;
  const pids = applied.pidsLimit ?? spec.pidsLimit;
  return [cpus !== undefined ? `${cpus} CPU` : "", memory !== undefined ? `${memory} MiB` : "", pids !== undefined ? `${pids} pids` : ""]
    .filter(Boolean).join(" · ");
}

function sandboxesView(main) {
  const abort = new AbortController();
  const sandboxes = new Map();
  const live = new Map(); // name -> {cores, mem, limit}
  let page = 0;
  let filter = "";
  let scheduled = false;
  let firstDrawn = false;
  let total = null; // the list's size while only its first page is here

  const count = el("span", { class: "muted", id: "sandbox-count" });
  const filterBox = el("input", { type: "search", id: "filter", placeholder: "Filter by name, image or phase", size: 40 });
  const prev = el("button", { type: "button", class: "quiet", id: "prev" }, "‹ Previous");
  const next = el("button", { type: "button", class: "quiet", id: "next" }, "Next ›");
  const where = el("span", { class: "muted", id: "page" });
  const body = el("tbody", { id: "sandbox-rows" });
  main.replaceChildren(
    el("h1", {}, "Sandboxes"),
    el("div", { class: "toolbar" }, filterBox, count, el("span", { class: "grow" }), el("div", { class: "pager" }, prev, where, next)),
    el("div", { class: "card" }, el("table", { id: "sandboxes" },
      el("thead", {}, el("tr", {}, ["Name", "Phase", "Age", "Image", "Limits"].map((h) => el("th", {}, h)),
        el("th", { class: "num" }, "CPU"), el("th", { class: "num" }, "Memory"))),
      body)),
  );

  function visible() {
    const words = filter.toLowerCase().split(/\s+/).filter(Boolean);
    // In the list's own order (oldest first, then by name), which a page of it keeps.
    return [...sandboxes.values()].filter((s) => !words.length || words.every((w) =>
      keyOf(s.metadata).toLowerCase().includes(w)
      || String((s.spec || {}).image || "").toLowerCase().includes(w)
      || String((s.status || {}).phase || "").toLowerCase().includes(w)));
  }

  function render() {
    scheduled = false;
    const all = visible();
    const size = total === null || filter ? all.length : total;
    const pages = Math.max(1, Math.ceil(size / PAGE_SIZE));
    page = Math.min(page, pages - 1);
    const shown = all.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE);
    count.textContent = `${size} of ${total === null ? sandboxes.size : total}`;
    where.textContent = `page ${page + 1} of ${pages}`;
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
    body.replaceChildren(...shown.map((s) => {
      const name = keyOf(s.metadata);
      const status = s.status || {};
      const now = live.get(name);
      const memory = now ? el("span", {}, bytes(now.mem), now.limit
        ? el("span", { class: "bar", title: `${bytes(now.mem)} of ${bytes(now.limit)}` },
          share(now.mem / now.limit))
        : null) : "";
      return el("tr", { "data-name": name },
        el("td", {}, el("a", { href: `#/sandboxes/${escapeName(name)}` }, name)),
        el("td", {}, phaseBadge(status.phase)),
        el("td", { title: s.metadata.creationTimestamp || "" }, age(s.metadata.creationTimestamp)),
        el("td", {}, (s.spec || {}).image || el("span", { class: "muted" }, "default")),
        el("td", {}, sandboxLimits(s)),
        el("td", { class: "num" }, now && now.cores !== null && now.cores !== undefined ? `${(now.cores * 100).toFixed(1)}%` : ""),
        el("td", { class: "num" }, memory));
    }));
    if (!firstDrawn && sandboxes.size) {
      // When the first page of rows has been painted (the frame after this one starts), in ms
      // since the navigation began: what the benchmark reads.
      firstDrawn = true;
      requestAnimationFrame(() => setTimeout(() => { document.body.dataset.sandboxesDrawn = String(performance.now()); }));
    }
  }
  function schedule() {
    if (!scheduled) { scheduled = true; requestAnimationFrame(render); }
  }

  filterBox.addEventListener("input", () => { filter = filterBox.value; page = 0; schedule(); });
  prev.addEventListener("click", () => { page = Math.max(0, page - 1); schedule(); });
  next.addEventListener("click", () => { page += 1; schedule(); });

  // The list, then its changes as they happen (a watch); re-watched when it ends.
  (async () => {
    while (!abort.signal.aborted) {
      try {
        // The first page alone first, so that it is drawn without waiting for the rest.
        if (!firstDrawn) {
          const first = await call("GET", `${API}/sandboxes?limit=${PAGE_SIZE}`, undefined, abort.signal);
          for (const s of first.items) sandboxes.set(keyOf(s.metadata), s);
          total = first.items.length + ((first.metadata || {}).remainingItemCount || 0);
          render();
        }
        const list = await call("GET", `${API}/sandboxes`, undefined, abort.signal);
        sandboxes.clear();
        for (const s of list.items) sandboxes.set(keyOf(s.metadata), s);
        total = null;
        render();
        await stream(`${API}/sandboxes?watch=true&timeoutSeconds=300`, (event) => {
          if (event.type === "ERROR") throw new Error(event.object.error.message);
          const s = event.object;
          if (event.type === "DELETED") sandboxes.delete(keyOf(s.metadata));
          else sandboxes.set(keyOf(s.metadata), s);
        }, abort.signal, schedule);
      } catch (error) {
        if (abort.signal.aborted) return;
        toast(`Sandbox list: ${error.message}`, true);
        await new Promise((r) => setTimeout(r, 2000));
      }
    }
  })();

  // Live CPU and memory of the running sandboxes on the page shown. A browser keeps six
  // connections to a host: the watch holds one, and stats requests must leave some free, for the
  // page's own calls and above all for the next navigation (which waits for a free one while this
  // page still runs). So at most STATS_AT_ONCE at a time, and a round starts only once the last
  // one ended: a slow server gets fewer samples, never a growing queue.
  const sampleShown = whenIdle(async () => {
    if (abort.signal.aborted) return;
    const all = visible().slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE)
      .filter((s) => (s.status || {}).phase === "Running");
    const next = all.values();
    const worker = async () => {
      for (const s of next) {
        if (abort.signal.aborted) return;
        try {
          const { stats, cores } = await fetchStats(keyOf(s.metadata), abort.signal);
          live.set(keyOf(s.metadata), { cores, mem: stats.memoryBytes, limit: stats.memoryLimitBytes });
        } catch (_) { live.delete(keyOf(s.metadata)); }
      }
    };
    await Promise.all(Array.from({ length: STATS_AT_ONCE }, worker));
    schedule();
  });
  sampleShown();
  const timer = setInterval(sampleShown, STATS_EVERY_MS);
  return () => { abort.abort(); clearInterval(timer); };
}

function conditionsTable(conditions) {
  if (!conditions || !conditions.length) return el("p", { class: "muted" }, "No conditions.");
  return el("table", {}, el("thead", {}, el("tr", {}, ["Type", "Status", "Reason", "Message", "Since"].map((h) => el("th", {}, h)))),
    el("tbody", {}, conditions.map((c) => el("tr", {},
      el("td", {}, c.type), el("td", {}, phaseBadge(c.status)), el("td", {}, c.reason || ""),
      el("td", {}, c.message || ""), el("td", { title: c.lastTransitionTime || "" }, age(c.lastTransitionTime))))));
}

function eventsTable(events) {
  if (!events.length) return el("p", { class: "muted" }, "No events.");
  return el("table", { id: "events" }, el("thead", {}, el("tr", {}, ["Last seen", "Type", "Reason", "Object", "Message", "Count"].map((h) => el("th", {}, h)))),
    el("tbody", {}, events.map((e) => el("tr", {},
      el("td", { title: e.lastTimestamp }, age(e.lastTimestamp)), el("td", { class: e.type }, e.type),
      el("td", {}, e.reason), el("td", {}, `${e.involvedObject.kind}/${e.involvedObject.name}`),
      el("td", {}, e.message), el("td", { class: "num" }, e.count)))));
}

function sandboxView(main, name) {
  const abort = new AbortController();
  const base = objectPath("sandboxes", name);
  const v1 = `/v1/sandboxes/${escapeName(name)}`;
  let folder = "/workspace";
  let following = null;

  const title = el("h1", {}, name, " ", el("span", { id: "phase" }));
  const summary = el("dl", { class: "kv", id: "summary" });
  const conditions = el("div", { id: "conditions" });
  const yaml = el("pre", { id: "yaml" });
  const events = el("div", {});
  const charts = el("div", { id: "charts" });
  const processes = el("tbody", { id: "processes" });
  const output = el("pre", { class: "output", id: "output" });
  const commandBox = el("input", { type: "text", id: "command", placeholder: "Command, run by /bin/sh -c", size: 50 });
  const filesBody = el("tbody", { id: "files" });
  const folderLabel = el("code", { id: "folder" });
  const upload = el("input", { type: "file", id: "upload", multiple: true });
  const snapshots = el("tbody", { id: "snapshots" });
  const snapshotName = el("input", { type: "text", id: "snapshot-name", placeholder: "Snapshot name (optional)" });
  const egress = el("tbody", { id: "egress" });
  const egressCard = el("div", { class: "card", id: "egress-card", hidden: true }, el("h2", {}, "Egress decisions (latest first)"),
    el("table", {}, el("thead", {}, el("tr", {}, ["Time", "Protocol", "Host", "Address", "Decision", "Rule", "Bytes out / in"].map((h) => el("th", {}, h)))), egress));

  main.replaceChildren(
    el("p", {}, el("a", { href: "#/sandboxes" }, "‹ Sandboxes")),
    title,
    el("div", { class: "grid" },
      el("div", { class: "card" }, el("h2", {}, "Summary"), summary),
      el("div", { class: "card" }, el("h2", {}, "CPU and memory, last hour"), charts)),
    el("div", { class: "card" }, el("h2", {}, "Conditions"), conditions),
    el("div", { class: "card" }, el("h2", {}, "Files ", folderLabel),
      el("div", { class: "toolbar" }, upload, el("button", { type: "button", id: "upload-button", onclick: uploadFiles }, "Upload here")),
      el("table", { class: "files" }, el("thead", {}, el("tr", {}, ["Name", "Type", "Size", "Modified", ""].map((h) => el("th", {}, h)))), filesBody)),
    el("div", { class: "card" }, el("h2", {}, "Snapshots"),
      el("div", { class: "toolbar" }, snapshotName, el("button", { type: "button", id: "snapshot-button", onclick: takeSnapshot }, "Take snapshot")),
      el("table", {}, el("thead", {}, el("tr", {}, ["Name", "Id", "Size", "Taken", ""].map((h) => el("th", {}, h)))), snapshots)),
    el("div", { class: "card" }, el("h2", {}, "Processes"),
      el("div", { class: "toolbar" }, commandBox, el("button", { type: "button", id: "start-process", onclick: startProcess }, "Start")),
      el("table", {}, el("thead", {}, el("tr", {}, ["Id", "Command", "State", "Started", "Exit", ""].map((h) => el("th", {}, h)))), processes),
      el("h2", {}, "Output"), output),
    egressCard,
    el("div", { class: "card" }, el("h2", {}, "Events"), events),
    el("div", { class: "card" }, el("h2", {}, "Spec and status"), yaml),
  );

  async function refresh() {
    try {
      const sandbox = await call("GET", base, undefined, abort.signal);
      const status = sandbox.status || {};
      document.getElementById("phase").replaceChildren(phaseBadge(status.phase));
      summary.replaceChildren(...[
        ["Image", (sandbox.spec || {}).image || "default"], ["Age", age(sandbox.metadata.creationTimestamp)],
        ["Limits", sandboxLimits(sandbox)], ["Expires", status.expiresAt || "never"],
        ["Source snapshot", status.sourceSnapshot || ""], ["Last rollback", status.lastRollback ? `${status.lastRollback.snapshot} (${age(status.lastRollback.completedAt)} ago)` : ""],
        ["Message", status.message || ""],
      ].flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
      conditions.replaceChildren(conditionsTable(status.conditions));
      yaml.textContent = `spec:${toYaml(maskedSpec(sandbox.spec), "  ")}\nstatus:${toYaml(status, "  ")}`.trim();
      const [ns, bare] = splitKey(name);
      const list = await call("GET", `${API}/namespaces/${escapeName(ns)}/events?involvedObject=${escapeName(bare)}`, undefined, abort.signal);
      const items = list.items.slice().sort((a, b) => Date.parse(b.lastTimestamp) - Date.parse(a.lastTimestamp)).slice(0, 50);
      events.replaceChildren(eventsTable(items));
      if ((sandbox.spec || {}).egress) await listEgress();
      if (status.phase === "Running") await fetchStats(name, abort.signal).catch(() => {});
      drawCharts();
    } catch (error) {
      if (!abort.signal.aborted) toast(`${name}: ${error.message}`, true);
    }
  }

  // The gateway's decisions for a sandbox under an egress allow-list: the latest 100.
  async function listEgress() {
    egressCard.hidden = false;
    const decisions = [];
    try {
      await stream(`${base}/egress?follow=false`, (d) => decisions.push(d), abort.signal);
    } catch (error) {
      if (!abort.signal.aborted) egress.replaceChildren(el("tr", {}, el("td", { colspan: 7, class: "muted" }, error.message)));
      return;
    }
    egress.replaceChildren(...decisions.slice(-100).reverse().map((d) => el("tr", { "data-host": d.host, "data-allowed": String(d.allowed) },
      el("td", { title: d.time }, age(d.time)), el("td", {}, d.protocol), el("td", {}, el("code", {}, d.host)),
      el("td", {}, d.address ? `${d.address}${d.port ? `:${d.port}` : ""}` : ""),
      el("td", {}, el("span", { class: d.allowed ? "phase True" : "phase False" }, d.allowed ? "allowed" : "refused")),
      el("td", {}, d.rule), el("td", { class: "num" }, `${bytes(d.bytesOut || 0)} / ${bytes(d.bytesIn || 0)}`))));
    if (!decisions.length) egress.replaceChildren(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "No connections or lookups yet.")));
  }

  function drawCharts() {
    const samples = usage.load(name);
    const maxCores = Math.max(0.1, ...samples.map((s) => s.cores || 0));
    const limit = samples.length ? samples[samples.length - 1].limit : null;
    const maxMem = Math.max(1, limit || 0, ...samples.map((s) => s.mem || 0));
    charts.replaceChildren(
      chart(samples.map((s) => [s.at, s.cores]), maxCores, "CPU (cores)"),
      chart(samples.map((s) => [s.at, s.mem / 1048576]), maxMem / 1048576, `Memory (MiB${limit ? `, limit ${bytes(limit)}` : ""})`),
    );
  }

  async function listFiles() {
    try {
      const list = await call("GET", `${v1}/files/list?path=${encodeURIComponent(folder)}`, undefined, abort.signal);
      folder = list.path;
      folderLabel.textContent = folder;
      const rows = [];
      if (folder !== "/") {
        const parent = folder.replace(/\/[^/]+\/?$/, "") || "/";
        rows.push(el("tr", {}, el("td", {}, el("a", { href: "#", onclick: (e) => { e.preventDefault(); folder = parent; listFiles(); } }, "..")), el("td", {}, "directory"), el("td"), el("td"), el("td")));
      }
      for (const f of list.entries) {
        const open = f.type === "directory"
          ? el("a", { href: "#", onclick: (e) => { e.preventDefault(); folder = f.path; listFiles(); } }, `${f.name}/`)
          : el("span", {}, f.name);
        const download = f.type === "file"
          ? el("a", { href: `${v1}/files?path=${encodeURIComponent(f.path)}`, download: f.name, class: "download" }, "Download")
          : "";
        rows.push(el("tr", { "data-file": f.name }, el("td", {}, open), el("td", {}, f.type), el("td", { class: "num" }, f.type === "file" ? bytes(f.size) : ""),
          el("td", { title: f.modified_at }, age(f.modified_at)), el("td", {}, download)));
      }
      filesBody.replaceChildren(...rows);
    } catch (error) {
      filesBody.replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "muted" }, error.message)));
    }
  }

  async function uploadFiles() {
    for (const file of upload.files) {
      const path = `${folder.replace(/\/$/, "")}/${file.name}`;
      try {
        await call("PUT", `${v1}/files?path=${encodeURIComponent(path)}`, file);
        toast(`Uploaded ${path}`);
      } catch (error) { toast(`Upload of ${file.name}: ${error.message}`, true); }
    }
    upload.value = "";
    listFiles();
  }

  async function listSnapshots() {
    try {
      const list = await call("GET", `/v1/snapshots?sandbox_id=${encodeURIComponent(name)}`, undefined, abort.signal);
      snapshots.replaceChildren(...list.snapshots.slice().reverse().map((s) => el("tr", { "data-snapshot": s.id },
        el("td", {}, s.name || ""), el("td", {}, el("code", {}, s.id)), el("td", { class: "num" }, bytes(s.size_bytes)),
        el("td", { title: s.created_at }, age(s.created_at)),
        el("td", {},
          el("button", { type: "button", class: "quiet rollback", onclick: () => rollback(s) }, "Roll back"), " ",
          el("button", { type: "button", class: "quiet fork", onclick: () => fork(s) }, "Fork")))));
      if (!list.snapshots.length) snapshots.replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "muted" }, "No snapshots.")));
    } catch (error) {
      snapshots.replaceChildren(el("tr", {}, el("td", { colspan: 5, class: "muted" }, error.message)));
    }
  }

  async function takeSnapshot() {
    const button = document.getElementById("snapshot-button");
    button.disabled = true;
    try {
      const body = snapshotName.value.trim() ? { name: snapshotName.value.trim() } : {};
      const snapshot = await call("POST", `${v1}/snapshots`, body);
      toast(`Snapshot ${snapshot.id} taken`);
      snapshotName.value = "";
    } catch (error) { toast(`Snapshot: ${error.message}`, true); }
    button.disabled = false;
    listSnapshots();
  }

  async function rollback(snapshot) {
    if (!confirm(`Roll ${name} back to ${snapshot.name || snapshot.id}? Its workspace is replaced and its processes stop.`)) return;
    try {
      await call("POST", `${v1}/rollback`, { snapshot_id: snapshot.id });
      toast(`${name} rolled back to ${snapshot.name || snapshot.id}`);
      document.body.dataset.rolledBack = snapshot.id;
    } catch (error) { toast(`Rollback: ${error.message}`, true); }
    folder = "/workspace";
    refresh(); listFiles(); listProcesses();
  }

  async function fork(snapshot) {
    try {
      const child = await call("POST", `/v1/snapshots/${encodeURIComponent(snapshot.id)}/fork`, {});
      toast(`Forked into ${child.id}`);
      location.hash = `#/sandboxes/${escapeName(child.id)}`;
    } catch (error) { toast(`Fork: ${error.message}`, true); }
  }

  async function listProcesses() {
    try {
      const list = await call("GET", `${base}/processes`, undefined, abort.signal);
      processes.replaceChildren(...list.items.map((p) => el("tr", { "data-process": p.id },
        el("td", {}, el("code", {}, p.id)), el("td", {}, el("code", {}, p.command || p.argv.join(" "))),
        el("td", {}, phaseBadge(p.state)), el("td", { title: p.startedAt }, age(p.startedAt)),
        el("td", {}, p.exitCode ?? p.signal ?? ""),
        el("td", {}, el("button", { type: "button", class: "quiet", onclick: () => follow(p.id) }, "Output"), " ",
          p.state === "running" ? el("button", { type: "button", class: "quiet", onclick: () => kill(p.id) }, "Kill") : ""))));
      if (!list.items.length) processes.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "No processes.")));
    } catch (error) {
      processes.replaceChildren(el("tr", {}, el("td", { colspan: 6, class: "muted" }, error.message)));
    }
  }

  async function startProcess() {
    const command = commandBox.value.trim();
    if (!command) return;
    try {
      const process = await call("POST", `${base}/processes`, { command });
      commandBox.value = "";
      listProcesses();
      follow(process.id);
    } catch (error) { toast(`Start: ${error.message}`, true); }
  }

  async function kill(id) {
    try { await call("POST", `${base}/processes/${escapeName(id)}/signal`, { signal: "KILL" }); } catch (error) { toast(`Kill: ${error.message}`, true); }
    listProcesses();
  }

  // Shows a process's output from the start, then as it comes, until it ends.
  async function follow(id) {
    if (following) following.abort();
    following = new AbortController();
    const mine = following;
    abort.signal.addEventListener("abort", () => mine.abort());
    output.replaceChildren();
    output.dataset.process = id;
    try {
      await stream(`${base}/processes/${escapeName(id)}/output?follow=true`, (event) => {
        if (event.type === "stdout" || event.type === "stderr") output.append(el("span", { class: event.type }, event.data));
        else if (event.type === "exit") output.append(el("span", { class: "muted" }, `\n[exited ${event.exitCode ?? event.signal}]`));
        output.scrollTop = output.scrollHeight;
      }, mine.signal);
      listProcesses();
    } catch (error) {
      if (!mine.signal.aborted) output.append(el("span", { class: "stderr" }, `\n[${error.message}]`));
    }
  }

  // The server's last hour first, so that the charts have a past from the start.
  call("GET", `${base}/stats/history`, undefined, abort.signal)
    .then((history) => { usage.seed(name, history); drawCharts(); }).catch(() => {})
    .finally(refresh);
  listFiles(); listSnapshots(); listProcesses();
  const timers = [setInterval(whenIdle(refresh), STATS_EVERY_MS), setInterval(whenIdle(listProcesses), 10000)];
  return () => { abort.abort(); timers.forEach(clearInterval); };
}

function tableView(main, title, path, columns, empty) {
  const abort = new AbortController();
  const body = el("tbody", {});
  main.replaceChildren(el("h1", {}, title), el("div", { class: "card" },
    el("table", { id: "list" }, el("thead", {}, el("tr", {}, columns.map(([h]) => el("th", {}, h)))), body)));
  async function load() {
    try {
      const list = await call("GET", path, undefined, abort.signal);
      const items = (list.items || list.errors || []);
      body.replaceChildren(...items.map((item) => el("tr", {}, columns.map(([, cell]) => el("td", {}, cell(item))))));
      if (!items.length) body.replaceChildren(el("tr", {}, el("td", { colspan: columns.length, class: "muted" }, empty)));
    } catch (error) {
      if (!abort.signal.aborted) toast(`${title}: ${error.message}`, true);
    }
  }
  load();
  const timer = setInterval(whenIdle(load), STATS_EVERY_MS);
  return () => { abort.abort(); clearInterval(timer); };
}

const sandboxLink = (name) => name ? el("a", { href: `#/sandboxes/${escapeName(name)}` }, name) : "";
const created = (item) => el("span", { title: item.metadata.creationTimestamp }, age(item.metadata.creationTimestamp));

function snapshotsView(main) {
  return tableView(main, "Snapshots", `${API}/snapshots`, [
    ["Name", (s) => keyOf(s.metadata)], ["Sandbox", (s) => sandboxLink(keyOf({ namespace: s.metadata.namespace, name: s.spec.sandbox }))],
    ["Phase", (s) => phaseBadge((s.status || {}).phase)], ["Size", (s) => bytes((s.status || {}).sizeBytes)],
    ["Age", created], ["Message", (s) => (s.status || {}).message || ""],
  ], "No snapshots.");
}

function forksView(main) {
  return tableView(main, "Forks", `${API}/forks`, [
    ["Name", (f) => keyOf(f.metadata)], ["Snapshot", (f) => f.spec.snapshot],
    ["Phase", (f) => phaseBadge((f.status || {}).phase)],
    ["Ready", (f) => `${(f.status || {}).readyReplicas || 0}/${f.spec.replicas ?? 1}`],
    ["Children", (f) => ((f.status || {}).children || []).flatMap((c, i) => [i ? ", " : "", sandboxLink(c)])],
    ["Age", created],
  ], "No forks.");
}

function poolsView(main) {
  return tableView(main, "Pools", `${API}/sandboxpools`, [
    ["Name", (p) => keyOf(p.metadata)], ["Image", (p) => p.spec.image], ["Size", (p) => p.spec.size],
    ["Ready", (p) => (p.status || {}).readyReplicas || 0], ["Claimed", (p) => (p.status || {}).claimed || 0],
    ["Conditions", (p) => ((p.status || {}).conditions || []).map((c) => `${c.type}=${c.status}`).join(", ")], ["Age", created],
  ], "No pools.");
}

// Templates are listed beside the pools: both say what new sandboxes start as.
function templatesView(main) {
  return tableView(main, "Templates", `${API}/sandboxtemplates`, [
    ["Name", (t) => keyOf(t.metadata)],
    ["From", (t) => (t.spec.snapshot ? `snapshot/${t.spec.snapshot}` : t.spec.image || "(default image)")],
    ["Generation", (t) => t.metadata.generation ?? 1], ["Pool", (t) => (t.spec.pool ? t.spec.pool.size : "")],
    ["Age", created],
  ], "No templates.");
}

function errorsView(main) {
  return tableView(main, "Manifest errors", `${API}/errors`, [
    ["File", (e) => e.file || ""], ["Line", (e) => e.line ?? ""], ["Object", (e) => (e.kind ? `${e.kind}/${e.name || ""}` : "")],
    ["Field", (e) => e.field || ""], ["Message", (e) => e.message],
  ], "Every manifest applies.");
}

function healthView(main) {
  const abort = new AbortController();
  const box = el("dl", { class: "kv", id: "health" });
  const warnings = el("div", {});
  main.replaceChildren(el("h1", {}, "Server health"), el("div", { class: "card" }, box),
    el("div", { class: "card" }, el("h2", {}, "Recent warnings"), warnings));
  async function load() {
    let health;
    try {
      const response = await fetch("/healthz", { signal: abort.signal });
      health = await response.json();
      health.http = response.status;
    } catch (error) { health = { status: `unreachable: ${error.message}` }; }
    try {
      const [sandboxes, errors, events] = await Promise.all([
        call("GET", `${API}/sandboxes`, undefined, abort.signal), call("GET", `${API}/errors`, undefined, abort.signal),
        call("GET", `${API}/events`, undefined, abort.signal)]);
      const phases = {};
      for (const s of sandboxes.items) { const p = (s.status || {}).phase || "Unknown"; phases[p] = (phases[p] || 0) + 1; }
      box.replaceChildren(...[
        ["Status", phaseBadge(health.status === "ok" ? "Ready" : "Failed"), ` ${health.status || ""}`],
        ["Backend", health.backend || ""], ["Version", health.version || ""],
        ["Sandboxes", Object.entries(phases).map(([p, n]) => `${n} ${p}`).join(", ") || "none"],
        ["Manifest errors", String(errors.errors.length)],
        ["Events kept", String(events.items.length)],
      ].flatMap(([k, ...v]) => [el("dt", {}, k), el("dd", {}, ...v)]));
      const recent = events.items.filter((e) => e.type === "Warning")
        .sort((a, b) => Date.parse(b.lastTimestamp) - Date.parse(a.lastTimestamp)).slice(0, 20);
      warnings.replaceChildren(eventsTable(recent));
    } catch (error) {
      if (!abort.signal.aborted) toast(`Health: ${error.message}`, true);
    }
  }
  load();
  const timer = setInterval(whenIdle(load), STATS_EVERY_MS);
  return () => { abort.abort(); clearInterval(timer); };
}

// ---- routing ---------------------------------------------------------------------------------

let stopView = () => {};

function route() {
  stopView();
  const main = document.getElementById("main");
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const view = parts[0] || "sandboxes";
  for (const link of document.querySelectorAll("header nav a")) {
    link.classList.toggle("current", link.dataset.view === view);
  }
  document.body.dataset.view = view;
  if (view === "sandboxes" && parts[1]) stopView = sandboxView(main, parts[1]);
  else if (view === "snapshots") stopView = snapshotsView(main);
  else if (view === "forks") stopView = forksView(main);
  else if (view === "pools") stopView = poolsView(main);
  else if (view === "templates") stopView = templatesView(main);
  else if (view === "errors") stopView = errorsView(main);
  else if (view === "health") stopView = healthView(main);
  else stopView = sandboxesView(main);
}

document.getElementById("sign-out").addEventListener("click", async () => {
  try { await fetch("/ui/logout", { method: "POST", headers: { "X-CSRF-Token": csrfToken() }, credentials: "same-origin" }); } finally { location.reload(); }
});
window.addEventListener("hashchange", route);
// A page left for another is kept a while in the browser's back/forward cache, and with it any
// request still open: a watch held there keeps one of the six connections the browser allows a
// host, and a few such pages starve the next navigation until they are evicted (about a minute).
// So leaving the page ends its view, streams included, and coming back to it starts it again.
window.addEventListener("pagehide", () => { stopView(); stopView = () => {}; });
window.addEventListener("pageshow", (event) => { if (event.persisted) route(); });
route();
