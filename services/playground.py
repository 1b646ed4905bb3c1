"""The playground: a group grades one example now, with the scoring engine of the process, and
the rating comes back to the caller - nothing is published, nothing is kept.

It spends the project's live judge budget like live scoring (its judges' calls reserved before
they are made, all or nothing; retries and a gates-first panel reserve as they go), and it is
bounded per project: a busy playground is refused (429) rather than queued, so that it cannot
take the judge endpoint's slots from live scoring for long.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from datetime import UTC, datetime

from pydantic import ValidationError

from adapters.stores.claims import Claims
from adapters.stores.verdicts import VerdictStore
from scorer_groups.api_models import GradeRequest, JudgeCallRecord
from scorer_groups.documents import Rating
from scoring.catalog import CatalogSnapshot
from scoring.claim_request import ClaimRequest, day_of
from scoring.errors import CatalogError
from scoring.filters import SpanView, TraceView, compile_filter
from scoring.judge_calls import call_document
from scoring.models import ScorerGroup
from scoring.panel import Panel
from scoring.ports import BudgetExhausted
from scoring.prices import NANOS
from scoring.results import build_rating
from scoring.routing import pair_of
from scoring.subjects import Span, Subject, Trace
from services.spending import Spending
from services.unclaimed_verdicts import UnclaimedVerdicts

GRADES_PER_PROJECT = 4  # at once; the fifth is refused until one ends
PLAYGROUND_SPAN = "playground-root"  # the example's span id: its root, or its step for a span group


class PlaygroundRefused(CatalogError):
    """429: the project's judge budget has no room for the example's judges, or the project's
    playground is already grading as many examples as it may. ``extension`` is added to the
    problem body (the budget's state)."""

    status = 429

    def __init__(self, message: str, extension: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.extension = extension or {}


def passes_filter(group: ScorerGroup, example: GradeRequest) -> bool | None:
    """Would live scoring see the example? The group's ``online.filter`` decided on a trace made
    of it: its input and output as the root span's (named ``rootName``), its spans below the
    root (those that are not valid spans are not seen), its metadata, agent and session; for a
    span-scope group, also its ``spanFilter`` on that root span (the example is the step). None:
    the group has neither."""
    online = group.online
    step = online is not None and online.scope == "span" and online.span_filter is not None
    if online is None or (online.filter is None and not step):
        return None
    root = Span(span_id=PLAYGROUND_SPAN, name=example.root_name or "", input=example.input, output=example.output)
    spans = [root]
    for raw in example.spans:
        with contextlib.suppress(ValidationError):
            span = Span.model_validate(raw)
            spans.append(span if span.parent_span_id else span.model_copy(update={"parent_span_id": "playground-root"}))
    trace = Trace(trace_id="playground", project_id=group.project_id, agent_id=example.agent_id or "playground",
                  session_id=example.session_id, timestamp=datetime.now(UTC), spans=spans,
                  metadata=dict(example.metadata))
    view = TraceView(trace)  # its regexes bounded as a live trace's (scoring.regex_work)
    passes = online.filter is None or compile_filter(online.filter)(view) is True
    if step and online.span_filter is not None:  # a span group: the example is the step its filter must take
        passes = passes and compile_filter(online.span_filter)(SpanView(root, view.work)) is True
    return passes


class Playground:
    """One per process, beside the scoring engine it grades with."""

    def __init__(self, panel: Panel, claims: Claims, *, per_project: int = GRADES_PER_PROJECT,
                 verdicts: VerdictStore | None = None) -> None:
        self._panel, self._claims, self._per_project = panel, claims, per_project
        self._verdicts = UnclaimedVerdicts(panel, verdicts)  # the verdict cache, as live traffic reads it
        self._busy: dict[str, int] = {}  # gradings under way, by project (one event loop: no lock)

    async def grade(self, group: ScorerGroup, snapshot: CatalogSnapshot,
                    example: GradeRequest) -> tuple[Rating, list[JudgeCallRecord]]:
        """The example's rating, and the judge calls behind it (cut and masked)."""
        project = group.project_id
        if self._busy.get(project, 0) >= self._per_project:
            raise PlaygroundRefused(f"the playground is grading {self._per_project} examples of this project "
                                    "already; try again when one is done")
        self._busy[project] = self._busy.get(project, 0) + 1
        try:
            return await self._grade(group, snapshot, example)
        finally:
            self._busy[project] -= 1
            if not self._busy[project]:
                del self._busy[project]

    async def _grade(self, group: ScorerGroup, snapshot: CatalogSnapshot,
                     example: GradeRequest) -> tuple[Rating, list[JudgeCallRecord]]:
        # 1. the example as a subject of the group's project: a trace, or - for a span-scope group -
        #    one step (its input and output the step's, asked the step question)
        example_id = f"playground-{uuid.uuid4().hex[:12]}"
        step = group.online is not None and group.online.scope == "span"
        subject = Subject(scope="span" if step else "trace", input=example.input, output=example.output,
                          expected=example.expected, spans=list(example.spans), metadata=dict(example.metadata),
                          transcript="", project_id=group.project_id, agent_id=example.agent_id or "playground",
                          trace_id=example_id, span_id=PLAYGROUND_SPAN if step else None,
                          span_name=(example.root_name or "example") if step else None)
        # 2. the judges' verdicts already paid for (the verdict cache), and the other calls reserved
        #    from the project's budget, as a live pair's would be
        request = self._request(group, snapshot, subject, example_id)
        found = (await self._verdicts.look_up(group, snapshot, [
            (example_id, example_id, subject)])).get(example_id)  # a verdict it pays for names the example
        async with Spending(self._claims) as spending:
            if not await spending.reserve([(example_id, request, found)]):
                raise await self._exhausted(request)
            # 3. every member now; a gates-first panel and retries reserve as they go
            try:
                result = await self._panel.score(group, subject, snapshot, spend=spending.spends[example_id],
                                                 verdicts=found)
            except BudgetExhausted:
                raise await self._exhausted(request) from None
            # 4. the ceilings reserved settled to what the calls used and cost, as a live pair's are
            await spending.settle([(example_id, result)])
        if found is not None:  # 5. what it paid for, kept for the next asking
            await self._verdicts.keep(group.project_id, [found])
        calls = [JudgeCallRecord.model_validate(call_document(call, m.outcome.ref_id, m.outcome.name))
                 for m in result.blend.members for call in m.outcome.calls]
        return build_rating(result, "playground"), calls

    def _request(self, group: ScorerGroup, snapshot: CatalogSnapshot, subject: Subject,
                 example_id: str) -> ClaimRequest:
        """What the example reserves, as a live pair of the group would (``routing.pair_of``)."""
        return pair_of(group, subject, snapshot, subject_key=f"playground:{example_id}", day=day_of(time.time()),
                       pricing=self._panel.pricing).claim

    async def _exhausted(self, request: ClaimRequest) -> PlaygroundRefused:
        now = time.time()
        window = request.budget_window_s
        start = int(now) // window * window
        state: dict[str, object] = {
            "judgeCallsPerWindow": request.calls_cap, "judgeTokensPerWindow": request.tokens_cap,
            "windowSeconds": window, "windowStart": start, "resetsInSeconds": start + window - int(now),
            "judgeCallsUsed": await self._claims.budget_used(request.project_id, window, now),
            "judgeTokensUsed": await self._claims.tokens_used(request.project_id, window, now)}
        if request.cost_cap is not None:  # money, in the currency (scoring.prices)
            state["judgeCostPerWindow"] = request.cost_cap / NANOS
            state["judgeCostUsed"] = await self._claims.cost_used(request.project_id, window, now) / NANOS
        return PlaygroundRefused(f"the project's judge budget has no room for this example's judge calls "
                                 f"({state['judgeCallsUsed']} of {request.calls_cap} used; the window resets in "
                                 f"{state['resetsInSeconds']} s)", {"budget": state})

