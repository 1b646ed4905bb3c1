// The online profile's filter in the group editor: rows of "field op value" (each may be negated)
// joined by "all of" or "any of" - what most filters are - and, for a deeper tree, its JSON.
// Every input carries the path the API names in its errors (online.filter.all[1].op), so a
// refused filter is marked where it was typed, as every other field is.
"use strict";

const FILTER_FIELDS = ["agentId", "sessionId", "traceId", "root.name", "root.input", "root.output", "durationMs",
  "spans.name", "spans.kind", "metadata.", "spans.attributes.gen_ai.request.model",
  "spans.attributes.gen_ai.operation.name", "spans.attributes.openinference.span.kind"];
const SPAN_FILTER_FIELDS = ["name", "kind", "input", "output", "durationMs", "attributes.gen_ai.operation.name",
  "attributes.openinference.span.kind", "attributes.gen_ai.request.model"];
const FILTER_OPS = ["eq", "neq", "in", "nin", "contains", "startsWith", "matches", "exists", "gt", "gte", "lt", "lte"];

// A typed value as JSON would read it: 200 is a number, true a boolean, "200" (quoted) a
// string, anything else the text itself.
function parseScalar(text) {
  const t = text.trim();
  if (/^-?\d+(\.\d+)?([eE][+-]?\d+)?$/.test(t)) return Number(t);
  if (t === "true" || t === "false") return t === "true";
  if (/^".*"$/.test(t)) { try { return JSON.parse(t); } catch (_) { return t; } }
  return t;
}

function scalarText(value) {
  if (typeof value === "string" && parseScalar(value) !== value) return JSON.stringify(value);
  return String(value);
}

function isLeaf(node) { return node && typeof node === "object" && "field" in node; }

// The rows a stored filter is, or null when it is deeper than rows can show.
function filterRows(filter) {
  if (!filter) return { join: "all", rows: [] };
  const row = (node) => (isLeaf(node) ? { not: false, leaf: node }
    : node && isLeaf(node.not) ? { not: true, leaf: node.not } : null);
  const single = row(filter);
  if (single) return { join: "all", rows: [single] };
  const join = Array.isArray(filter.all) ? "all" : Array.isArray(filter.any) ? "any" : null;
  if (!join) return null;
  const rows = filter[join].map(row);
  return rows.every(Boolean) ? { join, rows } : null;
}

function filterRow(row, fieldList) {
  const negate = el("input", { type: "checkbox", name: "not", checked: row.not });
  const field = el("input", { name: "field", list: fieldList, size: 30, value: row.leaf.field || "",
                              placeholder: fieldList === "filter-fields" ? "metadata.environment" : "kind" });
  const op = el("select", { name: "op" }, FILTER_OPS.map((o) => el("option", { value: o, selected: o === row.leaf.op }, o)));
  const value = el("input", { name: "value", size: 24, placeholder: "production  (in: a, b)" });
  const leafValue = row.leaf.value;
  value.value = leafValue === undefined || leafValue === null ? ""
    : Array.isArray(leafValue) ? leafValue.map(scalarText).join(", ") : scalarText(leafValue);
  return el("div", { class: "row filter-row" },
    el("div", {}, el("label", {}, negate, " not")), el("div", {}, el("label", {}, "Field"), field),
    el("div", {}, el("label", {}, "Op"), op), el("div", {}, el("label", {}, "Value"), value),
    el("button", { type: "button", class: "secondary", onclick: (e) => e.currentTarget.parentElement.remove() }, "Remove"));
}

function readRow(node, path) {
  const get = (name) => node.querySelector(`[name=${name}]`);
  const op = get("op").value;
  const text = get("value").value;
  let value;
  if (op === "exists") value = text.trim() === "" ? true : parseScalar(text);
  else if (op === "in" || op === "nin") value = text.split(",").filter((t) => t.trim() !== "").map(parseScalar);
  else if (["gt", "gte", "lt", "lte"].includes(op)) value = Number.isFinite(Number(text)) && text.trim() !== "" ? Number(text) : text;
  else if (op === "startsWith" || op === "matches") value = text;  // always text: "200" is a prefix, not a number
  else value = parseScalar(text);
  const at = get("not").checked ? `${path}.not` : path;
  for (const name of ["field", "op", "value"]) get(name).setAttribute("data-field", `${at}.${name}`);
  const leaf = { field: get("field").value.trim(), op, value };
  return get("not").checked ? { not: leaf } : leaf;
}

// The builder: { node, read() }; read() gives the filter (null: none) or throws an Error whose
// message says what is wrong with the JSON. ``prefix`` names its elements and ``path`` is the
// profile key it edits: the trace filter (online.filter) or a span group's (online.spanFilter).
function filterBuilder(filter, { prefix = "filter", path = "online.filter", fields = FILTER_FIELDS,
                                 intro = "Only traces that match are sampled and scored; the others cost nothing. " +
                                   "spans.* match when some span does; a missing field matches only exists: false, neq and nin." } = {}) {
  const id = (name) => `${prefix}-${name}`;
  const fieldList = id("fields");
  const shown = filterRows(filter);
  const join = el("select", { id: id("join") },
    el("option", { value: "all", selected: !shown || shown.join === "all" }, "all of"),
    el("option", { value: "any", selected: shown && shown.join === "any" }, "any of"));
  const rows = el("div", { id: id("rows") }, (shown ? shown.rows : []).map((r) => filterRow(r, fieldList)));
  const json = el("textarea", { id: id("json"), "data-field": path, spellcheck: "false",
                                placeholder: '{"all": [{"field": "agentId", "op": "eq", "value": "support"}]}' });
  json.value = filter ? JSON.stringify(filter, null, 2) : "";
  const asJson = el("input", { type: "checkbox", id: id("as-json"), checked: !shown });
  const rowsPart = el("div", { id: id("builder") },
    el("div", { class: "row" }, el("div", {}, el("label", { for: id("join") }, "Match"), join)),
    rows,
    el("p", {}, el("button", { type: "button", class: "secondary", id: id("add"),
      onclick: () => rows.append(filterRow({ not: false, leaf: { op: "eq" } }, fieldList)) }, "Add a condition")));
  const jsonPart = el("div", {}, json);
  const sync = () => { rowsPart.hidden = asJson.checked; jsonPart.hidden = !asJson.checked; };
  asJson.addEventListener("change", () => {
    if (asJson.checked) json.value = JSON.stringify(readRows(), null, 2) || "";
    sync();
  });
  sync();
  const readRows = () => {
    const nodes = [...rows.querySelectorAll(".filter-row")];
    if (!nodes.length) return null;
    return { [join.value]: nodes.map((node, i) => readRow(node, `${path}.${join.value}[${i}]`)) };
  };
  const node = el("div", { id: prefix },
    el("p", { class: "muted" }, intro),
    rowsPart, jsonPart,
    el("label", {}, asJson, " edit as JSON (for nested all / any / not)"),
    el("datalist", { id: fieldList }, fields.map((f) => el("option", { value: f }))));
  return {
    node,
    read() {
      if (!asJson.checked) return readRows();
      if (json.value.trim() === "") return null;
      try { return JSON.parse(json.value); } catch (error) { throw new Error(`not JSON: ${error.message}`); }
    },
  };
}
