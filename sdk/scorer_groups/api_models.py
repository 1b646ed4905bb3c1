"""Wire models of the HTTP API's answers that are not catalog documents: a group's ratings
history, session verdicts, change-log entries and alert channels as shown (secrets never).

The API declares its responses with them and the SDK (``scorer_groups``) parses with them, so
the two cannot drift. Catalog documents themselves are ``scoring.models``.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError

from scorer_groups.documents import Rating, Usage
from scorer_groups.models import Budget, WireModel


class ApiModel(BaseModel):
    """camelCase on the wire; ``model["field"]`` reads a field too (by wire or Python name), so
    results print and index like the spec's examples."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    def __getitem__(self, name: str) -> Any:
        for field_name, info in type(self).model_fields.items():
            if name in (field_name, info.alias):
                return getattr(self, field_name)
        raise KeyError(name)


class RatingBucket(ApiModel):
    start: int = Field(description="Bucket start, Unix seconds.")
    count: int
    scored: int
    mean: float | None
    min: float | None
    max: float | None
    below_threshold: int
    no_score: int
    skipped: int = Field(0, description="Pairs sampled in but not scored: the judge budget was exhausted.")
    matched: int = Field(0, description="Traces (session turns) that passed the group's filter, sampled or not: "
                                        "the traffic the group is aimed at.")
    cost: float = Field(0.0, description="What the group's judge calls cost, in the operators' currency "
                                         "(SGW_JUDGE_PRICES): the calls made - a verdict the cache paid for "
                                         "costs nothing again. A floor when unpricedCalls > 0.")
    member_cost: dict[str, float] = Field(default_factory=dict, description="That cost by member (its refId).")
    unpriced_calls: int = Field(0, description="Judge calls whose cost is unknown: a model without a price, or "
                                               "an answer without its token counts. Never counted as free.")
    judge_calls: int = Field(0, description="Judge calls made (a verdict the cache paid for is none).")
    tokens: int = Field(0, description="The tokens those calls reported.")


class Ratings(ApiModel):
    """A group's score history over a window, oldest bucket first (empty buckets included)."""

    group_id: str
    window: str
    bucket_seconds: int
    count: int
    scored: int
    mean: float | None
    below_threshold: int
    no_score: int
    skipped: int = Field(0, description="Pairs sampled in but not scored: the judge budget was exhausted.")
    matched: int = Field(0, description="Traces (session turns) that passed the group's filter, sampled or not: "
                                        "the traffic the group is aimed at.")
    cost: float = Field(0.0, description="What the window's judge calls cost, in ``currency``.")
    member_cost: dict[str, float] = Field(default_factory=dict, description="That cost by member (its refId).")
    unpriced_calls: int = Field(0, description="Judge calls whose cost is unknown (the cost is a floor then).")
    judge_calls: int = Field(0, description="Judge calls made in the window.")
    tokens: int = Field(0, description="The tokens those calls reported.")
    cost_per_result: float | None = Field(None, description="The window's cost over its results: what a rated "
                                                            "trace (session, span) costs. Null without results.")
    currency: str = Field("USD", description="The currency of the costs (SGW_CURRENCY).")
    buckets: list[RatingBucket]


class SessionScore(ApiModel):
    kind: str = Field(description="scorer-group:<groupId>")
    rating: float | None
    justification: str
    scored_at: float


class Change(ApiModel):
    at: float
    actor: str = Field(description="The API key (id and name) or local user that made the change.")
    action: Literal["created", "updated", "deleted"]
    project_id: str | None
    changes: dict[str, dict[str, Any]] = Field(description="field -> {before, after}; secrets masked.")


class Channel(ApiModel):
    """An alert channel as shown: whether it has a secret, never the secret."""

    id: str
    agent_id: str
    url: str  # credentials and secret query parameters masked
    project_id: str | None
    has_secret: bool
    format: Literal["standard", "slack", "pagerduty"] = "standard"
    disabled: bool = False  # set by the sender after 410 Gone or failing past SGW_WEBHOOK_DISABLE_AFTER_S
    disabled_reason: str | None = None
    digest_seconds: int | None = None  # a digest channel's period


class BudgetUse(ApiModel):
    """What a project's live scoring spent in the current budget window."""

    window_start: int = Field(description="The window's start, Unix seconds (windows are fixed).")
    window_seconds: int
    judge_calls: int = Field(description="Judge calls reserved: one per call made, retries included.")
    judge_tokens: int = Field(description="Judge tokens: the usage judges reported for settled calls, plus "
                                          "the ceilings reserved for calls in flight (under a token budget).")
    judge_calls_saved: int = Field(0, description="Judge calls the verdict cache saved: verdicts paid for already "
                                                  "(the same judge, model and messages), reserved and made never.")
    judge_tokens_saved: int = Field(0, description="The tokens those calls cost when they were paid for.")
    judge_cost: float | None = Field(None, description="Under a money cap (judgeCostPerWindow), what the window's "
                                                       "judge calls cost, in the operators' currency: settled "
                                                       "calls at their price, plus the ceilings of calls in "
                                                       "flight. Null without one.")


class BudgetView(Budget):
    """A project's budget as ``GET /v1/budgets/{projectId}`` shows it: the document, and what the
    current window has used of it."""

    used: BudgetUse


class ResultsPage(ApiModel):
    """A page of a group's latest results (trace and session scope), newest first: each the
    rating as it was published."""

    items: list[Rating]
    next_cursor: str | None = Field(None, description="Pass as cursor for the next page; null on the last.")


MAX_EXAMPLE_EXTRAS_CHARS = 1 << 20
MAX_EXAMPLE_SPANS = 500  # a playground example's, and a dataset run row's (scorer_groups.runs.RowOutput)


class GradeRequest(WireModel):
    """One example for the playground: graded with the group's members now, nothing published."""

    input: str = Field(max_length=100_000)
    output: str = Field(max_length=100_000)
    expected: JsonValue = None
    spans: list[dict[str, JsonValue]] = Field(default_factory=list, max_length=MAX_EXAMPLE_SPANS)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    # What only the group's online.filter reads: the answer says whether live scoring would see it.
    agent_id: str | None = Field(None, max_length=128)
    session_id: str | None = Field(None, max_length=256)
    root_name: str | None = Field(None, max_length=1_000)

    @model_validator(mode="after")
    def _bounded(self) -> GradeRequest:
        # What members are sent (a code scorer's arguments, an external scorer's body): as much as
        # a live trace may carry (SGW_MAX_TRACE_BYTES' default), not what the request happens to hold.
        size = len(json.dumps([self.expected, self.spans, self.metadata], separators=(",", ":")))
        if size > MAX_EXAMPLE_EXTRAS_CHARS:
            raise ValueError(f"expected, spans and metadata: {size} characters of JSON together, "
                             f"at most {MAX_EXAMPLE_EXTRAS_CHARS}")
        return self


class CallMessage(ApiModel):
    role: str
    content: str = Field(description="As sent, cut at 4,000 characters and masked of secrets.")
    length: int = Field(description="The message's full length in characters, before the cut.")


class JudgeCallRecord(ApiModel):
    """One judge call behind a verdict: the exact messages the judge was sent and what it
    answered (texts cut at 4,000 characters, with their full lengths; secrets masked)."""

    ref_id: str = Field(description="The judge member's scorer id.")
    member: str = Field(description="The member's label in the group.")
    model: str
    messages: list[CallMessage]
    answer: str | None = Field(description="The answer's text (the completion's content, else the body); "
                                           "null when none came.")
    answer_length: int
    started_at: AwareDatetime
    latency_ms: float
    attempts: int = Field(description="HTTP requests sent for this verdict: retries and reshapes included.")
    usage: Usage | None = None
    error: str | None = None
    cached_from: str | None = Field(None, exclude_if=lambda v: v is None,
                                    description="Not made: the verdict was paid for already, by the judge call "
                                                "of this rating (the verdict cache). Absent for a call made.")


class RatingWithCalls(ApiModel):
    """One of a group's latest results, with the judge calls behind it."""

    rating: Rating
    calls: list[JudgeCallRecord]


class RowCalls(ApiModel):
    """The judge calls behind one row of a dataset run."""

    row: int
    calls: list[JudgeCallRecord]
    note: str | None = Field(None, description="Why there are none: the agent failed on the row, or the run's "
                                               "budget for judge calls left them out.")


class JudgeTemplate(ApiModel):
    """A shipped rubric to start a judge from (``POST /v1/judges`` with ``"template": name``),
    with what it reads and a small set of rows people labelled: grade them with the judge made
    from it to see how far it agrees with people (the run's ``agreement``)."""

    name: str
    title: str = Field(description="The judge's name when none is given.")
    reads: str = Field(description="What the judge reads of a trace.")
    criteria: str
    judge_prompt: str
    context: Literal["retrieval"] | None = None
    examples: tuple[dict[str, JsonValue], ...] = Field(
        description="Dataset rows (input, output, spans) with the verdict people gave them "
                    "(humanRating, humanPass).")


class JudgeTemplates(ApiModel):
    items: list[JudgeTemplate]


class PlaygroundRating(Rating):
    """The playground's answer: the rating, and whether live scoring would see the example."""

    passes_filter: bool | None = Field(None, description="The group's online.filter decided on the example (its "
                                                         "input and output as the root span's, its spans, metadata, "
                                                         "agentId, sessionId and rootName); null: no filter.")
    calls: list[JudgeCallRecord] = Field(default_factory=list, description="The judge calls behind it.")


# --- Backfills: a group grades traffic that already passed -------------------------

BackfillStatus = Literal["queued", "running", "paused", "done", "failed", "cancelled"]
BACKFILL_ENDED = ("done", "failed", "cancelled")


class BackfillCreate(BaseModel):
    """``POST /v1/scorer-groups/{id}/backfills``: grade the traces of ``[from, to)`` again."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True, extra="forbid")

    from_: AwareDatetime = Field(alias="from", description="ISO-8601 with a zone: the first trace time graded.")
    to: AwareDatetime = Field(description="ISO-8601 with a zone, not in the future: the end (excluded).")
    sample_rate: float | None = Field(None, ge=0, le=1, description="The job's sample (default the group's "
                                                                     "online sampleRate; required without one).")
    max_judge_calls: int | None = Field(None, ge=1, le=10**12, description="The most judge calls the job makes.")
    alerts: bool = Field(False, description="Raise Signals and deliveries for what it grades (default: none).")
    dry_run: bool = Field(False, description="Start nothing: answer 200 with {\"estimate\": ...} - what the job "
                                             "would grade and spend, measured on a bounded read of the window.")

    @model_validator(mode="after")
    def _a_window(self) -> BackfillCreate:
        if self.to <= self.from_:
            raise ValidationError.from_exception_data("BackfillCreate", [InitErrorDetails(
                type=PydanticCustomError("window", "must be after from"), loc=("to",), input=self.to.isoformat())])
        return self


class BackfillEstimate(ApiModel):
    """What a backfill would grade and spend (``dryRun``), measured on a bounded read of its
    window; nothing is claimed, reserved or called."""

    # The topic is every project's: how many records it holds, or how many were read, is other
    # tenants' traffic and is not said - only whether the whole window was read.
    exact: bool = Field(description="The whole window was read: the traces and pairs are the job's own.")
    traces: int = Field(description="The project's traces stamped in the window (estimated).")
    pairs: int = Field(description="Subjects its filter and sample would keep: the pairs it would grade.")
    pairs_error: int | None = Field(description="The pairs' 95% error (+/-): 0 when exact; null when the read "
                                                "was too small to tell, or saw no pair of the group.")
    relative_error: float | None = Field(description="pairsError / pairs: the judge calls, tokens and cost share "
                                                     "it (null when unknown, or no pair is expected).")
    judge_calls: int = Field(description="Judge calls expected (at most maxJudgeCalls).")
    tokens: int = Field(description="Judge tokens expected.")
    cost: float | None = Field(description="Their cost in ``currency``; null when a model has no price.")
    currency: str
    basis: Literal["history", "ceilings"] = Field(description="history: the group's recent averages per result; "
                                                              "ceilings: none yet - the most a pair can cost.")
    capped: bool = Field(False, description="maxJudgeCalls stops the job before the window's end.")


class BackfillEstimateAnswer(ApiModel):
    """``POST .../backfills`` with ``dryRun``: the estimate, and no job."""

    estimate: BackfillEstimate


class BackfillProgress(ApiModel):
    fraction: float = 0.0
    traces_read: int = 0
    pairs_scored: int = 0
    pairs_skipped: int = 0
    judge_calls: int = 0


class BackfillJob(ApiModel):
    id: str
    group_id: str
    project_id: str
    status: BackfillStatus
    from_: AwareDatetime = Field(alias="from")
    to: AwareDatetime
    sample_rate: float
    max_judge_calls: int | None = None
    alerts: bool = False
    progress: BackfillProgress = Field(default_factory=BackfillProgress)
    error: str | None = None
    notes: list[str] = Field(default_factory=list)
    resume_at: AwareDatetime | None = Field(None, description="A paused job's next try: the start of the "
                                                              "project's next budget window.")
    created_at: AwareDatetime
    updated_at: AwareDatetime


# --- Incidents: a group's level needing a person, opened and resolved once ------------

class Incident(ApiModel):
    """One incident of a group: opened when its window (or coverage, or level) went bad,
    resolved once a whole window after was good again."""

    id: str
    group_id: str
    project_id: str
    reason: Literal["window_below", "coverage", "drift", "agreement"]
    state: Literal["open", "resolved"]
    opened_at: AwareDatetime
    resolved_at: AwareDatetime | None = None
    last_said: str = Field(description="What the last Signal of the incident said.")
    window_mean: float | None = None
    window_results: int = 0


class Level(ApiModel):
    """A drift group's learned level: the weighted mean of its window means and their spread."""

    mean: float
    spread: float
    windows: int = Field(description="Windows learned; drift is judged from 8 on.")


class Incidents(ApiModel):
    """``GET /v1/scorer-groups/{id}/incidents``: a page of the group's incidents, open ones
    first, then the newest (the last 500 are kept), and its learned level (drift groups; null
    before a window was learned)."""

    incidents: list[Incident]
    level: Level | None = None
    next_cursor: str | None = Field(None, description="Pass as cursor for the next page; null on the last.")
