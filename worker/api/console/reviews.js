// Review: people check the judges on live traffic. The queues of the key's project
// (#/reviews), a result put in a queue by hand from a group's results, and one queue's review
// (#/reviews/<queue id>), made for a person labelling a hundred items in a row - keyboard first:
//
//   0-9       the rating (1 then 0 within a moment: 10)
//   j k, ↓ ↑  choose a member          a / d   agree / disagree with the chosen member
//   c         the judge calls behind the result (what each judge read, what it answered)
//   n         save the label and take the next item
//   u         undo the last change; with none, go back to the item labelled before (its label
//             can change while the item is open)
//
// It works with a reviewer key alone: it calls only the routes a reviewer key may (the queues,
// next, an item, its calls, its label, the progress). Like the rest of the console, every string
// of an item (the trace, verdicts, justifications, calls) is put on the page as text.
"use strict";

const TEN_WITHIN_MS = 800; // "1" then "0" this close together is a 10
const REVIEW_HELP = "0-9 rate (1 0: ten) · j/k choose a member · a agree · d disagree · c judge calls · " +
                    "n save and next · u undo";

let review = null; // the review on the page (reviewPage), or null elsewhere

async function reviewsPage() {
  review = null;
  show(el("p", { class: "muted" }, "Loading the review queues..."));
  let queues;
  try {
    queues = (await api("GET", "/v1/review-queues?limit=200")).items;
  } catch (error) {
    show(failure(error));
    return;
  }
  show(el("section", {}, el("h1", {}, "Review"),
    el("p", { class: "muted" }, "Check the judges on live traffic: take a queue's next item, rate it, agree or " +
       "disagree with each member. Your labels become the judges' measured agreement with people."),
    queues.length
      ? el("table", { id: "queues" },
          el("thead", {}, el("tr", {}, ["Queue", "Takes", "Reviewers per item", ""].map((h) => el("th", {}, h)))),
          el("tbody", {}, queues.map((q) => el("tr", { dataset: { queue: q.id } },
            el("td", {}, q.name), el("td", {}, ruleText(q.rule)), el("td", {}, String(q.reviewersPerItem)),
            el("td", {}, el("a", { href: `#/reviews/${encodeURIComponent(q.id)}`, class: "review-link" }, "Review"))))))
      : el("p", { class: "muted" }, "No review queues in this project yet.")));
}

function ruleText(rule) {
  const parts = [];
  if (rule.below) parts.push("results below the threshold");
  if (rule.disagreement !== null && rule.disagreement !== undefined) parts.push(`members ${rule.disagreement} apart`);
  if (rule.sampleRate !== null && rule.sampleRate !== undefined) parts.push(`${+(rule.sampleRate * 100).toFixed(2)}% sample`);
  return parts.join(", ");
}

// --- a result put in a queue by hand (the group page's results list) ---------------------------

async function queuesWatching(group) {
  try {
    return (await api("GET", "/v1/review-queues?limit=200")).items.filter((q) => q.groupIds.includes(group.id));
  } catch (_) {
    return []; // the results still show
  }
}

function addToQueue(rating, queues) {
  const select = el("select", { class: "add-to-queue", "aria-label": "Review queue" },
    queues.map((q) => el("option", { value: q.id }, q.name)));
  const said = el("span", { class: "muted add-to-queue-said", role: "status" });
  const button = el("button", { type: "button", class: "add-to-queue-button" }, "Add to review");
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const added = await api("POST", `/v1/review-queues/${encodeURIComponent(select.value)}/items`,
                              { ratingIds: [rating.id], groupId: rating.groupId });
      said.textContent = added.added ? "added" : added.already ? "already there" : added.turnedAway
        ? "the queue is full" : "no longer kept";
    } catch (error) {
      said.replaceChildren(failure(error));
    }
    button.disabled = false;
  });
  return el("span", { class: "add-to-queue-control" }, select, button, said);
}

// --- one queue's review --------------------------------------------------------------------

async function reviewPage(queueId) {
  show(el("p", { class: "muted" }, "Loading..."));
  let queue;
  try {
    queue = await api("GET", `/v1/review-queues/${encodeURIComponent(queueId)}`);
  } catch (error) {
    show(failure(error));
    return;
  }
  review = { queue, view: null, rating: null, members: {}, comment: "", selected: 0, changes: [], labelled: [],
             lastOne: 0, calls: null, root: el("div", { id: "review" }), progress: el("p", { id: "review-progress" }),
             message: el("p", { id: "review-message", role: "status" }) };
  show(el("section", {}, el("h1", {}, `Review: ${queue.name}`), review.progress,
    el("p", { class: "muted", id: "review-help" }, REVIEW_HELP), review.message, review.root));
  await takeNext();
}

async function takeNext() {
  const r = review;
  try {
    const view = await api("POST", `/v1/review-queues/${encodeURIComponent(r.queue.id)}/next`);
    if (review !== r) return;
    if (!view) {
      r.view = null;
      r.root.replaceChildren(el("p", { id: "review-empty" }, "Nothing to review in this queue now."));
    } else {
      load(view);
    }
  } catch (error) {
    r.root.replaceChildren(failure(error));
  }
  await showProgress();
}

async function showProgress() {
  const r = review;
  try {
    const p = await api("GET", `/v1/review-queues/${encodeURIComponent(r.queue.id)}/progress`);
    if (review === r) r.progress.textContent = `${p.open} open · ${p.mine} yours · ${p.done} done`;
  } catch (error) {
    r.progress.replaceChildren(failure(error));
  }
}

// An item on the page, its form filled from this key's own label if it has one (going back).
function load(view) {
  const mine = view.labels[0];
  Object.assign(review, { view, rating: mine ? mine.rating : null, members: mine ? { ...mine.members } : {},
                          comment: mine && mine.comment ? mine.comment : "", selected: 0, changes: [], calls: null });
  draw();
}

function draw() {
  const r = review, item = r.view.item, rating = item.rating, subject = item.subject;
  const members = rating.members.map((m, i) => {
    const mark = r.members[m.refId];
    return el("li", { class: `review-member${i === r.selected ? " selected" : ""}`, "aria-current": i === r.selected,
                      dataset: { member: m.refId } },
      el("strong", {}, m.name), ` (${m.kind}${m.gate ? ", must pass" : ""}): `, verdictText(m),
      m.detail ? el("div", { class: "muted" }, m.detail) : null,
      el("div", { class: "member-mark", dataset: { mark: mark ? (mark.agree ? "agree" : "disagree") : "" } },
        mark ? (mark.agree ? "you agree" : "you disagree") : "not marked"));
  });
  const comment = el("textarea", { id: "review-comment", rows: 2, cols: 60, maxlength: 2000,
                                   placeholder: "Comment (optional; Escape to go back to the keys)" });
  comment.value = r.comment;
  comment.addEventListener("input", () => { r.comment = comment.value; });
  r.root.replaceChildren(...[ // (replaceChildren writes a null as "null": the parts not shown are left out)
    el("p", { class: "muted", id: "review-item-id" }, `${item.reason} · ${subject.scope} ${subject.traceId || subject.sessionId || ""}` +
       (subject.spanName ? ` · span ${subject.spanName}` : "")),
    subject.transcript ? textBlock("Conversation", subject.transcript, "review-transcript") : null,
    !subject.transcript && subject.input ? textBlock("Input", subject.input, "review-input") : null,
    !subject.transcript && subject.output ? textBlock("Output", subject.output, "review-output") : null,
    !subject.input && !subject.transcript
      ? el("p", { class: "muted" }, "Added by hand: the trace's texts are not kept - press c for what the judges read.")
      : null,
    el("h2", {}, `The group said ${fmt(rating.rating)}`),
    el("p", { id: "review-justification" }, rating.justification),
    el("ol", { id: "review-members" }, members),
    el("p", { id: "review-rating" }, "Your rating: ", el("strong", {}, r.rating === null ? "-" : String(r.rating))),
    el("label", {}, comment),
    el("div", { id: "review-calls" }, r.calls)].filter(Boolean));
}

function verdictText(m) {
  if (m.status !== "scored") return m.status;
  if (typeof m.native === "boolean") return m.native ? "matched" : "not matched";
  return fmt(m.native);
}

function textBlock(title, text, id) {
  return el("div", {}, el("h3", {}, title), el("pre", { class: "review-text", id }, text));
}

async function toggleCalls() {
  const r = review, itemId = r.view.item.id;
  if (r.calls) { r.calls = null; draw(); return; }
  try {
    const calls = await api("GET", `/v1/review-items/${encodeURIComponent(r.view.item.id)}/calls`);
    r.calls = calls.length
      ? calls.map((c) => el("div", { class: "review-call" }, el("h3", {}, `${c.member} (${c.model})`),
          c.messages.map((m) => el("pre", { class: "review-text" }, `${m.role}: ${m.content}`)),
          el("pre", { class: "review-text review-answer" }, `answer: ${c.answer ?? c.error ?? ""}`)))
      : [el("p", { class: "muted" }, "No judge calls kept for this result.")];
  } catch (error) {
    r.calls = [failure(error)];
  }
  if (review === r && r.view && r.view.item.id === itemId) draw(); // not another item's, if one came meanwhile
  else if (r.view && r.view.item.id !== itemId) r.calls = null;
}

function change(apply) {
  const r = review;
  r.changes.push({ rating: r.rating, members: { ...r.members }, selected: r.selected });
  apply(r);
  draw();
}

async function saveAndNext() {
  const r = review;
  if (r.rating === null) {
    r.message.textContent = "Give a rating first: 0-9, or 1 then 0 for 10.";
    return;
  }
  const body = { rating: r.rating, members: r.members, ...(r.comment.trim() ? { comment: r.comment.trim() } : {}) };
  try {
    await api("PUT", `/v1/review-items/${encodeURIComponent(r.view.item.id)}/labels/me`, body);
  } catch (error) {
    r.message.replaceChildren(failure(error));
    return;
  }
  r.labelled.push(r.view.item.id);
  r.message.textContent = `Saved: ${r.rating}.`;
  await takeNext();
}

async function undo() {
  const r = review;
  if (r.changes.length) {
    Object.assign(r, r.changes.pop());
    draw();
    return;
  }
  const previous = r.labelled.pop();
  if (!previous) { r.message.textContent = "Nothing to undo."; return; }
  try {
    load(await api("GET", `/v1/review-items/${encodeURIComponent(previous)}`));
    r.message.textContent = "Back to the item you labelled before: change the label and press n.";
  } catch (error) {
    r.message.replaceChildren(failure(error));
  }
}

function reviewKey(event) {
  const r = review;
  if (!r || !r.view || event.ctrlKey || event.metaKey || event.altKey) return;
  const typing = event.target instanceof HTMLElement && event.target.matches("textarea, input, select");
  if (typing) {
    if (event.key === "Escape") event.target.blur();
    return;
  }
  const members = r.view.item.rating.members;
  const key = event.key;
  if (/^[0-9]$/.test(key)) {
    const ten = key === "0" && r.rating === 1 && Date.now() - r.lastOne < TEN_WITHIN_MS;
    change((s) => { s.rating = ten ? 10 : Number(key); });
    r.lastOne = key === "1" ? Date.now() : 0;
  } else if ((key === "j" || key === "ArrowDown") && members.length) {
    change((s) => { s.selected = (s.selected + 1) % members.length; });
  } else if ((key === "k" || key === "ArrowUp") && members.length) {
    change((s) => { s.selected = (s.selected + members.length - 1) % members.length; });
  } else if ((key === "a" || key === "d") && members.length) {
    const ref = members[r.selected].refId;
    change((s) => { s.members = { ...s.members, [ref]: { agree: key === "a" } }; });
  } else if (key === "c") {
    toggleCalls();
  } else if (key === "n") {
    saveAndNext();
  } else if (key === "u") {
    undo();
  } else {
    return;
  }
  event.preventDefault();
}

document.addEventListener("keydown", reviewKey);
