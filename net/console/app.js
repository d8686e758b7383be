// The console's pages. Hash routes: #/ (overview), #/tenants,
// #/topics?ns=&q=&page=, #/topic/<domain>/<tenant>/<ns>/<topic>.
// Every element is built with h() (text nodes, never innerHTML): topic
// names, keys and payloads come from clients.

import * as api from "/console/api.js";
import { RateChart, formatNumber } from "/console/chart.js";

// ------------------------------------------------------------------ helpers

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const page = () => document.getElementById("page");

function fmtRate(v) {
  return `${formatNumber(Number(v || 0))}/s`;
}

function fmtBytes(v) {
  v = Number(v || 0);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i === 0 ? Math.round(v) : v.toFixed(1)} ${units[i]}`;
}

function fmtDuration(s) {
  if (s === null || s === undefined) return "?";
  s = Math.floor(s);
  const d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  if (d) return `${d}d ${hh}h ${m}m`;
  if (hh) return `${hh}h ${m}m`;
  return `${m}m ${s % 60}s`;
}

function card(label, value, cls) {
  return h("div", { class: `card ${cls || ""}` }, h("div", { class: "label" }, label), h("div", { class: "value" }, value));
}

function table(headers, rows, attrs) {
  return h(
    "table",
    attrs || {},
    h("thead", {}, h("tr", {}, headers.map((x) => (typeof x === "string" ? h("th", {}, x) : h("th", { class: x.cls }, x.label))))),
    h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: headers.length, class: "muted" }, "none"))),
  );
}

const num = (v) => h("td", { class: "num" }, v);

function topicHref(name) {
  const m = /^(persistent|non-persistent):\/\/([^/]+)\/([^/]+)\/(.+)$/.exec(name);
  if (!m) return "#/topics";
  return `#/topic/${m[1]}/${encodeURIComponent(m[2])}/${encodeURIComponent(m[3])}/${encodeURIComponent(m[4])}`;
}

let noticeTimer = null;
function notice(text, isError) {
  const n = document.getElementById("notice");
  n.textContent = text;
  n.className = isError ? "error" : "";
  n.hidden = false;
  clearTimeout(noticeTimer);
  if (!isError) noticeTimer = setTimeout(() => (n.hidden = true), 6000);
}

// A refused or failed action: the broker's own reason, as it gave it.
function failed(what, e) {
  if (e instanceof api.ApiError) {
    const kind = e.status === 401 || e.status === 403 ? "Refused" : "Failed";
    notice(`${kind}: ${what} (HTTP ${e.status}): ${e.reason}`, true);
  } else {
    notice(`Failed: ${what}: ${e.message}`, true);
  }
}

function confirmAction(title, text) {
  const d = document.getElementById("confirm-dialog");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true });
    d.returnValue = "";
    d.showModal();
  });
}

// Runs an action, says what happened, refreshes the page on success.
async function act(what, f, refresh) {
  try {
    await f();
    notice(`Done: ${what}`);
    if (refresh) await refresh();
  } catch (e) {
    failed(what, e);
  }
}

// Timers of the page shown; cleared when the route changes.
let timers = [];
function every(ms, f) {
  // A call still running when the next is due is not doubled.
  let busy = false;
  const tick = async () => {
    if (busy) return;
    busy = true;
    try {
      await f();
    } finally {
      busy = false;
    }
  };
  tick();
  timers.push(setInterval(tick, ms));
}

// ------------------------------------------------------------------- auth

function showAuthState() {
  document.getElementById("auth-state").textContent = api.token() ? "token set" : "";
}

function askToken(why) {
  const d = document.getElementById("token-dialog");
  if (d.open) return;
  document.getElementById("token-why").textContent = why || "";
  document.getElementById("token-input").value = api.token();
  d.returnValue = "";
  d.addEventListener(
    "close",
    () => {
      if (d.returnValue === "ok") api.setToken(document.getElementById("token-input").value.trim());
      if (d.returnValue === "clear") api.setToken("");
      showAuthState();
      if (d.returnValue === "ok" || d.returnValue === "clear") route();
    },
    { once: true },
  );
  d.showModal();
}

api.whenUnauthorized((e) => askToken(`The broker refused the request: ${e.reason}`));

// --------------------------------------------------------------- overview

async function overview() {
  const root = page();
  const body = h("div", {});
  root.replaceChildren(h("h1", {}, "Overview"), body);
  every(2000, async () => {
    let o;
    try {
      o = await api.get("/admin/v2/magnetar/overview");
    } catch (e) {
      body.replaceChildren(h("p", { class: "error-text" }, `Cannot read the overview: ${e.message}`));
      return;
    }
    const t = o.totals;
    const cards = h(
      "div",
      { class: "cards", id: "overview-cards" },
      card("Version", o.version),
      card("Uptime", fmtDuration(o.uptimeSeconds)),
      card("Recovery at start", `${o.recoveryMillis.toFixed(1)} ms`),
      card("Ready", o.ready ? "yes" : "no", o.ready ? "good" : "bad"),
      card("Disk", `${o.diskUsedPercent}% used`),
      card("Watermark", o.watermark, o.storageFull ? "bad" : "good"),
      card("Topics", t.topics),
      card("Connections", t.connections),
      card("Produce", fmtRate(t.msgRateIn), "rate-in"),
      card("Consume", fmtRate(t.msgRateOut), "rate-out"),
      card("Stored", fmtBytes(t.storageSize)),
      card("Backlog", formatNumber(t.backlog)),
    );
    const shardRows = o.shards.map((s) =>
      h(
        "tr",
        {},
        h("td", {}, s.shard),
        num(s.topicCount),
        num(s.connections),
        num(fmtRate(s.msgRateIn)),
        num(fmtRate(s.msgRateOut)),
        num(fmtBytes(s.msgThroughputIn) + "/s"),
        num(fmtBytes(s.storageSize)),
        num(formatNumber(s.backlog)),
        num(`${s.diskUsedPercent}%${s.storageFull ? " (full)" : ""}`),
        num(`${s.recoveryMillis.toFixed(1)} ms`),
      ),
    );
    const topicRows = o.shards.flatMap((s) =>
      s.topics.map((tp) =>
        h(
          "tr",
          {},
          h("td", {}, s.shard),
          h("td", {}, h("a", { href: topicHref(tp.topic) }, tp.topic)),
          num(fmtRate(tp.msgRateIn)),
          num(fmtRate(tp.msgRateOut)),
          num(fmtBytes(tp.storageSize)),
          num(formatNumber(tp.backlog)),
        ),
      ),
    );
    body.replaceChildren(
      cards,
      h("h2", {}, "Shards"),
      table(
        ["Shard", { label: "Topics", cls: "num" }, { label: "Connections", cls: "num" }, { label: "Produce", cls: "num" },
          { label: "Consume", cls: "num" }, { label: "Bytes in", cls: "num" }, { label: "Stored", cls: "num" },
          { label: "Backlog", cls: "num" }, { label: "Disk", cls: "num" }, { label: "Recovery", cls: "num" }],
        shardRows,
        { id: "shards-table" },
      ),
      h("h2", {}, "Busiest topics per shard"),
      h("p", { class: "muted" }, "Up to 20 per shard, by messages in and out; every topic is on the Topics page."),
      table(
        ["Shard", "Topic", { label: "Produce", cls: "num" }, { label: "Consume", cls: "num" },
          { label: "Stored", cls: "num" }, { label: "Backlog", cls: "num" }],
        topicRows,
        { id: "overview-topics" },
      ),
    );
  });
}

// ------------------------------------------------------ tenants/namespaces

// Policies the console changes, with how to read a value typed in.
const POLICIES = {
  messageTTL: { label: "Message TTL (seconds)", parse: (v) => parseInt(v, 10), loses: true },
  retention: {
    label: "Retention (minutes,MB)",
    parse: (v) => {
      const [m, s] = v.split(",").map((x) => parseInt(x.trim(), 10));
      return { retentionTimeInMinutes: m, retentionSizeInMB: s };
    },
    loses: true,
  },
  deduplication: { label: "Deduplication (true/false)", parse: (v) => v.trim() === "true", loses: false },
  maxProducersPerTopic: { label: "Max producers per topic", parse: (v) => parseInt(v, 10), loses: false },
  maxConsumersPerTopic: { label: "Max consumers per topic", parse: (v) => parseInt(v, 10), loses: false },
};

async function tenants() {
  const root = page();
  root.replaceChildren(h("h1", {}, "Tenants & namespaces"));
  let list;
  try {
    list = await api.get("/admin/v2/tenants");
  } catch (e) {
    root.append(h("p", { class: "error-text" }, `Cannot list tenants: ${e.message}`));
    return;
  }
  for (const tenant of list) {
    const section = h("section", { class: "tenant" }, h("h2", {}, `Tenant ${tenant}`));
    root.append(section);
    try {
      const info = await api.get(`/admin/v2/tenants/${encodeURIComponent(tenant)}`);
      section.append(
        h("p", { class: "muted" }, `Admin roles: ${info.adminRoles.join(", ") || "none"} · clusters: ${info.allowedClusters.join(", ") || "any"}`),
      );
      const namespaces = await api.get(`/admin/v2/namespaces/${encodeURIComponent(tenant)}`);
      for (const ns of namespaces) section.append(await namespaceBlock(ns));
      if (!namespaces.length) section.append(h("p", { class: "muted" }, "No namespaces."));
    } catch (e) {
      section.append(h("p", { class: "error-text" }, e.message));
    }
  }
}

async function namespaceBlock(ns) {
  const block = h("div", { class: "namespace", "data-namespace": ns });
  const p = await api.get(api.namespacePath(ns));
  const r = p.retention_policies || {};
  const auto = p.autoTopicCreationOverride || {};
  block.append(
    h("h3", {}, ns, " ", h("a", { href: `#/topics?ns=${encodeURIComponent(ns)}` }, "topics")),
    table(
      ["Policy", "Value"],
      [
        ["Bundles", p.bundles.numBundles],
        ["Retention", `${r.retentionTimeInMinutes} min, ${r.retentionSizeInMB} MB`],
        ["Message TTL", `${p.message_ttl_in_seconds} s`],
        ["Deduplication", String(p.deduplicationEnabled)],
        ["Max producers per topic", p.max_producers_per_topic],
        ["Max consumers per topic", p.max_consumers_per_topic],
        ["Auto topic creation", `${auto.allowAutoTopicCreation} (${auto.topicType}${auto.defaultNumPartitions ? `, ${auto.defaultNumPartitions} partitions` : ""})`],
      ].map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", { class: "policy-value" }, v))),
      { class: "policies" },
    ),
  );
  const sel = h("select", { name: "policy" }, Object.entries(POLICIES).map(([k, d]) => h("option", { value: k }, d.label)));
  const val = h("input", { name: "value", placeholder: "value", size: 14 });
  block.append(
    h(
      "form",
      {
        class: "inline policy-form",
        onsubmit: async (ev) => {
          ev.preventDefault();
          const def = POLICIES[sel.value];
          const value = def.parse(val.value);
          if (def.loses && !(await confirmAction("Change a policy", `Set ${sel.value} of ${ns} to ${val.value}? A shorter retention or TTL deletes or expires messages.`))) return;
          await act(`set ${sel.value} of ${ns}`, () => api.post(`${api.namespacePath(ns)}/${sel.value}`, value), tenantsRefresh);
        },
      },
      "Change ",
      sel,
      val,
      h("button", { type: "submit" }, "Apply"),
    ),
  );
  return block;
}

const tenantsRefresh = () => tenants();

// ------------------------------------------------------------------ topics

const PAGE_SIZE = 50;

function hashParams() {
  const q = location.hash.split("?")[1] || "";
  return new URLSearchParams(q);
}

async function topics() {
  const params = hashParams();
  const ns = params.get("ns") || "";
  const search = params.get("q") || "";
  const pageNo = Math.max(0, parseInt(params.get("page") || "0", 10) || 0);
  const root = page();
  const go = (changes) => {
    const p = new URLSearchParams({ ns, q: search, page: String(pageNo), ...changes });
    for (const [k, v] of [...p.entries()]) if (!v || v === "0") p.delete(k);
    location.hash = `#/topics${p.toString() ? "?" + p.toString() : ""}`;
  };
  // Without the namespaces (a role that may not list them), the page still
  // offers the listing's error and the create form.
  let namespaces = [];
  let nsError = null;
  try {
    for (const t of await api.get("/admin/v2/tenants")) namespaces.push(...(await api.get(`/admin/v2/namespaces/${encodeURIComponent(t)}`)));
  } catch (e) {
    nsError = e;
  }
  const nsSelect = h(
    "select",
    { id: "ns-select", onchange: (ev) => go({ ns: ev.target.value, page: "0" }) },
    h("option", { value: "" }, "all namespaces"),
    namespaces.map((n) => h("option", { value: n, selected: n === ns }, n)),
  );
  let searchTimer = null;
  const searchInput = h("input", {
    id: "topic-search",
    type: "search",
    placeholder: "search topic names",
    value: search,
    oninput: (ev) => {
      clearTimeout(searchTimer);
      searchTimer = setTimeout(() => go({ q: ev.target.value, page: "0" }), 300);
    },
  });
  const listing = h("div", {});
  const createNs = h("input", { id: "create-namespace", name: "namespace", list: "namespace-list", value: ns || namespaces[0] || "public/default", required: true, size: 18 });
  const nsList = h("datalist", { id: "namespace-list" }, namespaces.map((n) => h("option", { value: n })));
  const createName = h("input", { id: "create-name", name: "topic", placeholder: "topic name", required: true });
  const createParts = h("input", { name: "partitions", type: "number", min: 0, value: 0, size: 4 });
  const createForm = h(
    "form",
    {
      class: "inline",
      id: "create-topic",
      onsubmit: async (ev) => {
        ev.preventDefault();
        const full = `persistent://${createNs.value.trim()}/${createName.value.trim()}`;
        const n = parseInt(createParts.value, 10) || 0;
        await act(
          `create ${full}${n ? ` with ${n} partitions` : ""}`,
          () => (n > 0 ? api.put(`${api.topicPath(full)}/partitions`, n) : api.put(api.topicPath(full))),
          load,
        );
      },
    },
    "Create topic in ",
    createNs,
    nsList,
    createName,
    "partitions (0: not partitioned)",
    createParts,
    h("button", { type: "submit", class: "primary" }, "Create"),
  );
  root.replaceChildren(
    h("h1", {}, "Topics"),
    nsError ? h("p", { class: "error-text" }, `Cannot list namespaces: ${nsError.message}`) : null,
    h("div", { class: "toolbar" }, nsSelect, searchInput),
    listing,
    h("h2", {}, "New topic"),
    createForm,
  );
  searchInput.focus();
  searchInput.setSelectionRange(search.length, search.length);

  async function load() {
    let r;
    try {
      r = await api.get(`/admin/v2/magnetar/topics${api.query({ namespace: ns, search, offset: pageNo * PAGE_SIZE, limit: PAGE_SIZE })}`);
    } catch (e) {
      listing.replaceChildren(h("p", { class: "error-text" }, `Cannot list topics: ${e.message}`));
      return;
    }
    const rows = r.topics.map((t) =>
      h(
        "tr",
        {},
        h("td", {}, h("a", { href: topicHref(t.name) }, t.name)),
        num(t.partitions || "—"),
        num(fmtRate(t.msgRateIn)),
        num(fmtRate(t.msgRateOut)),
        num(fmtBytes(t.storageSize)),
        num(formatNumber(t.backlog)),
        num(t.subscriptions),
        num(t.producers),
        num(t.consumers),
      ),
    );
    const last = Math.max(0, Math.ceil(r.total / PAGE_SIZE) - 1);
    listing.replaceChildren(
      h("p", { class: "muted", id: "topic-count" }, `${r.total} topics${search ? ` matching “${search}”` : ""} · page ${pageNo + 1} of ${last + 1}`),
      table(
        ["Topic", { label: "Partitions", cls: "num" }, { label: "In", cls: "num" }, { label: "Out", cls: "num" },
          { label: "Stored", cls: "num" }, { label: "Backlog", cls: "num" }, { label: "Subs", cls: "num" },
          { label: "Producers", cls: "num" }, { label: "Consumers", cls: "num" }],
        rows,
        { id: "topics-table" },
      ),
      h(
        "div",
        { class: "toolbar" },
        h("button", { id: "prev-page", disabled: pageNo === 0, onclick: () => go({ page: String(pageNo - 1) }) }, "◀ Previous"),
        h("button", { id: "next-page", disabled: pageNo >= last, onclick: () => go({ page: String(pageNo + 1) }) }, "Next ▶"),
      ),
    );
  }
  every(5000, load);
}

// -------------------------------------------------------------- one topic

// Samples kept for the chart: 5 minutes at one a second.
const CHART_SAMPLES = 300;

function decodePayload(bytes, asHex) {
  if (asHex) {
    return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ");
  }
  return new TextDecoder("utf-8", { fatal: false }).decode(bytes);
}

function messageTable(messages, id) {
  let asHex = false;
  const payloadCells = [];
  const rows = messages.map((m) => {
    const cell = h("pre", { class: "payload mono" }, decodePayload(m.payload, false));
    payloadCells.push([cell, m.payload]);
    return h(
      "tr",
      {},
      h("td", {}, h("code", {}, m.id)),
      h("td", {}, m.publishTime),
      h("td", { class: "msg-key" }, m.key ?? ""),
      h("td", {}, Object.entries(m.properties || {}).map(([k, v]) => h("div", { class: "mono" }, `${k}=${v}`))),
      h("td", { class: "msg-payload" }, cell),
    );
  });
  const toggle = h(
    "button",
    {
      type: "button",
      class: "payload-toggle",
      onclick: () => {
        asHex = !asHex;
        toggle.textContent = asHex ? "Show payloads as text" : "Show payloads as hex";
        for (const [cell, bytes] of payloadCells) cell.textContent = decodePayload(bytes, asHex);
      },
    },
    "Show payloads as hex",
  );
  return h("div", {}, toggle, table(["Message id", "Publish time", "Key", "Properties", "Payload"], rows, { id }));
}

function base64Bytes(b64) {
  const s = atob(b64);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

// Pulsar's peek answer: the payload is the body, the rest headers.
async function peekOne(full, sub, n) {
  const resp = await api.getRaw(`${api.subscriptionPath(full, sub)}/position/${n}`);
  const properties = {};
  for (const [k, v] of resp.headers.entries()) {
    const m = /^x-pulsar-property-(.+)$/i.exec(k);
    if (m) properties[m[1]] = v;
  }
  // A batch is peeked whole, as Pulsar does: its payload is the batch.
  const batch = resp.headers.get("X-Pulsar-num-batch-message");
  return {
    id: (resp.headers.get("X-Pulsar-Message-ID") || `#${n}`) + (batch ? ` (batch of ${batch})` : ""),
    publishTime: resp.headers.get("X-Pulsar-publish-time") || "",
    key: resp.headers.get("X-Pulsar-partition-key"),
    properties,
    payload: new Uint8Array(await resp.arrayBuffer()),
  };
}

async function topic(domain, tenant, ns, local) {
  const full = `${domain}://${tenant}/${ns}/${local}`;
  const base = api.topicPath(full);
  const root = page();
  let partitions = 0;
  try {
    partitions = (await api.get(`${base}/partitions`)).partitions || 0;
  } catch (e) {
    // A topic whose metadata cannot be read: the stats below say why.
  }
  const cards = h("div", { class: "cards", id: "topic-cards" });
  const canvas = h("canvas", { class: "chart", id: "rate-chart" });
  const chart = new RateChart(canvas, [{ name: "in", color: "#2c5cc5" }, { name: "out", color: "#1b9e53" }], CHART_SAMPLES);
  const legend = h("div", { class: "legend" });
  for (const s of chart.series) {
    const swatch = h("i", {});
    swatch.style.background = s.color;
    legend.append(h("span", {}, swatch, `messages ${s.name} per second`));
  }
  const subsBox = h("div", { id: "subscriptions" });
  const consumersBox = h("div", { id: "consumers" });
  const ledgersBox = h("div", { id: "ledgers" });
  const partsBox = h("div", {});
  const peekBox = h("div", { id: "peek-results" });
  const findBox = h("div", { id: "find-results" });
  const findKey = h("input", { id: "find-key", placeholder: "key", required: true });
  const findLimit = h("input", { id: "find-limit", type: "number", min: 1, max: 100, value: 10, size: 4 });
  const findForm = h(
    "form",
    {
      class: "inline",
      id: "find-form",
      onsubmit: async (ev) => {
        ev.preventDefault();
        try {
          const r = await api.get(`/admin/v2/magnetar/find${api.query({ topic: full, key: findKey.value, limit: findLimit.value })}`);
          const msgs = r.messages.map((m) => ({
            id: `${m.messageId}${partitions ? ` (${m.topic.split("-partition-").pop()})` : ""}`,
            publishTime: new Date(m.publishTime).toISOString(),
            key: m.key,
            properties: m.properties,
            payload: base64Bytes(m.payloadBase64),
          }));
          findBox.replaceChildren(
            h("p", { class: "muted" }, `${msgs.length} found, newest first${r.truncated ? " (more left out)" : ""}`),
            messageTable(msgs, "found-table"),
          );
        } catch (e) {
          failed(`find messages with key ${findKey.value}`, e);
        }
      },
    },
    "Find messages by key ",
    findKey,
    "at most",
    findLimit,
    h("button", { type: "submit" }, "Find"),
  );
  root.replaceChildren(
    h("h1", { id: "topic-name" }, full),
    h("p", { class: "muted" }, partitions ? `Partitioned topic: ${partitions} partitions (figures summed)` : "Not partitioned", " · ", h("a", { href: "#/topics" }, "all topics")),
    cards,
    h("h2", {}, "Throughput"),
    legend,
    canvas,
    partsBox,
    h("h2", {}, "Subscriptions"),
    subsBox,
    h("h2", {}, "Consumers"),
    consumersBox,
    h("h2", {}, "Peek"),
    peekBox,
    h("h2", {}, "Find by key"),
    findForm,
    findBox,
    h("h2", {}, "Ledgers"),
    ledgersBox,
  );

  async function peek(topicName, sub) {
    const count = 5;
    const msgs = [];
    try {
      for (let n = 1; n <= count; n++) {
        try {
          msgs.push(await peekOne(topicName, sub, n));
        } catch (e) {
          // Fewer messages than asked: Pulsar answers 404 past the last.
          if (e instanceof api.ApiError && e.status === 404 && n > 1) break;
          throw e;
        }
      }
      peekBox.replaceChildren(h("p", { class: "muted" }, `Next ${msgs.length} messages of ${sub} on ${topicName}`), messageTable(msgs, "peek-table"));
    } catch (e) {
      failed(`peek ${sub}`, e);
    }
  }

  function subscriptionRow(topicName, name, s) {
    const when = h("input", { type: "datetime-local", class: "reset-time", step: 1 });
    const d = new Date(Date.now() - 10 * 60 * 1000);
    when.value = new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 19);
    const sp = api.subscriptionPath(topicName, name);
    return h(
      "tr",
      { "data-subscription": name },
      h("td", {}, name, partitions ? h("div", { class: "muted" }, topicName.split("/").pop()) : null),
      h("td", { class: "sub-type" }, h("span", { class: "pill" }, s.type)),
      num(formatNumber(s.msgBacklog)),
      num(formatNumber(s.msgDelayed || 0)),
      num(formatNumber(s.unackedMessages)),
      num(fmtRate(s.msgRateOut)),
      num((s.consumers || []).length),
      h(
        "td",
        {},
        h("div", { class: "toolbar" },
          h("button", { type: "button", class: "peek", onclick: () => peek(topicName, name) }, "Peek"),
          h("button", {
            type: "button",
            class: "skip-all danger",
            onclick: async () => {
              if (!(await confirmAction("Skip the backlog", `Acknowledge all ${s.msgBacklog} messages of ${name}? Its consumers will not receive them.`))) return;
              await act(`skip the backlog of ${name}`, () => api.post(`${sp}/skip_all`), refresh);
            },
          }, "Skip all"),
          h("button", {
            type: "button",
            class: "delete-sub danger",
            onclick: async () => {
              if (!(await confirmAction("Delete the subscription", `Delete ${name} and its position? Messages kept only for it may be deleted.`))) return;
              await act(`delete ${name}`, () => api.del(sp), refresh);
            },
          }, "Delete"),
        ),
        h("div", { class: "toolbar" },
          when,
          h("button", {
            type: "button",
            class: "reset-cursor danger",
            onclick: async () => {
              const ts = new Date(when.value).getTime();
              if (!Number.isFinite(ts)) return notice("Pick a time to reset to", true);
              if (!(await confirmAction("Reset the cursor", `Move ${name} to the first message published at or after ${new Date(ts).toISOString()}? Messages before it count as acknowledged; later ones are delivered again.`))) return;
              await act(`reset ${name} to ${new Date(ts).toISOString()}`, () => api.post(`${sp}/resetcursor/${ts}`), refresh);
            },
          }, "Reset to time"),
        ),
      ),
    );
  }

  // The partitions' stats (or the topic's own), each with its name.
  async function statsOf() {
    if (!partitions) return [[full, await api.get(`${base}/stats`)]];
    const ps = await api.get(`${base}/partitioned-stats`);
    return Object.entries(ps.partitions || {}).sort(([a], [b]) => a.localeCompare(b, undefined, { numeric: true }));
  }

  let subsSeen = "";
  async function refresh() {
    let all;
    try {
      all = await statsOf();
    } catch (e) {
      cards.replaceChildren(h("p", { class: "error-text" }, `Cannot read the topic's stats: ${e.message}`));
      return;
    }
    const sum = (k) => all.reduce((a, [, s]) => a + (s[k] || 0), 0);
    let backlog = 0, delayed = 0, subs = 0, consumers = 0;
    const subRows = [], consumerRows = [];
    for (const [tn, s] of all) {
      for (const [name, sub] of Object.entries(s.subscriptions || {}).sort(([a], [b]) => a.localeCompare(b))) {
        subs++;
        backlog += sub.msgBacklog || 0;
        delayed += sub.msgDelayed || 0;
        subRows.push(subscriptionRow(tn, name, sub));
        for (const c of sub.consumers || []) {
          consumers++;
          consumerRows.push(
            h(
              "tr",
              { "data-consumer": c.consumerName },
              h("td", {}, name),
              h("td", { class: "consumer-name" }, c.consumerName),
              h("td", {}, c.address || "—"),
              num(c.availablePermits),
              num(c.unackedMessages),
              num(c.redeliveredMessages === undefined ? "—" : c.redeliveredMessages),
              h("td", {}, c.isActive ? "active" : "standby"),
            ),
          );
        }
      }
    }
    chart.push(Date.now(), [sum("msgRateIn"), sum("msgRateOut")]);
    cards.replaceChildren(
      card("In", fmtRate(sum("msgRateIn")), "rate-in"),
      card("Out", fmtRate(sum("msgRateOut")), "rate-out"),
      card("Bytes in", `${fmtBytes(sum("msgThroughputIn"))}/s`),
      card("Stored", fmtBytes(sum("storageSize"))),
      card("Backlog", formatNumber(backlog)),
      card("Delayed", formatNumber(delayed)),
      card("Subscriptions", subs),
      card("Consumers", consumers),
    );
    // The action rows are rebuilt only when something in them changed, so
    // a time being typed is not wiped by the next poll.
    const key = JSON.stringify(all.map(([tn, s]) => [tn, s.subscriptions]));
    if (key !== subsSeen) {
      subsSeen = key;
      subsBox.replaceChildren(
        table(
          ["Subscription", "Type", { label: "Backlog", cls: "num" }, { label: "Delayed", cls: "num" }, { label: "Unacked", cls: "num" },
            { label: "Rate out", cls: "num" }, { label: "Consumers", cls: "num" }, "Actions"],
          subRows,
          { id: "subscriptions-table" },
        ),
      );
      consumersBox.replaceChildren(
        table(["Subscription", "Name", "Address", { label: "Permits", cls: "num" }, { label: "Unacked", cls: "num" },
          { label: "Redelivered", cls: "num" }, "State"], consumerRows, { id: "consumers-table" }),
      );
    }
  }

  async function ledgers() {
    const names = partitions ? Array.from({ length: partitions }, (_, i) => `${full}-partition-${i}`) : [full];
    const parts = [];
    for (const tn of names.slice(0, 16)) {
      try {
        const s = await api.get(`${api.topicPath(tn)}/internalStats`);
        parts.push(
          h("h3", {}, tn),
          h("p", { class: "muted" }, `${s.numberOfEntries} entries, ${fmtBytes(s.totalSize)}, last confirmed ${s.lastConfirmedEntry}, ${s.entriesAddedCounter} added`),
          table(
            ["Ledger", { label: "Entries", cls: "num" }, { label: "Size", cls: "num" }],
            s.ledgers.map((l) => h("tr", {}, h("td", {}, l.ledgerId), num(l.entries), num(fmtBytes(l.size)))),
            { class: "ledgers-table" },
          ),
        );
      } catch (e) {
        parts.push(h("p", { class: "muted" }, `${tn}: ${e instanceof api.ApiError && e.status === 404 ? "not created yet" : e.message}`));
      }
    }
    if (names.length > 16) parts.push(h("p", { class: "muted" }, `…and ${names.length - 16} more partitions`));
    ledgersBox.replaceChildren(...parts);
  }

  if (partitions) {
    partsBox.append(
      h("h2", {}, "Partitions"),
      h("p", {}, Array.from({ length: Math.min(partitions, 64) }, (_, i) => [h("a", { href: topicHref(`${full}-partition-${i}`) }, `partition ${i}`), " "])),
    );
  }
  every(1000, refresh);
  every(10000, ledgers);
}

// ------------------------------------------------------------------ router

async function route() {
  timers.forEach(clearInterval);
  timers = [];
  const hash = location.hash || "#/";
  const path = hash.slice(1).split("?")[0];
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  for (const a of document.querySelectorAll("header nav a")) {
    a.classList.toggle("active", a.dataset.nav === (parts[0] === "topic" ? "topics" : parts[0] || "overview"));
  }
  try {
    if (parts.length === 0) await overview();
    else if (parts[0] === "tenants") await tenants();
    else if (parts[0] === "topics") await topics();
    else if (parts[0] === "topic" && parts.length >= 5) await topic(parts[1], parts[2], parts[3], parts.slice(4).join("/"));
    else page().replaceChildren(h("p", {}, "No such page. "), h("a", { href: "#/" }, "Overview"));
  } catch (e) {
    page().replaceChildren(h("p", { class: "error-text" }, e.message));
  }
}

document.getElementById("token-button").addEventListener("click", () => askToken(""));
window.addEventListener("hashchange", route);
showAuthState();
route();
