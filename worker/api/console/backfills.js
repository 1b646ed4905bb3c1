// Backfills on a group's page: the group's jobs - their window, progress, notes and
// error - read again every two seconds while one has not ended, each with a Cancel button until
// it ends; and a form that starts one over a past window. Refusals are shown at the field the
// API names, as in the group editor. Like the rest of the console, every string the server
// sends (notes, errors, ids) is put on the page as text.
"use strict";

const BACKFILL_PRESETS = { "1h": "last hour", "24h": "last 24 hours", "7d": "last 7 days" };
const BACKFILL_SECONDS = { "1h": 3600, "24h": 86400, "7d": 7 * 86400 };
const BACKFILL_ENDED = ["done", "failed", "cancelled"];
const BACKFILL_POLL_MS = 2000;

function backfillTime(iso) {
  return iso ? new Date(iso).toLocaleString() : "-";
}

// A datetime-local input holds wall time without a zone: the browser's own.
function localInputValue(date) {
  return new Date(date.getTime() - date.getTimezoneOffset() * 60000).toISOString().slice(0, 16);
}

// The input's local time as ISO-8601 with a zone (UTC), or null when it holds none.
function isoOfLocal(value) {
  if (!value) return null;
  const date = new Date(value); // a date-time without an offset is local time
  return Number.isNaN(date.getTime()) ? null : date.toISOString();
}

function backfillPercent(fraction) {
  return `${Math.floor((fraction || 0) * 100)}%`; // floored: a running job never reads 100%
}

function backfillView(job, cancel) {
  const ended = BACKFILL_ENDED.includes(job.status);
  const p = job.progress || {};
  const calls = job.maxJudgeCalls ? `${p.judgeCalls ?? 0} of at most ${job.maxJudgeCalls}` : `${p.judgeCalls ?? 0}`;
  const tone = job.status === "done" ? "good" : job.status === "failed" ? "bad" : job.status === "cancelled" ? "muted" : "";
  return el("div", { class: "backfill", dataset: { backfill: job.id, status: job.status } },
    el("div", { class: "row" },
      el("span", { class: `backfill-status ${tone}` }, job.status),
      el("span", { class: "backfill-window" }, `${backfillTime(job.from)} to ${backfillTime(job.to)}`),
      el("span", { class: "muted" }, `sample ${+(job.sampleRate * 100).toFixed(2)}%, ` +
                                     `alerts ${job.alerts ? "on" : "off"}, started ${backfillTime(job.createdAt)}`),
      ended ? null : el("button", { type: "button", class: "secondary", dataset: { cancel: job.id },
                                    onclick: (event) => cancel(job, event.currentTarget) }, "Cancel")),
    el("div", { class: "row backfill-progress" },
      el("progress", { max: 1, value: Math.min(1, Math.max(0, p.fraction || 0)) }),
      el("span", { class: "backfill-counts" }, `${backfillPercent(p.fraction)}: ${p.tracesRead ?? 0} traces read, ` +
        `${p.pairsScored ?? 0} scored, ${p.pairsSkipped ?? 0} skipped, ${calls} judge calls`)),
    job.status === "paused" && job.resumeAt
      ? el("p", { class: "muted backfill-paused" }, `paused until ${backfillTime(job.resumeAt)}`) : null,
    (job.notes || []).length ? el("ul", { class: "backfill-notes" }, job.notes.map((n) => el("li", {}, n))) : null,
    job.error ? el("p", { class: "error backfill-error" }, job.error) : null);
}

function backfillForm(group, started) {
  const online = group.online;
  const inputs = {
    window: el("select", { id: "bf-window" },
      Object.entries(BACKFILL_PRESETS).map(([w, text]) => el("option", { value: w, selected: w === "24h" }, text)),
      el("option", { value: "custom" }, "custom")),
    from: el("input", { type: "datetime-local" }),
    to: el("input", { type: "datetime-local" }),
    sampleRate: el("input", { type: "number", step: "any", min: 0, max: 1, value: online ? online.sampleRate : "",
                              placeholder: online ? null : "required" }),
    maxJudgeCalls: el("input", { type: "number", step: 1, min: 1, placeholder: "no limit" }),
    alerts: el("input", { type: "checkbox" }),
  };
  inputs.alerts.setAttribute("data-field", "alerts");
  // A preset ends at the current minute (the inputs' precision), so its end is never ahead of
  // the server's clock; typing a time makes the window custom.
  const fill = () => {
    if (inputs.window.value === "custom") return;
    const to = new Date(Math.floor(Date.now() / 60000) * 60000);
    inputs.to.value = localInputValue(to);
    inputs.from.value = localInputValue(new Date(to.getTime() - BACKFILL_SECONDS[inputs.window.value] * 1000));
  };
  inputs.window.addEventListener("change", fill);
  for (const input of [inputs.from, inputs.to]) input.addEventListener("input", () => { inputs.window.value = "custom"; });
  fill();
  const message = el("div", { class: "error", role: "alert", id: "backfill-form-message" });
  const estimate = el("p", { id: "backfill-estimate", class: "muted" });
  // The request as the form says it, or null once its local refusals are shown.
  const request = () => {
    clearErrors(form);
    message.replaceChildren();
    fill();
    const local = [];
    const body = { from: isoOfLocal(inputs.from.value), to: isoOfLocal(inputs.to.value), alerts: inputs.alerts.checked };
    for (const name of ["from", "to"]) if (!body[name]) local.push({ field: name, message: "required: a date and time" });
    for (const name of ["sampleRate", "maxJudgeCalls"]) {
      if (inputs[name].validity.badInput) local.push({ field: name, message: "not a number" });
      else if (inputs[name].value !== "") body[name] = Number(inputs[name].value);
    }
    if (local.length) { showErrors(form, message, { problem: { errors: local } }); return null; }
    return body;
  };
  const send = async (body, then) => {
    try {
      then(await api("POST", `/v1/scorer-groups/${encodeURIComponent(group.id)}/backfills`, body));
    } catch (error) {
      if (error instanceof ApiError && error.status === 400) showErrors(form, message, error);
      else message.replaceChildren(failure(error));
    }
  };
  // Before the Start button: what the job would grade and spend (a dry run starts nothing).
  const estimateFirst = () => {
    const body = request();
    if (body) send({ ...body, dryRun: true }, (answer) => estimate.replaceChildren(estimateText(answer.estimate)));
  };
  const form = el("form", { id: "backfill-form", novalidate: true, onsubmit: async (event) => {
    event.preventDefault();
    const body = request();
    if (body) await send(body, () => started());
  } },
    el("div", { class: "row" },
      el("div", {}, el("label", { for: "bf-window" }, "Window"), inputs.window),
      field("From", "from", inputs.from), field("To (not in the future)", "to", inputs.to)),
    el("div", { class: "row" },
      field(online ? "Sample rate (0-1; the group's online rate)" : "Sample rate (0-1; required: no online profile)",
            "sampleRate", inputs.sampleRate),
      field("Max judge calls (optional)", "maxJudgeCalls", inputs.maxJudgeCalls)),
    el("div", {}, el("label", {}, inputs.alerts, " raise alerts (signals and webhooks) for what it grades - " +
                     "usually noise for past traffic: that page would come hours or days late")),
    el("p", {}, el("button", { type: "button", id: "backfill-estimate-button", onclick: estimateFirst }, "Estimate"),
       " ", el("button", { type: "submit" }, "Start backfill")), estimate, message);
  return form;
}

function estimateText(e) {
  const cost = e.cost === null ? "cost unknown (a judge model has no price)"
    : `${e.cost.toLocaleString(undefined, { maximumFractionDigits: e.cost < 1 ? 6 : 2 })} ${e.currency}`;
  const how = e.exact ? "the whole window read" : "a sample of the window read";
  const error = e.pairsError === null ? "error unknown: too little read" : `+/- ${e.pairsError}`;
  return `Estimate: ${e.traces} traces, ${e.pairs} pairs (${error}), ${e.judgeCalls} judge calls, ` +
         `${e.tokens} tokens, ${cost}${e.capped ? ", stopped by max judge calls" : ""} - ${how}; spend from ` +
         (e.basis === "history" ? "the group's recent results." : "its judges' ceilings (no results yet).");
}

// The section: the form above the group's jobs, newest first. Reading again stops once every
// job has ended or the page is left (the container is no longer in the document).
function listBackfills(container, group) {
  const jobs = el("div", { id: "backfill-jobs" });
  const message = el("div", { id: "backfill-message" });
  let timer = null;
  let reads = 0;
  const refresh = async () => {
    clearTimeout(timer);
    const read = ++reads;
    let list;
    try {
      list = await api("GET", `/v1/scorer-groups/${encodeURIComponent(group.id)}/backfills`);
    } catch (error) {
      if (read !== reads) return;
      jobs.replaceChildren(failure(error));
      if (container.isConnected && error.status !== 401) timer = setTimeout(refresh, BACKFILL_POLL_MS * 2);
      return;
    }
    if (read !== reads || !container.isConnected) return; // a newer read is under way, or the page is gone
    jobs.replaceChildren(...(list.length ? list.map((job) => backfillView(job, cancel))
                                        : [el("p", { class: "muted" }, "No backfills yet.")]));
    if (list.some((job) => !BACKFILL_ENDED.includes(job.status))) timer = setTimeout(refresh, BACKFILL_POLL_MS);
  };
  const cancel = async (job, button) => {
    button.disabled = true;
    message.replaceChildren();
    try { await api("DELETE", `/v1/backfills/${encodeURIComponent(job.id)}`); } catch (error) {
      message.replaceChildren(failure(error)); // 409: it ended meanwhile; the list shows how
    }
    refresh();
  };
  container.replaceChildren(
    el("p", { class: "muted" }, "Grade the group's past traffic again, with its current members: " +
                                "a worker reads the window's traces from the topic."),
    backfillForm(group, refresh), message, jobs);
  refresh();
}
