// Judge templates: the shipped rubrics (GET /v1/judge-templates), each with what its judge reads
// and the rows people labelled, and a "Check against people" button that measures a judge made
// from the template against those rows: the judge (the project's one named as the template, or a
// new one), the examples as a dataset, a dataset run over it answered with each example's output
// (and spans: the faithfulness judge reads the retrieved context), then the run's page
// (runs.js), which shows its agreement with people. Like the rest of the console, every string
// the server sends (titles, what a judge reads, errors) is put on the page as text.
"use strict";

function judgeCalls(n) {
  return `${n} judge call${n === 1 ? "" : "s"}`;
}

async function templatesPage() {
  show(el("p", { class: "muted" }, "Loading the judge templates..."));
  let templates;
  try {
    templates = (await api("GET", "/v1/judge-templates")).items;
  } catch (error) {
    show(failure(error));
    return;
  }
  show(el("section", {}, el("h1", {}, "Judge templates"),
    el("p", { class: "muted" }, "Each template carries examples people labelled. Check against people grades them " +
       "with a judge made from the template and opens the run, with the judge's agreement with people."),
    el("table", { id: "templates" },
      el("thead", {}, el("tr", {}, ["Template", "Reads", "Labelled examples", ""].map((h) => el("th", {}, h)))),
      el("tbody", {}, templates.map(templateRow)))));
}

function templateRow(template) {
  const n = template.examples.length;
  const status = el("div", { class: "muted", dataset: { templateStatus: "" } });
  const button = el("button", { type: "button", dataset: { check: template.name } }, "Check against people");
  button.addEventListener("click", async () => {
    button.disabled = true;
    status.replaceChildren();
    try {
      const run = await checkTemplate(template, (text) => status.replaceChildren(text));
      location.hash = runLink(run); // 5. the run's page (runs.js): its agreement with people
    } catch (error) {
      status.replaceChildren(failure(error));
      button.disabled = false;
    }
  });
  return el("tr", { dataset: { template: template.name } },
    el("td", {}, template.title), el("td", {}, template.reads), el("td", {}, String(n)),
    el("td", {}, button, el("div", { class: "muted" }, `costs ${judgeCalls(n)}`), status));
}

// The first item of a paged list (GET path?limit=&cursor=) that ``wanted`` says yes to, or null.
async function firstInPages(path, wanted) {
  let cursor = null;
  do {
    const page = await api("GET", `${path}?limit=200${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    for (const item of page.items) if (await wanted(item)) return item;
    cursor = page.nextCursor;
  } while (cursor);
  return null;
}

// The project's judge named as the template (what POST /v1/judges {template} names it), or a new one.
async function templateJudge(template) {
  return (await firstInPages("/v1/judges", (judge) => judge.name === template.title))
    || api("POST", "/v1/judges", { template: template.name });
}

// The examples' dataset: the project's one of that name whose latest version holds the examples'
// inputs in their order (the outputs are sent by row), or a new one. Its labels may have been
// changed since: they are the project's to change.
async function templateDataset(template, name, content) {
  const inputs = JSON.stringify(template.examples.map((e) => e.input));
  const same = async (dataset) => dataset.name === name && dataset.rowCount === template.examples.length &&
    JSON.stringify((await api("GET", `/v1/datasets/${encodeURIComponent(dataset.id)}/rows`)).items
      .map((row) => row.input)) === inputs;
  return (await firstInPages("/v1/datasets", same)) || api("POST", "/v1/datasets", { name, format: "jsonl", content });
}

// Grades the template's examples with its judge; answers the completed run. ``say`` shows progress.
async function checkTemplate(template, say) {
  const examples = template.examples;
  // 1. The judge: reused when the project has one named as the template, made from it otherwise.
  say("Finding the judge...");
  const judge = await templateJudge(template);
  // 2. The examples as a dataset: what the agent was given and what people said (not its answers);
  //    the one made at an earlier check when it still holds them.
  const content = examples.map((e) => JSON.stringify({ input: e.input, humanRating: e.humanRating,
                                                       humanPass: e.humanPass })).join("\n");
  const dataset = await templateDataset(template, `Template examples: ${template.title}`, content);
  // 3. A run of the judge over that version of it.
  const run = await api("POST", "/v1/evaluations", {
    datasetId: dataset.id, datasetVersion: dataset.version, scorerId: judge.id,
    subject: { kind: "custom_agent", displayName: `${template.title} examples` } });
  // 4. The examples' answers as the agent's, with their spans: the judge grades each row.
  say(`Grading ${examples.length} examples with ${judge.name}...`);
  return api("POST", `/v1/evaluations/${encodeURIComponent(run.id)}/finalize`, {
    outputs: examples.map((e, row) => (e.spans ? { row, output: e.output, spans: e.spans } : { row, output: e.output })) });
}
