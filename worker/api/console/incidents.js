// Incidents on a group's page: the open ones first and prominent - why, since when,
// what their last Signal said, the window's mean - then the resolved ones, opened and resolved;
// read again every ten seconds while the page is open. The chart draws the learned level the
// drift mode judges against (groupLevel, from the same answer), and the group editor edits the
// alert settings (alertFields). Like the rest of the console, every string the server sends
// (lastSaid above all: it quotes the group) is put on the page as text.
"use strict";

const INCIDENT_POLL_MS = 10000;
const INCIDENT_REASONS = {
  window_below: "the window's mean fell below the threshold",
  coverage: "too many results without a score",
  drift: "the mean drifted below the learned level",
  agreement: "a judge stopped agreeing with people's labels",
};
const INCIDENTS_RESOLVED_SHOWN = 20;
const DRIFT_SIGMA = 3; // the API's default alertDriftSigma

function incidentTime(iso) {
  return iso ? new Date(iso).toLocaleString() : "-";
}

function incidentDuration(ms) {
  const minutes = Math.max(0, Math.round(ms / 60000));
  if (minutes < 1) return "under a minute";
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  return hours < 48 ? `${hours} h ${minutes % 60} min` : `${Math.floor(hours / 24)} days`;
}

function incidentWindow(incident) {
  return incident.windowMean === null || incident.windowMean === undefined
    ? `${incident.windowResults} results in the window`
    : `window mean ${fmt(incident.windowMean)} over ${incident.windowResults} results`;
}

function incidentView(incident) {
  const open = incident.state === "open";
  const reason = INCIDENT_REASONS[incident.reason] || incident.reason;
  const opened = new Date(incident.openedAt).getTime();
  return el("div", { class: `incident ${open ? "incident-open" : "incident-resolved"}`,
                     dataset: { incident: incident.id, state: incident.state, reason: incident.reason } },
    el("div", { class: "row" },
      el("span", { class: `incident-state ${open ? "bad" : "good"}` }, open ? "Open" : "Resolved"),
      el("span", { class: "incident-reason" }, reason),
      el("span", { class: "muted incident-times" }, open
        ? `since ${incidentTime(incident.openedAt)} (${incidentDuration(Date.now() - opened)})`
        : `opened ${incidentTime(incident.openedAt)} \u2192 resolved ${incidentTime(incident.resolvedAt)} ` +
          `(${incidentDuration(new Date(incident.resolvedAt).getTime() - opened)})`)),
    el("p", { class: open ? "incident-said" : "incident-said muted" }, incident.lastSaid),
    open ? el("p", { class: "muted incident-window" }, incidentWindow(incident)) : null);
}

function levelText(level, online) {
  const sigma = (online && online.alertDriftSigma) ?? DRIFT_SIGMA;
  return `Learned level ${fmt(level.mean)}, spread ${fmt(level.spread)}, from ${level.windows} windows` +
    (level.windows < 8 ? " (drift is judged from 8 windows)" : `: drift opens below ${fmt(level.mean - sigma * level.spread)}`);
}

// The level the chart draws, or null (none learned, or the read failed: the chart still draws).
function groupLevel(group) {
  return api("GET", `/v1/scorer-groups/${encodeURIComponent(group.id)}/incidents?limit=1`).then((answer) => answer.level,
                                                                                       () => null);
}

// The section. Reading again stops once the page is left (the container is no longer in the
// document) or the key is refused.
function listIncidents(container, group) {
  const online = group.online || {};
  let timer = null;
  let reads = 0;
  const refresh = async () => {
    clearTimeout(timer);
    const read = ++reads;
    let answer;
    try {
      answer = await api("GET", `/v1/scorer-groups/${encodeURIComponent(group.id)}/incidents?limit=200`);
    } catch (error) {
      if (read !== reads) return;
      container.replaceChildren(failure(error));
      if (container.isConnected && error.status !== 401) timer = setTimeout(refresh, INCIDENT_POLL_MS);
      return;
    }
    if (read !== reads || !container.isConnected) return;
    const open = answer.incidents.filter((i) => i.state === "open");
    const resolved = answer.incidents.filter((i) => i.state !== "open");
    const perResult = (online.alertMode || "each") === "each" && (online.alertNoScoreRate ?? null) === null;
    const nodes = [];
    if (!answer.incidents.length && perResult && group.online) {
      nodes.push(el("p", { class: "muted", id: "incidents-hint" }, "Alerts are per result: every result below the " +
        "threshold raises a Signal. To page once per dip instead (opened, then resolved), set alertMode to window " +
        "or drift in the online profile (Edit, below)."));
    } else if (!answer.incidents.length) {
      nodes.push(el("p", { class: "muted", id: "incidents-none" },
                    group.online ? "No incidents." : "No incidents: the group is not scored live."));
    }
    if (open.length) nodes.push(el("div", { id: "incidents-open" }, open.map(incidentView)));
    if (resolved.length) {
      nodes.push(el("h3", {}, "Resolved"), el("div", { id: "incidents-resolved" },
        resolved.slice(0, INCIDENTS_RESOLVED_SHOWN).map(incidentView)));
      if (resolved.length > INCIDENTS_RESOLVED_SHOWN) {
        // One page of 200 is read (open ones first): past it, the count is a floor.
        const earlier = resolved.length - INCIDENTS_RESOLVED_SHOWN;
        nodes.push(el("p", { class: "muted", id: "incidents-earlier" },
                      answer.nextCursor ? `and over ${earlier} earlier` : `and ${earlier} earlier`));
      }
    }
    if (answer.level) nodes.push(el("p", { class: "muted", id: "incident-level" }, levelText(answer.level, online)));
    container.replaceChildren(...nodes);
    timer = setTimeout(refresh, INCIDENT_POLL_MS);
  };
  container.replaceChildren(el("p", { class: "muted" }, "Loading incidents..."));
  refresh();
}

// The group editor's alert settings: an empty input is not sent (the stored value, or the
// default, stays), except that emptying a stored alertResolveAbove or alertNoScoreRate sends
// null - the API's way to remove them. read() gives the keys to merge into the online object
// and the inputs that hold no number.
const ALERT_NUMBERS = {
  alertWindowSeconds: ["Window seconds (60-86,400)", { step: 1, placeholder: "900" }],
  alertMinResults: ["Min results per window", { step: 1, placeholder: "10" }],
  alertResolveAbove: ["Resolve at mean (0-10)", { step: "any", placeholder: "the threshold" }],
  alertNoScoreRate: ["No-score rate (0-1)", { step: "any", placeholder: "off" }],
  alertDriftSigma: ["Drift sigma", { step: "any", placeholder: "3" }],
};
const ALERT_CLEARABLE = ["alertResolveAbove", "alertNoScoreRate"];

function alertFields(online) {
  const mode = el("select", {}, ["each", "window", "drift"].map((m) =>
    el("option", { value: m, selected: m === (online.alertMode || "each") }, m)));
  const inputs = {};
  for (const [name, [, attrs]] of Object.entries(ALERT_NUMBERS)) {
    inputs[name] = el("input", { type: "number", ...attrs, value: online[name] ?? "" });
  }
  const node = el("div", {},
    el("p", { class: "muted" }, "each: a Signal per result below the threshold. window: an incident when a window's " +
       "mean is below the threshold, resolved by a whole window at the resolve mean. drift: an incident when a " +
       "window falls sigma spreads below the group's learned level. The no-score rate opens coverage incidents in any mode."),
    el("div", { class: "row" }, field("Alert mode", "online.alertMode", mode),
      Object.entries(ALERT_NUMBERS).map(([name, [label]]) => field(label, `online.${name}`, inputs[name]))));
  const read = () => {
    const values = { alertMode: mode.value };
    const errors = [];
    for (const [name, input] of Object.entries(inputs)) {
      if (input.validity.badInput) errors.push({ field: `online.${name}`, message: "not a number" });
      else if (input.value !== "") values[name] = Number(input.value);
      else if (ALERT_CLEARABLE.includes(name) && (online[name] ?? null) !== null) values[name] = null;
    }
    return { values, errors };
  };
  return { node, read };
}
