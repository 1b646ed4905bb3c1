// A judge's page (#/judges/<id>): where it disagrees with people (each one click from an
// example), its graded examples, and its alignment runs side by side with Promote - plus a form to
// measure a candidate (new criteria, the examples as they are now) on a dataset or a review
// queue's labels. Every string (criteria, examples, the items' texts) is put on the page as text.
"use strict";

async function judgePage(judgeId) {
  show(el("p", { class: "muted" }, "Loading..."));
  let judge;
  try {
    judge = await api("GET", `/v1/judges/${encodeURIComponent(judgeId)}`);
  } catch (error) {
    show(failure(error));
    return;
  }
  const parts = { disagreements: el("div", { id: "judge-disagreements" }), examples: el("div", { id: "judge-examples" }),
                  alignments: el("div", { id: "judge-alignments" }) };
  const agreement = el("div", { id: "judge-agreement" });
  show(
    el("section", {}, el("h1", { id: "judge-title" }, judge.name), el("pre", { class: "review-text", id: "judge-criteria" }, judge.criteria),
      el("p", { id: "judge-cache", class: "muted" }, judge.cache === false
        ? "Verdict cache off: every call is asked afresh."
        : "Verdict cache on: the same messages to this judge are paid once (members say cached).")),
    el("section", {}, el("h2", {}, "Agreement with people, by group"), agreement),
    el("section", {}, el("h2", {}, "Where it disagrees with people"), parts.disagreements),
    el("section", {}, el("h2", {}, "Graded examples in its prompt"), parts.examples, exampleForm(judge.id, parts)),
    el("section", {}, el("h2", {}, "Alignment runs"), alignmentForm(judge, parts), parts.alignments));
  showJudgeAgreement(judge, agreement);
  await refreshJudge(judge.id, parts);
}

// Each group that has the judge: the judge's column of the group's live agreement (reviews).
async function showJudgeAgreement(judge, container) {
  try {
    const groups = (await api("GET", "/v1/scorer-groups?limit=200")).items
      .filter((g) => g.members.some((m) => m.kind === "judge" && m.refId === judge.id));
    const rows = await Promise.all(groups.map(async (g) => {
      const live = await api("GET", `/v1/scorer-groups/${encodeURIComponent(g.id)}/agreement`);
      const column = live.agreement && live.agreement.judges.find((c) => c.scorerId === judge.id);
      const kappa = column && column.marks.length ? column.marks[column.marks.length - 1].kappa : null;
      return el("tr", { dataset: { group: g.id } }, el("td", {}, g.name), el("td", {}, String(live.labelledItems)),
        el("td", {}, column ? fmt(column.spearman) : "-"), el("td", {}, column ? fmt(kappa) : "-"),
        el("td", {}, column ? fmt(column.meanAbsoluteError) : "-"));
    }));
    container.replaceChildren(rows.length
      ? el("table", {}, el("thead", {}, el("tr", {}, ["Group", "Labelled items", "Spearman", "Kappa", "MAE"]
          .map((h) => el("th", {}, h)))), el("tbody", {}, rows))
      : el("p", { class: "muted" }, "No group has this judge."));
  } catch (error) {
    container.replaceChildren(failure(error));
  }
}

async function refreshJudge(judgeId, parts) {
  const path = `/v1/judges/${encodeURIComponent(judgeId)}`;
  await Promise.all([
    api("GET", `${path}/disagreements`).then((found) => parts.disagreements.replaceChildren(found.length
      ? el("table", {}, el("thead", {}, el("tr", {}, ["Input", "Judge", "People", ""].map((h) => el("th", {}, h)))),
          el("tbody", {}, found.map((d) => el("tr", { dataset: { item: d.itemId } },
            el("td", {}, d.input), el("td", {}, fmt(d.judge)), el("td", {}, fmt(d.people)),
            el("td", {}, el("button", { type: "button", class: "add-example",
              onclick: () => addExample(judgeId, { fromItem: d.itemId }, parts) }, "Add as example"))))))
      : el("p", { class: "muted" }, "No labelled review items of its results yet."))).catch((e) => parts.disagreements.replaceChildren(failure(e))),
    api("GET", `${path}/examples`).then((examples) => parts.examples.replaceChildren(examples.length
      ? el("ol", {}, examples.map((x) => el("li", { class: "judge-example", dataset: { example: x.id } },
          el("pre", { class: "review-text" }, `Input: ${x.input}\nResponse: ${x.output}`),
          el("p", {}, `Rating ${fmt(x.rating)}`, x.reason ? ` - ${x.reason}` : ""),
          el("button", { type: "button", class: "delete-example",
            onclick: async () => { await api("DELETE", `${path}/examples/${encodeURIComponent(x.id)}`);
                                   refreshJudge(judgeId, parts); } }, "Delete"))))
      : el("p", { class: "muted" }, "No examples: the judge reads its criteria alone."))).catch((e) => parts.examples.replaceChildren(failure(e))),
    api("GET", `${path}/alignments`).then((runs) => parts.alignments.replaceChildren(runs.length
      ? alignmentTable(judgeId, runs, parts) : el("p", { class: "muted" }, "No alignment runs yet."))).catch((e) => parts.alignments.replaceChildren(failure(e))),
  ]);
}

function exampleForm(judgeId, parts) {
  const input = el("textarea", { id: "example-input", rows: 2, cols: 60, maxlength: 4000 });
  const output = el("textarea", { id: "example-output", rows: 2, cols: 60, maxlength: 4000 });
  const rating = el("input", { id: "example-rating", type: "number", min: 0, max: 10, step: 0.5, required: true });
  const reason = el("input", { id: "example-reason", size: 60, maxlength: 1000 });
  return el("form", { id: "example-form", onsubmit: async (event) => {
    event.preventDefault();
    await addExample(judgeId, { input: input.value, output: output.value, rating: Number(rating.value),
                                ...(reason.value.trim() ? { reason: reason.value.trim() } : {}) }, parts);
    event.target.reset();
  } }, el("label", {}, "Input", input), el("label", {}, "Response", output), el("label", {}, "Rating (0-10) ", rating),
     el("label", {}, " Why ", reason), " ", el("button", { type: "submit" }, "Add an example"));
}

async function addExample(judgeId, body, parts) {
  try {
    await api("POST", `/v1/judges/${encodeURIComponent(judgeId)}/examples`, body);
  } catch (error) {
    parts.examples.prepend(failure(error));
    return;
  }
  await refreshJudge(judgeId, parts);
}

function alignmentFigure(f) {
  return f ? `${fmt(f.value)} (${fmt(f.low)}-${fmt(f.high)})` : "-";
}

function alignmentTable(judgeId, runs, parts) {
  return el("table", { id: "alignment-runs" },
    el("thead", {}, el("tr", {}, ["Run", "State", "Cases", "Spearman: now / candidate", "MAE: now / candidate", ""]
      .map((h) => el("th", {}, h)))),
    el("tbody", {}, runs.map((r) => el("tr", { dataset: { alignment: r.id } },
      el("td", {}, r.source), el("td", {}, r.state === "running" ? `running ${r.done}/${r.total}` : r.state),
      el("td", {}, r.counts ? String(r.counts.evaluated) : "-"),
      el("td", {}, `${alignmentFigure(r.current && r.current.spearman)} / ${alignmentFigure(r.candidateFigures && r.candidateFigures.spearman)}`),
      el("td", {}, `${alignmentFigure(r.current && r.current.meanAbsoluteError)} / ` +
                   `${alignmentFigure(r.candidateFigures && r.candidateFigures.meanAbsoluteError)}`),
      el("td", {}, r.promotedAt ? `promoted by ${r.promotedBy}` : r.state === "done"
        ? el("button", { type: "button", class: "promote", onclick: () => promoteRun(judgeId, r, parts) },
             promoteLabel(r))
        : null)))));
}

// The server refuses a promotion without "force" when the candidate agreed worse, or when fewer
// than PROMOTE_MIN_CASES held-out cases compared the two judges (scoring/alignment.py).
const PROMOTE_MIN_CASES = 10;

function promoteDoubt(run) {
  if (!run.better) return "The candidate agreed worse with people on the held-out cases.";
  const cases = run.current ? run.current.cases : 0;
  if (cases < PROMOTE_MIN_CASES) return `Only ${cases} held-out cases compared the judges (${PROMOTE_MIN_CASES} needed).`;
  return null;
}

function promoteLabel(run) {
  if (!run.better) return "Promote anyway (agreed worse)";
  return promoteDoubt(run) ? "Promote anyway (too few cases)" : "Promote";
}

async function promoteRun(judgeId, run, parts) {
  const doubt = promoteDoubt(run);
  if (doubt && !window.confirm(`${doubt} Promote it anyway?`)) {
    return;
  }
  try {
    await api("POST", `/v1/judges/${encodeURIComponent(judgeId)}/promote`, { alignment: run.id, force: Boolean(doubt) });
  } catch (error) {
    parts.alignments.prepend(failure(error));
    return;
  }
  judgePage(judgeId);
}

function alignmentForm(judge, parts) {
  const criteria = el("textarea", { id: "candidate-criteria", rows: 3, cols: 70 });
  criteria.value = judge.criteria;
  const source = el("input", { id: "alignment-dataset", size: 30, placeholder: "dataset id (rows with humanRating)" });
  const said = el("span", { class: "muted", role: "status" });
  const form = el("form", { id: "alignment-form", onsubmit: async (event) => {
    event.preventDefault();
    const examples = await api("GET", `/v1/judges/${encodeURIComponent(judge.id)}/examples`);
    try {
      const run = await api("POST", `/v1/judges/${encodeURIComponent(judge.id)}/alignments`,
                            { dataset: source.value.trim(), candidate: { criteria: criteria.value, examples } });
      const poll = async () => { // the run alone, until it is over: then the whole page once
        const now = await api("GET", `/v1/judges/${encodeURIComponent(judge.id)}/alignments/${encodeURIComponent(run.id)}`);
        if (now.state === "running") {
          said.textContent = `measuring: ${now.done} of ${now.total} verdicts`;
          setTimeout(poll, 1000);
        } else {
          said.textContent = "";
          await refreshJudge(judge.id, parts);
        }
      };
      poll();
    } catch (error) {
      said.replaceChildren(failure(error));
    }
  } }, el("label", {}, "Candidate criteria", criteria), el("label", {}, " Labels from ", source), " ",
     el("button", { type: "submit" }, "Measure against people"), said);
  return form;
}
