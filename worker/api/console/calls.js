// Judge calls and judge templates.
//
// A result's Judge scores view gives each judge member a "Call" button: it reads the result
// with its calls (GET /v1/scorer-groups/{id}/results/{ratingId}, once per result) and opens,
// below the table, what that judge was asked and answered - model, latency, attempts, tokens,
// error, each message and the answer (cut at 4,000 characters, their full lengths said). The
// group editor's scorer picker offers the judge templates (GET /v1/judge-templates): a member
// set to one gets a judge made from it (POST /v1/judges {template}) when the group is saved.
// Like the rest of the console, every string the server sends (messages and answers above all:
// they quote the traces) is put on the page as text.
"use strict";

const CALL_TEXT_MAX_CHARS = 4000; // scoring.judge_calls: what a kept message or answer holds at most
const TEMPLATE_PREFIX = "template:"; // a scorer select's value for "a new judge from this template"

function callCount(n) {
  return Number(n).toLocaleString("en-US");
}

// --- a result's judge calls --------------------------------------------------------------------

// The calls of one result, read once (a failed read is tried again at the next click, except a
// 404: the result is no longer kept, and will not be again).
function callsLoader(rating) {
  let answer = null;
  return () => {
    if (!answer) {
      answer = api("GET", `/v1/scorer-groups/${encodeURIComponent(rating.groupId)}/results/` +
                          `${encodeURIComponent(rating.id)}`).then((found) => found.calls);
      answer.catch((error) => { if (!(error instanceof ApiError && error.status === 404)) answer = null; });
    }
    return answer;
  };
}

// "cut: 4,000 of 9,812 characters" when the text shown is not the whole (lengths are the
// server's: code points, as Array.from counts them).
function cutNote(shown, length) {
  const kept = Array.from(shown || "").length;
  if (length === null || length === undefined || !(length > kept)) return null;
  return el("p", { class: "muted call-cut" }, length > CALL_TEXT_MAX_CHARS
    ? `cut: ${callCount(kept)} of ${callCount(length)} characters`
    : `${callCount(kept)} of ${callCount(length)} characters shown: secrets masked`);
}

function callTokens(usage) {
  if (!usage) return "not reported";
  const n = (v) => (v === null || v === undefined ? "?" : callCount(v));
  return `${n(usage.promptTokens)} prompt, ${n(usage.completionTokens)} completion`;
}

function callView(call, n, of) {
  const fact = (name, label, value, bad) => [el("dt", {}, label),
    el("dd", { dataset: { fact: name }, class: bad ? "bad" : null }, value)];
  return el("div", { class: "call", dataset: { callIndex: String(n) } },
    of > 1 ? el("h4", {}, `Call ${n + 1} of ${of}`) : null,
    el("dl", { class: "call-facts" },
      fact("model", "Model", call.model),
      fact("started", "Started", new Date(call.startedAt).toLocaleString()),
      fact("latency", "Latency", `${callCount(Math.round(call.latencyMs))} ms`),
      fact("attempts", "Attempts", String(call.attempts)),
      fact("tokens", "Tokens", callTokens(call.usage)),
      fact("error", "Error", call.error || "none", !!call.error),
      call.cachedFrom ? fact("cached", "Cached", `not made: paid for already, by rating ${call.cachedFrom}`) : null),
    call.messages.map((message, i) => el("div", { class: "call-message", dataset: { role: message.role } },
      el("div", { class: "call-role" }, message.role),
      el("pre", { dataset: { message: String(i) } }, message.content),
      cutNote(message.content, message.length))),
    el("div", { class: "call-message call-answer" }, el("div", { class: "call-role" }, "answer"),
      call.answer === null || call.answer === undefined
        ? el("p", { class: "muted", dataset: { noAnswer: "" } }, "no answer came")
        : el("pre", { dataset: { answer: "" } }, call.answer),
      cutNote(call.answer, call.answerLength)));
}

// A member's calls among the result's: its scorer and its label both match.
function memberCalls(member, calls) {
  const mine = calls.filter((call) => call.refId === member.refId && call.member === member.name);
  return [el("h3", {}, `Judge call${mine.length > 1 ? "s" : ""} of ${member.name}`),
    ...(mine.length ? mine.map((call, n) => callView(call, n, mine.length))
                    : [el("p", { class: "muted", dataset: { noCall: "" } }, "no call recorded")])];
}

// A panel below a table, which the table's Call buttons fill one at a time: pressing the button
// of what is shown closes it, and a read still running when another is pressed is dropped.
// ``button(key, data, fill, attributes)`` makes one: ``key`` tells what it shows from the rest,
// ``data`` is the panel's data attributes while it does, ``fill()`` answers the panel's nodes.
function callPanel(id) {
  const panel = el("div", { id, class: "call-panel", dataset: { callPanel: "" }, hidden: true });
  const buttons = [];
  let shown = null;
  let opened = 0;
  const mark = (data) => {
    for (const name of Object.keys(panel.dataset)) if (name !== "callPanel") delete panel.dataset[name];
    Object.assign(panel.dataset, data);
  };
  const close = () => {
    shown = null;
    opened++;
    for (const b of buttons) b.setAttribute("aria-pressed", "false");
    panel.hidden = true;
    panel.replaceChildren();
    mark({});
  };
  const open = async (key, data, fill, button) => {
    if (shown === key) { close(); return; }
    const mine = ++opened;
    shown = key;
    for (const b of buttons) b.setAttribute("aria-pressed", b === button ? "true" : "false");
    panel.hidden = false;
    mark(data);
    panel.replaceChildren(el("p", { class: "muted" }, "Loading the call..."));
    const nodes = await fill();
    if (mine !== opened) return;
    panel.replaceChildren(...nodes);
    panel.scrollIntoView({ block: "nearest" });
  };
  const button = (key, data, fill, attributes = {}) => {
    const made = el("button", { type: "button", "aria-pressed": "false", "aria-controls": id, ...attributes,
                                class: `secondary call-button ${attributes.class || ""}`.trim(),
                                onclick: () => open(key, data, fill, made) }, "Call");
    buttons.push(made);
    return made;
  };
  return { panel, button };
}

// The Judge scores view: the members' verdicts, a Call button per judge, the panel below.
// ``load`` is the result's callsLoader (kept by resultView, so switching views reads once).
function judgeScoresView(rating, load) {
  const calls = callPanel(`call-${rating.id}`);
  const fill = (member) => async () => {
    try {
      return memberCalls(member, await load());
    } catch (error) {
      return [error instanceof ApiError && error.status === 404
        ? el("p", { class: "muted", dataset: { callsGone: "" } },
             "The calls of this result are no longer kept: only the group's latest results keep them.")
        : failure(error)];
    }
  };
  const action = (member) => (member.kind !== "judge" ? null
    : calls.button(member.name, { member: member.name }, fill(member), { dataset: { call: member.name } }));
  return el("div", { class: "judge-scores" }, membersTable(rating.members, action), calls.panel);
}

// --- judge templates in the group editor --------------------------------------------------------

// The templates, or none when they cannot be read (the editor still edits with the judges there are).
async function judgeTemplates() {
  try {
    return (await api("GET", "/v1/judge-templates")).items;
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) throw error;
    return [];
  }
}

function templateNamed(value, templates) {
  if (!value || !value.startsWith(TEMPLATE_PREFIX)) return null;
  const name = value.slice(TEMPLATE_PREFIX.length);
  return (templates || []).find((t) => t.name === name) || null;
}

// The options a judge member's scorer select adds: one per template, a judge made on save.
function templateChoices(templates, selected) {
  if (!templates || !templates.length) return [];
  return [el("optgroup", { label: "From a template" }, templates.map((t) =>
    el("option", { value: `${TEMPLATE_PREFIX}${t.name}`, title: t.reads,
                   selected: selected === `${TEMPLATE_PREFIX}${t.name}` }, `${t.title} (new judge)`)))];
}

// What the chosen template's judge reads, under the select (hidden for an existing scorer).
function templateReadsNote() {
  return el("p", { class: "muted template-reads", dataset: { templateReads: "" }, hidden: true });
}

function showTemplateReads(note, select, templates) {
  const template = templateNamed(select.value, templates);
  note.hidden = !template;
  note.textContent = template ? `Reads: ${template.reads}` : "";
}

// Right before a group is saved: a judge made from its template for each member set to one
// (one per member), the member then set to it - the new judge is an option of its select and
// of the editor's, so saving again (after an error) makes no second one. Returns the errors,
// at the member's scorer field.
async function judgesFromTemplates(rows, options) {
  for (const row of rows) {
    const kind = row.querySelector("[name=kind]");
    const ref = row.querySelector("[name=refId]");
    const template = kind.value === "judge" ? templateNamed(ref.value, options.templates) : null;
    if (!template) continue;
    let judge;
    try {
      judge = await api("POST", "/v1/judges", { template: template.name });
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) failure(error);
      return [{ field: ref.getAttribute("data-field"),
                message: `no judge made from the template ${template.title}: ${error.message}` }];
    }
    options.judge.push(judge);
    const option = el("option", { value: judge.id }, judge.name);
    const group = ref.querySelector("optgroup");
    if (group) ref.insertBefore(option, group); else ref.append(option);
    ref.value = judge.id;
    ref.dispatchEvent(new Event("change"));
  }
  return [];
}
