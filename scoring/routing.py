"""Which groups score a trace, and what each (group, subject) pair reserves.

The step between a decoded trace and the claims: the project's live groups, each deciding by its
filter and then its stable sample, each kept trace-scope group with the claim that dedupes the
pair and reserves its judge calls in the project's budget. The session sweeper (which also
waits for a session to be idle) builds its pairs with ``pair_of`` too. Knows nothing of Kafka.
"""

from __future__ import annotations

from dataclasses import field

from scoring.catalog import CatalogSnapshot
from scoring.claim_request import ClaimRequest, day_of, span_key
from scoring.filters import SpanView, TraceView
from scoring.frozen import frozen
from scoring.judge_prompt import ANSWER_MAX_TOKENS, token_ceiling
from scoring.models import ScorerGroup
from scoring.panel import planned_judges, upfront_judge_calls
from scoring.prices import NO_PRICING, NO_RATES, Pricing, nanos
from scoring.sampling import keep
from scoring.subjects import Span, Subject, Trace, children_of, span_subject, trace_subject
from scoring.verdict_cache import PairVerdicts

DEFAULT_BUDGET_WINDOW_S = 3600  # the window a claim names when its project has no budget


@frozen
class Pair:
    """One (group, subject) to score, with the claim that reserves it."""

    group: ScorerGroup
    subject: Subject
    claim: ClaimRequest
    # What its claim found in the verdict cache (the pair protocol fills it; the panel reads it).
    verdicts: PairVerdicts = field(default_factory=PairVerdicts, compare=False, hash=False)


def pair_of(group: ScorerGroup, subject: Subject, snapshot: CatalogSnapshot, *, subject_key: str,
            day: int, pricing: Pricing = NO_PRICING) -> Pair:
    """The pair and its claim, kept under the group's own project (never another tenant's) and
    reserving the judge calls its panel will make within that project's budget, if it has one
    (a gates-first group's judges reserve later, once its cheap gates passed): their token
    ceiling under a token or money cap, and under a money cap - the project's, the group's
    ``maxCostPerDay`` - their cost at ``pricing``."""
    budget = snapshot.budget(group.project_id)
    tokens_cap = budget.tokens_cap if budget else None
    cost_cap = budget.cost_cap if budget else None
    day_cap = group.online.max_cost_per_day if group.online is not None else None
    money = cost_cap is not None or day_cap is not None
    calls = upfront_judge_calls(group, snapshot, subject)
    judges = planned_judges(group, snapshot, subject) if tokens_cap is not None or money else ()
    return Pair(group, subject, ClaimRequest(
        project_id=group.project_id, group_id=group.id, subject_key=subject_key, judge_calls=calls,
        revision=snapshot.revision(group),
        calls_cap=budget.calls_cap if budget else None,
        budget_window_s=budget.window_seconds if budget else DEFAULT_BUDGET_WINDOW_S, day=day,
        # The prompts are built to measure them only under a token or money cap.
        judge_tokens=sum(token_ceiling(j, subject) for j in judges) if calls else 0,
        tokens_cap=tokens_cap,
        rates=pricing.rates(judges, ANSWER_MAX_TOKENS) if money else NO_RATES,
        cost_cap=None if cost_cap is None else nanos(cost_cap),
        group_cost_cap=None if day_cap is None else nanos(day_cap)))


@frozen
class Route:
    """What one trace is to each live group of its project."""

    pairs: list[Pair]  # trace- and span-scope pairs: the filter passed and the sample kept them
    turn: bool  # a session-scope group's filter passes it: record it as a turn of its conversation
    matched: list[str]  # the groups (any scope) whose filter it passes, sampled or not
    filtered: list[str]  # the groups whose filter it does not pass: they spend nothing on it
    # (group, why) -> subjects not graded. Span groups: "span_cap" (spans kept past the cap),
    # "span_budget" (spans not examined: the trace's filter work ran out). Any group:
    # "regex_budget" (its filter could not tell: the trace's regex matching time ran out).
    skipped: dict[tuple[str, str], int] = field(default_factory=dict)
    regex_cut: int = 0  # regex searches that read only the start of a long text


DEFAULT_MAX_SPANS_PER_TRACE = 50  # spans one span-scope group scores in one trace (SGW_MAX_SPANS_PER_TRACE)


def route(trace: Trace, snapshot: CatalogSnapshot, max_spans: int = DEFAULT_MAX_SPANS_PER_TRACE,
          pricing: Pricing = NO_PRICING) -> Route:
    """Decide the trace for every live group of its project, in the order that spends least:

    1. the group's filter (a pure function of the trace): a trace filtered out costs the group
       no claim, no Redis command and no judge slot;
    2. the stable sample, over the matching traffic (``sampleRate`` is a fraction of it);
    3. the pair and its claim, for trace-scope groups; a turn to record, for session-scope ones
       (each turn is filtered alone: a session group judges its matching turns together); for
       span-scope groups, a pair per span their ``spanFilter`` takes and their sample keeps
       (per trace and span), at most ``max_spans`` of them.
    """
    trace_groups = snapshot.live_groups(trace.project_id, "trace")
    session_groups = snapshot.live_groups(trace.project_id, "session")
    span_groups = snapshot.live_groups(trace.project_id, "span")
    if not trace_groups and not session_groups and not span_groups:
        return Route([], False, [], [])
    view = TraceView(trace)
    matched: list[str] = []
    filtered: list[str] = []
    kept: list[ScorerGroup] = []
    stepwise: list[ScorerGroup] = []
    turn = False
    undecided: list[str] = []
    for group in trace_groups + session_groups + span_groups:
        if group.online is not None and group.online.shadow_until is not None \
                and trace.timestamp >= group.online.shadow_until:
            continue  # a shadow past its time (the trace's own: the same on redelivery), before any work
        passes = snapshot.passes(group, view)
        if not passes:
            filtered.append(group.id)
            if passes is None:  # a trace's fields are all known: only a regex past the trace's time
                undecided.append(group.id)
            continue
        if group.online is None:
            continue
        if group.online.scope == "session":
            if trace.session_id:  # a trace without a session is no turn: neither matched nor recorded
                matched.append(group.id)
                turn = True
            continue
        matched.append(group.id)
        if group.online.scope == "span":
            stepwise.append(group)
        elif keep(trace.trace_id, group.online.sample_rate, group.online.sample_salt or ""):
            kept.append(group)
    skipped = {(group, "regex_budget"): 1 for group in undecided}
    if not kept and not stepwise:
        return Route([], turn, matched, filtered, skipped, view.work.cut)
    day = day_of(trace.timestamp.timestamp())  # the trace's own time: the same on redelivery
    pairs: list[Pair] = []
    if kept:
        subject = trace_subject(trace)
        pairs = [pair_of(group, subject, snapshot, subject_key=f"trace:{trace.trace_id}", day=day,
                         pricing=pricing) for group in kept]
    if stepwise:
        steps = _Steps(trace, view)
        for group in stepwise:
            rate = group.online.sample_rate if group.online is not None else 0.0  # (always one: a live group)
            spans, over, unexamined, undecided_spans = _graded_spans(steps, group, snapshot, view, max_spans, rate)
            pairs += [pair_of(group, steps.subject(span), snapshot, subject_key=span_key(trace.trace_id, span.span_id),
                              day=day, pricing=pricing) for span in spans]
            skipped.update({(group.id, why): n for why, n in (("span_cap", over), ("span_budget", unexamined),
                                                                ("regex_budget", undecided_spans)) if n})
    return Route(pairs, turn, matched, filtered, skipped, view.work.cut)


class _Steps:
    """What every span-scope group of one trace shares: each span's view and subject, made once."""

    def __init__(self, trace: Trace, view: TraceView) -> None:
        self.trace = trace
        self.views = [SpanView(span, view.work) for span in trace.spans]
        self._below: dict[str, list[Span]] | None = None
        self._subjects: dict[str, Subject] = {}

    def subject(self, span: Span) -> Subject:
        if span.span_id not in self._subjects:
            if self._below is None:
                self._below = children_of(self.trace)
            self._subjects[span.span_id] = span_subject(self.trace, span, self._below)
        return self._subjects[span.span_id]


def _graded_spans(steps: _Steps, group: ScorerGroup, snapshot: CatalogSnapshot, view: TraceView,
                  max_spans: int, rate: float) -> tuple[list[Span], int, int, int]:
    """The spans a span-scope group grades in this trace - its ``spanFilter`` passes them and its
    sample keeps them (per trace and span: a redelivery decides the same), each span id once,
    the first ``max_spans`` in the trace's order - how many more it would have graded, how
    many spans it could not examine: the span filter's work counts against the trace's bound
    (``MAX_SPAN_TESTS``), and past it the remaining spans are not graded (fail closed), and how
    many its filter could not tell (its regexes past the trace's matching time: not graded)."""
    compiled = snapshot.span_filter(group)
    if compiled is None or group.online is None:
        return [], 0, 0, 0
    decide, conditions = compiled
    salt, trace_id = group.online.sample_salt or "", steps.trace.trace_id
    graded: list[Span] = []
    over = undecided = 0
    seen: set[str] = set()
    for index, span_view in enumerate(steps.views):
        view.span_tests_left -= conditions
        if view.span_tests_left < 0:
            return graded, over, len(steps.views) - index, undecided
        span = span_view.span
        if span.span_id in seen:
            continue
        passes = decide(span_view)
        if not passes:
            undecided += passes is None
            continue
        seen.add(span.span_id)
        if not keep(f"{trace_id}/{span.span_id}", rate, salt):
            continue
        if len(graded) < max_spans:
            graded.append(span)
        else:
            over += 1
    return graded, over, 0, undecided


def group_pairs(trace: Trace, group: ScorerGroup, snapshot: CatalogSnapshot, *, sample_rate: float,
                max_spans: int = DEFAULT_MAX_SPANS_PER_TRACE, pricing: Pricing = NO_PRICING) -> list[Pair]:
    """The pairs one group grades in one trace at ``sample_rate``, live or not (a backfill's):
    the steps of ``route`` for that group alone - its filter, the same stable sample a live
    group at that rate takes, a pair for the trace or for each step its ``spanFilter`` takes.
    Session scope has no pair here: a conversation is not one trace."""
    scope = group.online.scope if group.online is not None else "trace"
    view = TraceView(trace)
    if group.project_id != trace.project_id or scope == "session" or snapshot.passes(group, view) is not True:
        return []
    day = day_of(trace.timestamp.timestamp())
    if scope == "span":
        steps = _Steps(trace, view)
        spans, *_ = _graded_spans(steps, group, snapshot, view, max_spans, sample_rate)
        return [pair_of(group, steps.subject(span), snapshot, subject_key=span_key(trace.trace_id, span.span_id),
                        day=day, pricing=pricing) for span in spans]
    salt = group.online.sample_salt or "" if group.online is not None else ""
    if not keep(trace.trace_id, sample_rate, salt):
        return []
    return [pair_of(group, trace_subject(trace), snapshot, subject_key=f"trace:{trace.trace_id}", day=day,
                    pricing=pricing)]


def trace_pairs(trace: Trace, snapshot: CatalogSnapshot) -> list[Pair]:
    """The pairs of ``route``: the trace-scope groups that score this trace."""
    return route(trace, snapshot).pairs
