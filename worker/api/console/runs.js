// Dataset runs: the list with its pass/fail gate, and one run's page - its header, its rows with
// each judge member's rating, and, when rows carry what people said (humanRating, humanPass),
// the run's agreement with them (scorer_groups.agreement: per column - the group, then each
// judge member - Spearman, MAE, kappa and the confusion at each mark, the suggested threshold,
// the largest disagreements). Each judge verdict of the rows table has a Call button: it reads
// the row's judge calls (GET /v1/evaluations/{id}/rows/{row}/calls, once per row) and opens,
// below the table, what that judge was sent and answered - the live results' view (calls.js).
// Like the rest of the console, every string the server sends (labels, outputs, justifications,
// judge messages: tenants wrote them) is put on the page as text.
"use strict";

const RUN_OUTPUT_SHOWN = 200; // characters of an output in the rows table; the whole is its title
const RUN_NO_FIGURE = "too few rows or no spread";
const RUN_MARKS = { gate: "the gate mark", alertThreshold: "alertThreshold" };
const RUN_SURE = "a hint: under 10 rows of either class; fair: under 30; firm: 30 or more";

function runLink(run) {
  return `#/runs/${encodeURIComponent(run.id)}`;
}

// --- the list --------------------------------------------------------------------------------

async function runsPage() {
  const failUnder = el("input", { type: "number", step: "any", id: "fail-under", value: 7 });
  const table = el("tbody", {});
  const draw = (runs) => table.replaceChildren(...runs.map((run) => {
    const passes = run.rating !== null && run.rating >= Number(failUnder.value) && run.noScoreRows === 0;
    return el("tr", { dataset: { run: run.id } },
      el("td", {}, el("a", { href: runLink(run), class: "run-link" }, run.groupName || run.scorerName || "-")),
      el("td", {}, run.subject.displayName || run.subject.kind), el("td", {}, run.status),
      el("td", {}, fmt(run.rating)), el("td", {}, `${run.scoredRows} of ${run.rowCount}`),
      el("td", { class: run.status !== "completed" ? "muted" : passes ? "good" : "bad" },
         run.status !== "completed" ? "-" : passes ? "pass" : "fail"),
      el("td", {}, new Date(run.createdAt * 1000).toLocaleString()));
  }));
  try {
    const page = await api("GET", "/v1/evaluations?limit=100");
    failUnder.addEventListener("input", () => draw(page.items));
    draw(page.items);
    show(el("section", {}, el("h1", {}, "Dataset runs"),
      el("label", { for: "fail-under" }, "Gate: the run rating at least (and every row scored)"), failUnder,
      el("table", { id: "runs" }, el("thead", {}, el("tr", {}, ["Graded by", "Subject", "Status", "Rating", "Rows scored",
                                                              "Gate", "Created"].map((h) => el("th", {}, h)))), table)));
  } catch (error) {
    show(failure(error));
  }
}

// --- one run ---------------------------------------------------------------------------------

async function runPage(runId) {
  show(el("p", { class: "muted" }, "Loading the run..."));
  let run;
  try {
    run = await api("GET", `/v1/evaluations/${encodeURIComponent(runId)}`);
  } catch (error) {
    show(failure(error));
    return;
  }
  show(runHeader(run),
    el("section", {}, el("h2", {}, "Agreement with people"), run.agreement
      ? agreementView(run.agreement)
      : el("p", { class: "muted", id: "agreement-none" },
           "No row of this dataset carries a human verdict (humanRating or humanPass): nothing to compare the judges with.")),
    el("section", {}, el("h2", {}, "Rows"), rowsTable(run)));
}

function runHeader(run) {
  const graders = run.groupName
    ? el("a", { href: `#/groups/${encodeURIComponent(run.scorerGroupId)}` }, run.groupName)
    : (run.scorerName || "-");
  const unscored = run.rowCount - run.scoredRows;
  const lines = (id, items, tone) => items && items.length
    ? el("ul", { id, class: `run-lines ${tone}` }, items.map((line) => el("li", {}, line))) : null;
  return el("section", { id: "run-header", dataset: { run: run.id } },
    el("h1", {}, "Dataset run ", el("code", {}, run.id)),
    el("dl", { class: "run-facts" },
      el("dt", {}, "Graded by"), el("dd", { id: "run-graded-by" }, graders, run.groupName ? " (group)" : " (scorer)"),
      el("dt", {}, "Subject"), el("dd", { id: "run-subject" }, run.subject.displayName || run.subject.kind),
      el("dt", {}, "Status"), el("dd", { id: "run-status" }, run.status),
      el("dt", {}, "Run rating"), el("dd", { id: "run-rating" }, fmt(run.rating)),
      el("dt", {}, "Rows scored"), el("dd", { id: "run-scored", class: unscored && run.status === "completed" ? "bad" : "" },
        `${run.scoredRows} of ${run.rowCount}`, run.noScoreRows ? ` (${run.noScoreRows} without a score)` : ""),
      el("dt", {}, "Dataset"), el("dd", {}, el("code", {}, run.datasetId), ` version ${run.datasetVersion}`),
      el("dt", {}, "Created"), el("dd", {}, new Date(run.createdAt * 1000).toLocaleString(),
        run.finalizedAt ? `, finalized ${new Date(run.finalizedAt * 1000).toLocaleString()}` : "")),
    lines("run-breakdown", run.breakdown, ""), lines("run-warnings", run.warnings, "bad"),
    lines("run-notes", run.notes, "muted"));
}

// The agent's output as text: a string as it is, any other JSON value as JSON.
function outputText(output) {
  if (output === null || output === undefined) return "";
  return typeof output === "string" ? output : JSON.stringify(output);
}

// A row's judge calls, read once per row (a failed read is tried again at the next click, except
// a 404: the run is gone, and will not be again).
function rowCallsLoader(run) {
  const answers = new Map();
  return (row) => {
    if (!answers.has(row)) {
      const answer = api("GET", `/v1/evaluations/${encodeURIComponent(run.id)}/rows/${Number(row)}/calls`);
      answers.set(row, answer);
      answer.catch((error) => { if (!(error instanceof ApiError && error.status === 404)) answers.delete(row); });
    }
    return answers.get(row);
  };
}

// A verdict's calls among its row's: those of its label, else (a call kept under another name)
// those of its scorer that no other verdict of the row claims by label.
function verdictCalls(verdict, verdicts, calls) {
  const mine = calls.filter((call) => call.member === verdict.label);
  if (mine.length) return mine;
  const labels = new Set(verdicts.map((v) => v.label));
  return calls.filter((call) => call.refId === verdict.scorerId && !labels.has(call.member));
}

function rowsTable(run) {
  const labels = run.judges.map((j) => j.label);
  const load = rowCallsLoader(run);
  const calls = callPanel("run-call"); // calls.js
  const fill = (row, verdict) => async () => {
    let found;
    try {
      found = await load(row.row);
    } catch (error) {
      return [failure(error)];
    }
    const mine = verdictCalls(verdict, row.judgeScorerResults, found.calls);
    return [el("h3", {}, `Judge call${mine.length > 1 ? "s" : ""} of ${verdict.label} on `,
               el("button", { type: "button", class: "link", onclick: () => showRow(row.row) }, `row ${row.row}`)),
      ...(mine.length ? mine.map((call, n) => callView(call, n, mine.length))
                      : [el("p", { class: "muted", dataset: { noCall: "" } },
                            found.note || "No call kept for this judge on this row")])];
  };
  const callButton = (row, verdict) => calls.button(`${row.row}\n${verdict.label}`,
    { row: String(row.row), member: verdict.label }, fill(row, verdict),
    { class: "run-call-button", "aria-label": `Call of ${verdict.label} on row ${row.row}`,
      dataset: { call: verdict.label } });
  const table = el("table", { id: "run-rows" },
    el("thead", {}, el("tr", {}, ["Row", "Rating", "Reason", ...labels, "Output"].map((h) => el("th", {}, h)))),
    el("tbody", {}, run.rows.map((row) => {
      const verdicts = new Map((row.judgeScorerResults || []).map((v) => [v.label, v]));
      const output = outputText(row.output);
      return el("tr", { dataset: { row: row.row } },
        el("td", {}, String(row.row)),
        el("td", { class: row.rating === null ? "bad" : "", title: row.justification || "" }, fmt(row.rating)),
        el("td", {}, row.reason || ""),
        labels.map((label) => {
          const v = verdicts.get(label);
          if (!v) return el("td", { class: "muted" }, "-");
          return el("td", { dataset: { judge: label }, class: v.error ? "bad" : "", title: v.error || v.justification || "" },
                    el("span", { class: "run-verdict" }, v.error ? "error" : fmt(v.rating)),
                    row.error ? null : callButton(row, v));
        }),
        el("td", { class: row.error ? "bad run-output" : "run-output", title: row.error || output },
           row.error ? `the agent failed: ${row.error}`
             : output.length > RUN_OUTPUT_SHOWN ? `${output.slice(0, RUN_OUTPUT_SHOWN)}\u2026` : output));
    })));
  return el("div", { class: "run-rows" }, table, calls.panel);
}

// --- the agreement with people ---------------------------------------------------------------

// A figure, or "-" saying why there is none (the rows cannot give it).
function figure(value, why = RUN_NO_FIGURE) {
  return value === null || value === undefined ? el("span", { class: "muted", title: why }, "-")
                                               : Number(value).toFixed(2);
}

function markName(mark) {
  return `${RUN_MARKS[mark.mark] || mark.mark} ${mark.threshold}`;
}

function suggestedText(s) {
  return `${s.threshold} (balanced accuracy ${s.balancedAccuracy.toFixed(2)}, ` +
         `${s.low.toFixed(2)}\u2013${s.high.toFixed(2)}; ${s.sure}: ${s.passes} pass / ${s.fails} fail rows)`;
}

function agreementView(agreement) {
  const columns = [agreement.group, ...agreement.judges];
  const marks = agreement.group.marks; // every column is measured at the group's marks
  const summary = el("p", { id: "agreement-summary" }, `${agreement.labelledRows} rows carry a human verdict, ` +
    `${agreement.humanRatings} of them a humanRating (Spearman and MAE read those; kappa and the confusion, all).`);
  const table = el("table", { class: "agreement-table" },
    el("thead", {}, el("tr", {}, el("th", {}, "Column"), el("th", {}, "Labelled rows"), el("th", {}, "Spearman"),
      el("th", {}, "MAE"), marks.map((m) => el("th", {}, `kappa at ${markName(m)}`)),
      el("th", { title: RUN_SURE }, "Suggested threshold"))),
    el("tbody", {}, columns.map((c) => el("tr", { dataset: { column: c.label, kind: c.kind } },
      el("td", {}, c.label, el("span", { class: "muted" }, ` (${c.kind})`)),
      el("td", { dataset: { figure: "labelledRows" } }, String(c.labelledRows),
         c.unscoredLabelledRows ? el("span", { class: "bad" }, ` (${c.unscoredLabelledRows} without a score)`) : null),
      el("td", { dataset: { figure: "spearman" } }, figure(c.spearman)),
      el("td", { dataset: { figure: "meanAbsoluteError" } }, figure(c.meanAbsoluteError)),
      marks.map((m) => {
        const at = c.marks.find((x) => x.mark === m.mark);
        return el("td", { dataset: { figure: `kappa:${m.mark}` } }, figure(at && at.kappa, "too few rows, or one class only"));
      }),
      el("td", { dataset: { figure: "suggestedThreshold" } }, c.suggestedThreshold
        ? el("span", { title: RUN_SURE }, suggestedText(c.suggestedThreshold))
        : figure(null, "too few rows, or people passed (or failed) them all"))))));
  return el("div", { id: "agreement" }, summary, table, columns.map(columnDetail));
}

function columnDetail(column) {
  return el("div", { class: "agreement-column", dataset: { detail: column.label } },
    el("h3", {}, column.label, ` (${column.kind})`),
    el("div", { class: "row" }, column.marks.map((m) => confusionTable(column, m))),
    disagreementsTable(column));
}

// Rows: what people said; columns: what the machine said.
function confusionTable(column, at) {
  const c = at.confusion;
  const cell = (name, count) => el("td", { dataset: { cell: name } }, String(count));
  return el("table", { class: "confusion", dataset: { confusion: `${column.label}:${at.mark}` } },
    el("caption", {}, `at ${markName(at)}, ${at.rows} rows`),
    el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", {}, "machine pass"), el("th", {}, "machine fail"))),
    el("tbody", {},
      el("tr", {}, el("th", {}, "people pass"), cell("bothPass", c.bothPass), cell("machineFailPeoplePass", c.machineFailPeoplePass)),
      el("tr", {}, el("th", {}, "people fail"), cell("machinePassPeopleFail", c.machinePassPeopleFail), cell("bothFail", c.bothFail))));
}

function humanText(d) {
  const pass = d.humanPass === null || d.humanPass === undefined ? null : d.humanPass ? "pass" : "fail";
  if (d.humanRating === null || d.humanRating === undefined) return pass || "-";
  return pass ? `${fmt(d.humanRating)} (${pass})` : fmt(d.humanRating);
}

// The rows table is on the same page, and the hash is the route: a row is reached by scrolling.
function showRow(row) {
  const target = document.querySelector(`#run-rows tr[data-row="${Number(row)}"]`);
  if (!target) return;
  for (const node of document.querySelectorAll("#run-rows tr.highlight")) node.classList.remove("highlight");
  target.classList.add("highlight");
  target.scrollIntoView({ block: "center" });
}

function disagreementsTable(column) {
  if (!column.disagreements.length) return el("p", { class: "muted" }, "No disagreements.");
  return el("table", { class: "disagreements" },
    el("caption", {}, "Largest disagreements"),
    el("thead", {}, el("tr", {}, ["Row", "Machine", "People", "Gap"].map((h) => el("th", {}, h)))),
    el("tbody", {}, column.disagreements.map((d) => el("tr", { dataset: { disagreement: `${column.label}:${d.row}` } },
      el("td", {}, el("button", { type: "button", class: "link", onclick: () => showRow(d.row) }, `row ${d.row}`)),
      el("td", { dataset: { figure: "machine" } }, fmt(d.machine)),
      el("td", { dataset: { figure: "people" } }, humanText(d)),
      el("td", { dataset: { figure: "gap" } }, fmt(d.gap))))));
}
