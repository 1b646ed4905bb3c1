// The scorer-groups console: a page of the API's own, for the people who own groups.
//
// It talks to the same HTTP API as the SDK, with the API key the user signs in with, kept in
// this tab's sessionStorage only (never in a URL or a cookie). Every string a tenant wrote -
// group and member names, justifications, trace text - is put on the page as text
// (textContent), never as markup: the page has no innerHTML, and its Content-Security-Policy
// allows no inline script.
"use strict";

const KEY = "sgw-api-key";
const ROLE = "sgw-api-key-role"; // "reviewer" for a key that may only review (reviews.js)
const TRACE_URL = "sgw-trace-url-template"; // e.g. https://observability.example/traces/{traceId}
const WINDOWS = ["1h", "24h", "7d", "30d"];

// --- building the page -----------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  return node;
}

function show(...nodes) {
  const main = document.getElementById("main");
  main.replaceChildren(...nodes);
}

function fmt(value, digits = 2) {
  return value === null || value === undefined ? "no score" : Number(value).toFixed(digits);
}

// --- the API ---------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
  }
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(KEY) || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body),
                                       credentials: "omit", cache: "no-store" });
  const text = await response.text();
  const data = text ? JSON.parse(text) : null;
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

function failure(error) {
  if (error instanceof ApiError && error.status === 401) {
    sessionStorage.removeItem(KEY);
    sessionStorage.removeItem(ROLE);
    location.hash = "#/";
  }
  return el("p", { class: "error", role: "alert" }, error.message);
}

// --- sign in ---------------------------------------------------------------------------------

function signIn() {
  const input = el("input", { type: "password", id: "api-key", autocomplete: "off", size: 48 });
  const message = el("p", { class: "error", role: "alert" });
  const form = el("form", {
    id: "sign-in",
    onsubmit: async (event) => {
      event.preventDefault();
      sessionStorage.setItem(KEY, input.value.trim());
      sessionStorage.removeItem(ROLE);
      try {
        try {
          await api("GET", "/v1/scorer-groups?limit=1");
        } catch (error) {
          if (error.status !== 403) throw error;
          await api("GET", "/v1/review-queues?limit=1"); // a reviewer key: it may review, nothing else
          sessionStorage.setItem(ROLE, "reviewer");
          location.hash = "#/reviews";
        }
        route();
      } catch (error) {
        sessionStorage.removeItem(KEY);
        sessionStorage.removeItem(ROLE);
        message.textContent = error.status === 401 ? "That API key is unknown or revoked." : error.message;
      }
    },
  }, el("label", { for: "api-key" }, "API key (from scorer-worker keys create)"), input, " ",
     el("button", { type: "submit" }, "Sign in"), message);
  show(el("section", {}, el("h1", {}, "Sign in"), form));
}

// --- groups ----------------------------------------------------------------------------------

function profileText(online) {
  if (!online) return "not scored live";
  const state = online.enabled ? "live" : "paused";
  return `${state}, ${online.scope} scope, ${online.filter ? "filtered, " : ""}` +
         `sample ${Math.round(online.sampleRate * 100)}%${online.filter ? " of matching traffic" : ""}, ` +
         `alert below ${online.alertThreshold ?? "-"} (${online.severity})` +
         (online.alertMode && online.alertMode !== "each" ? `, pages by incidents (${online.alertMode})` : "");
}

async function groupsPage() {
  show(el("p", { class: "muted" }, "Loading groups..."));
  try {
    const page = await api("GET", "/v1/scorer-groups?limit=200");
    const rows = await Promise.all(page.items.map(async (group) => {
      let mean = null;
      try { mean = (await api("GET", `/v1/scorer-groups/${encodeURIComponent(group.id)}/ratings?window=24h`)).mean; }
      catch (_) { /* the list still shows the group */ }
      return el("tr", { dataset: { group: group.id } },
        el("td", {}, el("a", { href: `#/groups/${encodeURIComponent(group.id)}`, class: "group-name" }, group.name)),
        el("td", {}, group.members.map((m) => m.label || m.refId).join(", ")),
        el("td", {}, profileText(group.online)),
        el("td", {}, fmt(mean)));
    }));
    show(el("section", {}, el("h1", {}, "Groups"),
      el("table", { id: "groups" },
        el("thead", {}, el("tr", {}, el("th", {}, "Name"), el("th", {}, "Members"), el("th", {}, "Online profile"),
                                     el("th", {}, "Mean, 24h"))),
        el("tbody", {}, rows)),
      rows.length ? null : el("p", { class: "muted" }, "No groups yet: create one.")));
  } catch (error) {
    show(failure(error));
  }
}

// --- one group: incidents (incidents.js), chart, results, backfills (backfills.js), edit, playground

async function groupPage(groupId) {
  show(el("p", { class: "muted" }, "Loading..."));
  let group;
  try {
    group = await api("GET", `/v1/scorer-groups/${encodeURIComponent(groupId)}`);
  } catch (error) {
    show(failure(error));
    return;
  }
  const chart = el("div", { id: "chart" });
  const results = el("div", { id: "results" });
  const backfills = el("div", { id: "backfills" });
  const incidents = el("div", { id: "incidents" });
  const agreement = el("div", { id: "live-agreement" });
  show(
    el("section", {}, el("h1", { id: "group-title" }, group.name),
      el("p", { class: "muted" }, profileText(group.online), group.gatesFirst ? " - gates first" : ""),
      el("p", { id: "judge-links" }, "Judges: ", group.members.filter((m) => m.kind === "judge").map((m, i) => [
        i ? ", " : "", el("a", { href: `#/judges/${encodeURIComponent(m.refId)}`, class: "judge-link" }, m.label || m.refId)]).flat()),
      group.description ? el("p", {}, group.description) : null),
    el("section", {}, el("h2", {}, "Incidents"), incidents),
    el("section", {}, el("h2", {}, "Ratings"), chart),
    el("section", {}, el("h2", {}, "Agreement with people"), agreement),
    el("section", {}, el("h2", {}, "Recent results"), results),
    el("section", {}, el("h2", {}, "Backfills"), backfills),
    el("section", {}, el("h2", {}, "Compare with another group"), compareView(group)),
    el("section", {}, el("h2", {}, "Playground"), playground(group)),
    el("section", {}, el("h2", {}, "Edit"), await groupForm(group)));
  drawChart(chart, group, "24h");
  listResults(results, group);
  listBackfills(backfills, group);
  listIncidents(incidents, group);
  showAgreement(agreement, group);
}

// The judges against people's labels in the review queues watching the group (reviews.js), with
// the dataset runs' figures (runs.js: agreementView).
async function showAgreement(container, group) {
  try {
    const live = await api("GET", `/v1/scorer-groups/${encodeURIComponent(group.id)}/agreement`);
    const people = live.reviewers;
    const parts = [
      live.agreement ? agreementView(live.agreement)
        : el("p", { class: "muted" }, "No labelled review items yet: a review queue watching this group, and people " +
             "labelling its items, measure its judges here."),
      people ? el("p", { id: "reviewers-agreement" }, `Reviewers with each other, over ${people.items} items labelled ` +
                  `twice: Spearman ${fmt(people.spearman)}, kappa ${fmt(people.kappa)}, MAE ${fmt(people.meanAbsoluteError)}.`)
        : null];
    container.replaceChildren(...parts.filter(Boolean)); // a null given to replaceChildren shows as "null"
  } catch (error) {
    container.replaceChildren(failure(error));
  }
}

async function drawChart(container, group, window) {
  const tabs = el("div", { class: "tabs", role: "group" }, WINDOWS.map((w) =>
    el("button", { type: "button", "aria-pressed": w === window ? "true" : "false", dataset: { window: w },
                   onclick: () => drawChart(container, group, w) }, w)));
  let history, level, day;
  const ratings = (w) => api("GET", `/v1/scorer-groups/${encodeURIComponent(group.id)}/ratings?window=${w}`);
  try {
    [history, level, day] = await Promise.all([ratings(window), groupLevel(group),
                                               window === "24h" ? null : ratings("24h")]);
  } catch (error) {
    container.replaceChildren(tabs, failure(error));
    return;
  }
  const width = 900, height = 200, pad = 28;
  const buckets = history.buckets;
  const x = (i) => pad + (i * (width - 2 * pad)) / Math.max(1, buckets.length - 1);
  const y = (v) => height - pad - (v * (height - 2 * pad)) / 10;
  const plot = svg("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, role: "img",
                            "aria-label": `Mean score per bucket, ${window}` });
  for (const v of [0, 5, 10]) {
    plot.append(svg("line", { class: "axis", x1: pad, x2: width - pad, y1: y(v), y2: y(v) }));
    const label = svg("text", { x: 4, y: y(v) + 3 });
    label.textContent = String(v);
    plot.append(label);
  }
  if (level) { // the level drift alerts judge against, behind the data: its mean and +/- sigma spreads
    const sigma = (group.online && group.online.alertDriftSigma) ?? DRIFT_SIGMA;
    const clamp = (v) => Math.min(10, Math.max(0, v));
    const top = y(clamp(level.mean + sigma * level.spread)), bottom = y(clamp(level.mean - sigma * level.spread));
    const layer = svg("g", { class: "level", id: "chart-level" });
    const label = svg("text", { class: "level-label", x: width - pad, y: y(clamp(level.mean)) - 4, "text-anchor": "end" });
    label.textContent = "learned level";
    const title = svg("title", {});
    title.textContent = `learned level ${fmt(level.mean)} +/- ${sigma} x ${fmt(level.spread)}, from ${level.windows} windows`;
    layer.append(svg("rect", { class: "level-band", x: pad, y: top, width: width - 2 * pad, height: bottom - top }),
                 svg("line", { class: "level-line", x1: pad, x2: width - pad, y1: y(clamp(level.mean)), y2: y(clamp(level.mean)) }),
                 label, title);
    plot.append(layer);
  }
  const scored = buckets.map((b, i) => ({ b, i })).filter(({ b }) => b.mean !== null);
  if (scored.length) {
    const upper = scored.map(({ b, i }) => `${x(i)},${y(b.max)}`);
    const lower = scored.slice().reverse().map(({ b, i }) => `${x(i)},${y(b.min)}`);
    plot.append(svg("polygon", { class: "band", points: upper.concat(lower).join(" ") }));
    plot.append(svg("polyline", { class: "mean", points: scored.map(({ b, i }) => `${x(i)},${y(b.mean)}`).join(" ") }));
    for (const { b, i } of scored) {
      const point = svg("circle", { class: "point", cx: x(i), cy: y(b.mean), r: 3 });
      const title = svg("title", {});
      title.textContent = `${new Date(b.start * 1000).toISOString()}: mean ${fmt(b.mean)}, ` +
                          `${b.min}-${b.max}, ${b.count} results, ${b.belowThreshold} below, ${b.noScore} without score`;
      point.append(title);
      plot.append(point);
    }
  }
  const threshold = group.online && group.online.alertThreshold;
  if (threshold !== null && threshold !== undefined) {
    plot.append(svg("line", { class: "threshold", x1: pad, x2: width - pad, y1: y(threshold), y2: y(threshold) }));
  }
  const summary = el("p", { id: "chart-summary" },
    `${history.count} results, mean ${fmt(history.mean)}; `,
    el("span", { class: "bad" }, `${history.belowThreshold} below the threshold`), "; ",
    `${history.noScore} without a score; ${history.skipped} skipped for budget; `,
    el("span", { id: "chart-matched" }, group.online && group.online.filter
      ? `${history.matched} traces matched the filter` : `${history.matched} traces of the project seen`));
  container.replaceChildren(tabs, plot, summary, spendLine(history, day || history));
}

// What the group's judge calls cost (SGW_JUDGE_PRICES): the window's, a result's on average, the
// last day's. Calls of an unpriced model are named: the figure is a floor then, never "free".
function spendLine(history, day) {
  const money = (v) => `${v.toLocaleString(undefined, { maximumFractionDigits: v < 1 ? 6 : 2 })} ${history.currency}`;
  const unknown = (h) => h.unpricedCalls ? ` and ${h.unpricedCalls} call(s) of unknown cost` : "";
  if (history.unpricedCalls && !history.cost) {  // nothing priced: no figure to show, only how to get one
    return el("p", { id: "chart-spend", class: "muted" },
      `Spend unknown: ${history.unpricedCalls} judge call(s) over ${history.window} of models without a price ` +
      "- set SGW_JUDGE_PRICES for them.");
  }
  return el("p", { id: "chart-spend", class: "muted" },
    `Spend: ${money(history.cost)} over ${history.window}${unknown(history)}`,
    history.costPerResult === null ? "" : ` (${money(history.costPerResult)} a result)`,
    `; ${money(day.cost)} over the last day${unknown(day)}.`);
}

function traceLink(traceId) {
  const template = localStorage.getItem(TRACE_URL) || "";
  if (!traceId) return null;
  if (!/^https?:\/\//.test(template) || !template.includes("{traceId}")) return el("code", {}, traceId);
  return el("a", { href: template.replace("{traceId}", encodeURIComponent(traceId)), rel: "noreferrer noopener",
                   target: "_blank" }, traceId);
}

// action(member): what a member's last cell holds (the Judge scores view's Call button, calls.js), if given.
function membersTable(members, action) {
  const headers = ["Member", "Kind", "Status", "Verdict", "Goodness", "Detail", ...(action ? ["Judge call"] : [])];
  return el("table", { class: "members" },
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, members.map((m) => el("tr", { dataset: { member: m.name } },
      el("td", {}, m.name, m.gate ? " (must pass)" : ""), el("td", {}, m.kind),
      el("td", { class: m.status === "scored" ? "" : "bad" }, m.status, m.cached
        ? el("span", { class: "cached", title: `paid for already, by rating ${m.cachedFrom}`, dataset: { cached: m.cachedFrom } },
             " (cached)") : null),
      el("td", {}, m.native === null || m.native === undefined ? "-" : String(m.native)),
      el("td", {}, m.goodness === null || m.goodness === undefined ? "-" : fmt(m.goodness)),
      el("td", {}, m.detail || ""), action ? el("td", {}, action(m)) : null))));
}

function resultView(rating, queues = []) {
  const body = el("div", { class: "result-body" });
  const groupView = () => el("p", { class: "justification" }, rating.justification);
  const switcher = el("div", { class: "tabs", role: "group", "aria-label": "Group score or judge scores" });
  const calls = callsLoader(rating); // calls.js: read once, whichever view asks
  const views = { "Group score": groupView, "Judge scores": () => judgeScoresView(rating, calls) };
  for (const name of Object.keys(views)) {
    switcher.append(el("button", { type: "button", "aria-pressed": name === "Group score" ? "true" : "false",
      dataset: { view: name },
      onclick: (event) => {
        for (const b of switcher.children) b.setAttribute("aria-pressed", b === event.currentTarget ? "true" : "false");
        body.replaceChildren(views[name]());
      } }, name));
  }
  body.append(groupView());
  const score = rating.rating;
  const below = rating.members && score !== null && rating.reason;
  return el("div", { class: "result", dataset: { rating: rating.id } },
    el("div", { class: "row" }, el("span", { class: `score ${below ? "bad" : ""}` }, fmt(score)),
      traceLink(rating.traceId) || (rating.sessionId ? el("code", {}, `session ${rating.sessionId}`) : null),
      rating.spanId ? el("span", { class: "span-name", "data-span": rating.spanId },
                         `step "${rating.spanName || ""}" (span ${rating.spanId})`) : null,
      el("span", { class: "muted" }, new Date(rating.scoredAt).toLocaleString()), switcher,
      queues.length ? addToQueue(rating, queues) : null), // reviews.js
    body);
}

async function listResults(container, group, below = false) {
  const toggle = el("label", {}, el("input", { type: "checkbox", id: "below-only", checked: below,
    onchange: (event) => listResults(container, group, event.currentTarget.checked) }), " only below the threshold");
  try {
    const [page, queues] = await Promise.all([
      api("GET", `/v1/scorer-groups/${encodeURIComponent(group.id)}/results?limit=20&below=${below}`),
      queuesWatching(group)]);
    container.replaceChildren(toggle, cacheHitRate(page.items),
                              ...(page.items.length ? page.items.map((r) => resultView(r, queues))
                                  : [el("p", { class: "muted" }, "No results yet.")]));
  } catch (error) {
    container.replaceChildren(toggle, failure(error));
  }
}

// The verdict cache over these results: judge verdicts paid for already (no call, no budget).
function cacheHitRate(ratings) {
  const verdicts = ratings.flatMap((r) => r.members.filter((m) => m.kind === "judge" && m.status === "scored"));
  if (!verdicts.length) return null;
  const hits = verdicts.filter((m) => m.cached).length;
  return el("p", { id: "cache-hit-rate", class: "muted" },
    `Verdict cache: ${hits} of these ${verdicts.length} judge verdicts were paid for already ` +
    `(${Math.round((100 * hits) / verdicts.length)}% hit rate: no judge call, no budget).`);
}

// Groups at one sample rate grade the same traces (consistent sampling): their results can be
// set side by side, trace by trace, with the mean difference over the traces both scored.
function compareView(group) {
  const out = el("div", { id: "comparison" });
  const select = el("select", { id: "compare-with", onchange: () => compare(group, select.value, out) },
    el("option", { value: "" }, "choose a group"));
  api("GET", "/v1/scorer-groups?limit=200").then((page) => {
    for (const other of page.items) {
      if (other.id !== group.id && other.projectId === group.projectId) {
        select.append(el("option", { value: other.id }, other.name));
      }
    }
  }).catch((error) => out.replaceChildren(failure(error)));
  return el("div", {}, el("label", {}, "Compare with ", select), out);
}

async function compare(group, otherId, out) {
  if (!otherId) { out.replaceChildren(); return; }
  const results = (id) => api("GET", `/v1/scorer-groups/${encodeURIComponent(id)}/results?limit=200`);
  let mine, theirs;
  try { [mine, theirs] = await Promise.all([results(group.id), results(otherId)]); }
  catch (error) { out.replaceChildren(failure(error)); return; }
  const key = (r) => (r.traceId ? `trace ${r.traceId}${r.spanId ? ` span ${r.spanId}` : ""}` : `session ${r.sessionId}`);
  const others = new Map(theirs.items.map((r) => [key(r), r]));
  const shared = mine.items.filter((r) => others.has(key(r)) && r.rating !== null && others.get(key(r)).rating !== null);
  if (!shared.length) {
    out.replaceChildren(el("p", { class: "muted", id: "compare-summary" },
      "No trace scored by both yet (their latest results; at different rates or salts they grade different traffic)."));
    return;
  }
  const diffs = shared.map((r) => r.rating - others.get(key(r)).rating);
  const mean = diffs.reduce((a, b) => a + b, 0) / diffs.length;
  out.replaceChildren(
    el("p", { id: "compare-summary" }, `${shared.length} shared, mean difference ${mean >= 0 ? "+" : ""}${fmt(mean)} ` +
      `(this group minus the other)`),
    el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "subject"), el("th", {}, "this group"),
                                        el("th", {}, "the other"), el("th", {}, "difference"))),
      el("tbody", {}, shared.slice(0, 20).map((r, i) => el("tr", { dataset: { subject: key(r) } },
        el("td", {}, traceLink(r.traceId) || el("code", {}, key(r))), el("td", {}, fmt(r.rating)),
        el("td", {}, fmt(others.get(key(r)).rating)), el("td", {}, fmt(diffs[i])))))));
}

function playground(group) {
  const input = el("textarea", { id: "play-input", name: "input" });
  const output = el("textarea", { id: "play-output", name: "output" });
  const expected = el("textarea", { id: "play-expected", name: "expected" });
  // What only a filter reads: the answer says whether live scoring would see the example.
  const agentId = el("input", { id: "play-agent", size: 20, placeholder: "playground" });
  const rootName = el("input", { id: "play-root-name", size: 20 });
  const metadata = el("input", { id: "play-metadata", size: 40, placeholder: '{"environment": "production"}' });
  const answer = el("div", { id: "play-answer" });
  return el("form", {
    id: "playground",
    onsubmit: async (event) => {
      event.preventDefault();
      answer.replaceChildren(el("p", { class: "muted" }, "Grading..."));
      try {
        let extra = {};
        try { extra = metadata.value.trim() === "" ? {} : JSON.parse(metadata.value); } catch (error) {
          answer.replaceChildren(el("p", { class: "error" }, `metadata: not JSON: ${error.message}`));
          return;
        }
        const rating = await api("POST", `/v1/scorer-groups/${encodeURIComponent(group.id)}/grade`, {
          input: input.value, output: output.value, expected: expected.value === "" ? null : expected.value,
          metadata: extra, agentId: agentId.value || null, rootName: rootName.value || null });
        const seen = rating.passesFilter === null || rating.passesFilter === undefined ? null
          : el("p", { id: "play-filter", class: rating.passesFilter ? "good" : "bad" }, rating.passesFilter
            ? "Live scoring would see this example: it matches the group's filter."
            : "Live scoring would not see this example: it does not match the group's filter.");
        answer.replaceChildren(el("p", {}, el("span", { class: "score" }, fmt(rating.rating)), rating.justification),
                               seen, membersTable(rating.members));
      } catch (error) {
        answer.replaceChildren(failure(error));
      }
    },
  }, el("label", { for: "play-input" }, "Input"), input, el("label", { for: "play-output" }, "Output"), output,
     el("label", { for: "play-expected" }, "Expected (optional)"), expected,
     el("div", { class: "row" }, el("div", {}, el("label", { for: "play-agent" }, "Agent id (optional)"), agentId),
       el("div", {}, el("label", { for: "play-root-name" }, "Root span name (optional)"), rootName),
       el("div", {}, el("label", { for: "play-metadata" }, "Metadata, JSON (optional)"), metadata)),
     el("p", {},
     el("button", { type: "submit" }, "Grade")), answer);
}

// --- create and edit: the API's validation errors at the field they name ---------------------

async function scorerOptions() {
  const [judges, patterns, customs, templates] = await Promise.all([...["judges", "patterns", "customs"].map(
    (kind) => api("GET", `/v1/${kind}?limit=200`).then((p) => p.items)), judgeTemplates()]);
  return { judge: judges, pattern: patterns, custom: customs, templates };
}

function memberRow(options, member, index) {
  const kind = el("select", { "data-field": `members[${index}].kind`, name: "kind" },
    ["judge", "pattern", "custom"].map((k) => el("option", { value: k, selected: k === member.kind }, k)));
  const ref = el("select", { "data-field": `members[${index}].refId`, name: "refId" });
  const reads = templateReadsNote(); // calls.js: a judge made from a template on save
  const fill = () => {
    ref.replaceChildren(...options[kind.value].map((s) =>
      el("option", { value: s.id, selected: s.id === member.refId }, s.name)),
      ...(kind.value === "judge" ? templateChoices(options.templates, member.refId) : []));
    showTemplateReads(reads, ref, options.templates);
  };
  kind.addEventListener("change", fill);
  ref.addEventListener("change", () => showTemplateReads(reads, ref, options.templates));
  fill();
  return el("div", { class: "row member" },
    el("div", {}, el("label", {}, "Kind"), kind), el("div", {}, el("label", {}, "Scorer"), ref, reads),
    el("div", {}, el("label", {}, "Weight"), el("input", { name: "weight", type: "number", step: "any",
      value: member.weight ?? 1, "data-field": `members[${index}].weight` })),
    el("div", {}, el("label", {}, el("input", { name: "gate", type: "checkbox", checked: !!member.gate,
      "data-field": `members[${index}].gate` }), " must pass")),
    el("button", { type: "button", class: "secondary", onclick: (e) => e.currentTarget.parentElement.remove() }, "Remove"));
}

function field(label, name, input) {
  input.setAttribute("data-field", name);
  input.id = `f-${name}`;
  return el("div", {}, el("label", { for: input.id }, label), input);
}

async function groupForm(group) {
  let options;
  try { options = await scorerOptions(); } catch (error) { return failure(error); }
  const online = (group && group.online) || {};
  const members = el("div", { id: "members" }, (group ? group.members : [{ kind: "judge", weight: 1 }])
    .map((m, i) => memberRow(options, m, i)));
  const inputs = {
    name: el("input", { value: group ? group.name : "", size: 40 }),
    description: el("input", { value: (group && group.description) || "", size: 60 }),
    enabled: el("input", { type: "checkbox", checked: !!online.enabled }),
    sampleRate: el("input", { type: "number", step: "any", value: online.sampleRate ?? 1 }),
    sampleSalt: el("input", { value: online.sampleSalt ?? "", size: 12, placeholder: "none: shared sample" }),
    alertThreshold: el("input", { type: "number", step: "any", value: online.alertThreshold ?? "" }),
    severity: el("select", {}, ["low", "medium", "high", "critical"].map((s) =>
      el("option", { value: s, selected: s === (online.severity || "medium") }, s))),
    scope: el("select", {}, ["trace", "session", "span"].map((s) => el("option", { value: s, selected: s === (online.scope || "trace") }, s))),
    idleSeconds: el("input", { type: "number", value: online.idleSeconds ?? 120 }),
    gatesFirst: el("input", { type: "checkbox", checked: !!(group && group.gatesFirst) }),
  };
  const alerts = alertFields(online);
  const filter = filterBuilder(online.filter || null);
  const spanFilter = filterBuilder(online.spanFilter || null, { prefix: "span-filter", path: "online.spanFilter",
    fields: SPAN_FILTER_FIELDS, intro: "Span scope: each span of a matching trace that this takes is graded on its " +
      "own (its input and output; the trace's request as a judge's context). Required for span scope." });
  inputs.enabled.setAttribute("data-field", "online.enabled");
  inputs.gatesFirst.setAttribute("data-field", "gatesFirst");
  const message = el("p", { class: "error", role: "alert", id: "form-message" });
  const form = el("form", { id: "group-form", novalidate: true, onsubmit: async (event) => {
    event.preventDefault();
    clearErrors(form);
    const number = (input) => (input.value === "" ? null : Number(input.value));
    let aimedAt, steps;
    try { aimedAt = filter.read(); } catch (error) {
      showErrors(form, message, { problem: { errors: [{ field: "online.filter", message: error.message }] } });
      return;
    }
    try { steps = spanFilter.read(); } catch (error) {
      showErrors(form, message, { problem: { errors: [{ field: "online.spanFilter", message: error.message }] } });
      return;
    }
    const alerting = alerts.read();
    if (alerting.errors.length) { showErrors(form, message, { problem: { errors: alerting.errors } }); return; }
    const made = await judgesFromTemplates([...members.querySelectorAll(".member")], options); // calls.js
    if (made.length) { showErrors(form, message, { problem: { errors: made } }); return; }
    const body = {
      name: inputs.name.value, description: inputs.description.value || null, gatesFirst: inputs.gatesFirst.checked,
      members: [...members.querySelectorAll(".member")].map((row) => ({
        kind: row.querySelector("[name=kind]").value, refId: row.querySelector("[name=refId]").value,
        weight: number(row.querySelector("[name=weight]")), gate: row.querySelector("[name=gate]").checked })),
      online: { enabled: inputs.enabled.checked, sampleRate: number(inputs.sampleRate),
                sampleSalt: inputs.sampleSalt.value || null,
                alertThreshold: number(inputs.alertThreshold), severity: inputs.severity.value,
                scope: inputs.scope.value, idleSeconds: number(inputs.idleSeconds), filter: aimedAt,
                spanFilter: steps, ...alerting.values },
    };
    try {
      const saved = group ? await api("PATCH", `/v1/scorer-groups/${encodeURIComponent(group.id)}`, body)
                          : await api("POST", "/v1/scorer-groups", body);
      location.hash = `#/groups/${encodeURIComponent(saved.id)}`;
      if (group) route();
    } catch (error) {
      showErrors(form, message, error);
    }
  } },
    field("Name", "name", inputs.name), field("Description", "description", inputs.description),
    el("h2", {}, "Members"), members,
    el("p", {}, el("button", { type: "button", class: "secondary", onclick: () =>
      members.append(memberRow(options, { kind: "judge", weight: 1 }, members.children.length)) }, "Add a member")),
    el("div", {}, el("label", {}, inputs.gatesFirst, " gates first: judges wait for the free must-pass members")),
    el("h2", {}, "Online profile"),
    el("div", { class: "row" }, el("div", {}, el("label", {}, inputs.enabled, " live")),
      field("Sample rate (0-1)", "online.sampleRate", inputs.sampleRate),
      field("Sample salt (optional)", "online.sampleSalt", inputs.sampleSalt),
      field("Alert threshold (0-10)", "online.alertThreshold", inputs.alertThreshold),
      field("Severity", "online.severity", inputs.severity), field("Scope", "online.scope", inputs.scope),
      field("Idle seconds (session)", "online.idleSeconds", inputs.idleSeconds)),
    el("h2", {}, "Alerts"), alerts.node,
    el("h2", {}, "Filter"), filter.node,
    el("h2", {}, "Span filter"), spanFilter.node,
    el("p", {}, el("button", { type: "submit" }, group ? "Save" : "Create")), message);
  return form;
}

function clearErrors(form) {
  for (const node of form.querySelectorAll(".field-error")) node.remove();
  for (const node of form.querySelectorAll(".invalid")) node.classList.remove("invalid");
}

// The input an error names; else the one whose path holds it (a filter edited as JSON): the
// message then says the rest of the path.
function errorTarget(form, path) {
  let best = null;
  for (const node of form.querySelectorAll("[data-field]")) {
    const own = node.getAttribute("data-field");
    if (own === path) return { node, exact: true };
    const holds = path.startsWith(own) && (path[own.length] === "." || path[own.length] === "[");
    if (holds && !node.hidden && node.offsetParent !== null && (!best || own.length > best.getAttribute("data-field").length)) best = node;
  }
  return best ? { node: best, exact: false } : null;
}

function showErrors(form, message, error) {
  const unplaced = [];
  for (const problem of (error.problem && error.problem.errors) || []) {
    const target = errorTarget(form, problem.field);
    if (!target) { unplaced.push(`${problem.field}: ${problem.message}`); continue; }
    target.node.classList.add("invalid");
    target.node.parentElement.append(el("span", { class: "field-error", "data-error-for": problem.field },
      target.exact ? problem.message : `${problem.field}: ${problem.message}`));
  }
  message.textContent = unplaced.length ? unplaced.join("; ") : (error.problem.errors ? "" : error.message);
}

async function newGroupPage() {
  show(el("section", {}, el("h1", {}, "New group"), await groupForm(null)));
}

// --- settings --------------------------------------------------------------------------------

function settingsPage() {
  const template = el("input", { id: "trace-url", size: 60, value: localStorage.getItem(TRACE_URL) || "",
                                 placeholder: "https://observability.example/traces/{traceId}" });
  const saved = el("span", { class: "muted" });
  show(el("section", {}, el("h1", {}, "Settings"), el("form", { onsubmit: (event) => {
    event.preventDefault();
    localStorage.setItem(TRACE_URL, template.value.trim());
    saved.textContent = " saved";
  } }, el("label", { for: "trace-url" }, "Link trace ids to (http(s) URL with {traceId})"), template, " ",
    el("button", { type: "submit" }, "Save"), saved)));
}

// --- routes ----------------------------------------------------------------------------------

function route() {
  const signedIn = !!sessionStorage.getItem(KEY);
  const reviewer = sessionStorage.getItem(ROLE) === "reviewer";
  document.getElementById("nav").hidden = !signedIn;
  for (const link of document.querySelectorAll("#nav a:not(.for-reviewers)")) link.hidden = reviewer;
  review = null; // reviews.js: its keys act on its own page only
  if (!signedIn) return signIn();
  const [, page, id] = location.hash.replace(/^#/, "").split("/");
  if (page === "reviews" && id) return reviewPage(decodeURIComponent(id)); // reviews.js
  if (page === "judges" && id && !reviewer) return judgePage(decodeURIComponent(id)); // judges.js
  if (page === "reviews" || reviewer) return reviewsPage();
  if (page === "groups" && id) return groupPage(decodeURIComponent(id));
  if (page === "new") return newGroupPage();
  if (page === "runs" && id) return runPage(decodeURIComponent(id)); // runs.js, as runsPage
  if (page === "runs") return runsPage();
  if (page === "templates") return templatesPage(); // templates.js
  if (page === "settings") return settingsPage();
  return groupsPage();
}

window.addEventListener("hashchange", route);
document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    sessionStorage.removeItem(ROLE);
    location.hash = "#/";
    route();
  });
  route();
});
