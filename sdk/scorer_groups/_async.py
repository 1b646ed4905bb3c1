"""The API's client, written once: ``AsyncClient`` in ``_async.py`` by hand, and ``Client`` in
``_sync.py`` generated from it by sdk/tools/generate_sync.py - the same calls, awaited or not. Each
call is a request of ``_calls``, sent with retries by the transport."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import httpx

from scorer_groups import _calls as calls
from scorer_groups._calls import Retry
from scorer_groups._transport_async import AsyncTransport
from scorer_groups.alignments import Alignment
from scorer_groups.api_models import (
    BACKFILL_ENDED,
    BackfillEstimate,
    BackfillJob,
    BudgetView,
    Change,
    Channel,
    GradeRequest,
    Incidents,
    JudgeCallRecord,
    JudgeTemplate,
    PlaygroundRating,
    Ratings,
    RatingWithCalls,
    ResultsPage,
    SessionScore,
)
from scorer_groups.backfills import BackfillBar, Deadline, When, backfill_body
from scorer_groups.evaluations_async import AsyncDatasets, AsyncEvaluations
from scorer_groups.models import Budget, CustomEvaluator, Judge, JudgeExample, Pattern, ScorerGroup, WireModel
from scorer_groups.review_queues import (
    AddedItems,
    ItemPage,
    ItemView,
    Labelled,
    LiveAgreement,
    ReviewProgress,
    ReviewQueue,
)
from scorer_groups.runs import Dataset

S = TypeVar("S", bound=WireModel)


class ScorerGroups:
    """``client.monitor.scorer_groups``: the spec's surface."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def list(self) -> builtins.list[ScorerGroup]:
        return await self._t.run(calls.list_groups())

    async def get(self, id: str) -> ScorerGroup:
        return await self._t.run(calls.get_group(id))

    async def create(
        self, name: str, members: Sequence[Any], description: str | None = None,
        online: Mapping[str, Any] | None = None, **extra: Any,
    ) -> ScorerGroup:
        """``extra``: ``project_id`` when an operator key creates (a project key needs none)."""
        return await self._t.run(calls.create_group(name, members, description, online, extra))

    async def update(self, id: str, *, if_match: str | None = None, **fields: Any) -> ScorerGroup:
        """Sparse: ``online`` merges key by key; ``online=None`` detaches live scoring."""
        return await self._t.run(calls.update_group(id, fields, if_match))

    async def delete(self, id: str, *, if_match: str | None = None) -> None:
        await self._t.run(calls.delete_group(id, if_match))

    async def ratings(self, id: str, window: str = "7d") -> Ratings:
        return await self._t.run(calls.group_ratings(id, window))

    async def results(self, id: str, *, limit: int = 50, cursor: str | None = None, below: bool = False) -> ResultsPage:
        """The group's latest results, newest first (one page; ``next_cursor`` reads the next)."""
        return await self._t.run(calls.group_results(id, limit, cursor, below))

    async def incidents(self, id: str, *, limit: int = 50, cursor: str | None = None) -> Incidents:
        """A page of the group's incidents (alertMode window or drift, alertNoScoreRate), open
        ones first, then the newest, with its learned level; ``next_cursor`` reads the next."""
        return await self._t.run(calls.group_incidents(id, limit, cursor))

    async def result(self, id: str, rating_id: str) -> RatingWithCalls:
        """One of the group's latest results by its rating id, with the judge calls behind it:
        the exact messages each judge was sent and what it answered (cut and masked)."""
        return await self._t.run(calls.group_result(id, rating_id))

    async def grade(
        self, id: str, input: str, output: str, expected: Any = None,
        spans: builtins.list[Any] | None = None, metadata: Mapping[str, Any] | None = None, *,
        agent_id: str | None = None, session_id: str | None = None, root_name: str | None = None,
    ) -> PlaygroundRating:
        """The playground: grade one example with the group's members now (nothing published;
        judge calls are reserved from the project's budget, RateLimited when it has no room).
        ``passes_filter`` says whether live scoring would see it (the group's ``online.filter``)."""
        # Keys as given (metadata and attributes are the user's); the server validates it.
        example = GradeRequest.model_construct(input=input, output=output, expected=expected, spans=spans or [],
                                               metadata=dict(metadata or {}), agent_id=agent_id,
                                               session_id=session_id, root_name=root_name)
        return await self._t.run(calls.grade_example(id, example))

    async def agreement(self, id: str) -> LiveAgreement:
        """The group's judges against people, over its labelled review items, as labels come in."""
        return await self._t.run(calls.group_agreement(id))

    async def changes(self, id: str) -> builtins.list[Change]:
        return await self._t.run(calls.group_changes(id))

    async def backfill(
        self, id: str, *, since: When, until: When | None = None, sample_rate: float | None = None,
        max_judge_calls: int | None = None, alerts: bool = False,
    ) -> AsyncBackfill:
        """Grade the group's traffic of ``[since, until)`` again, with its current version: the job,
        queued (``wait()`` follows it to its end). ``since`` and ``until`` are each an aware datetime,
        an ISO time with its zone, or a duration back from now ("90m", "24h", "7d"; ValueError
        otherwise); ``until`` defaults to now. ``sample_rate`` defaults to the group's online one
        (required for a group without one); ``max_judge_calls`` caps the job's judge calls;
        ``alerts`` raises Signals and deliveries for what it grades (none by default). What the
        group does not allow (a session-scope group) is a BadRequest naming the field."""
        body = backfill_body(since, until, sample_rate, max_judge_calls, alerts)
        return AsyncBackfill(self._t, await self._t.run(calls.start_backfill(id, body)))

    async def estimate_backfill(
        self, id: str, *, since: When, until: When | None = None, sample_rate: float | None = None,
        max_judge_calls: int | None = None,
    ) -> BackfillEstimate:
        """What ``backfill`` with the same arguments would grade and spend - the window's traces
        and pairs (with the pairs' 95% error), judge calls, tokens, cost - starting nothing and
        spending no judge call (the API's ``dryRun``)."""
        body = backfill_body(since, until, sample_rate, max_judge_calls)
        return await self._t.run(calls.estimate_backfill(id, body))

    async def backfills(self, id: str) -> builtins.list[BackfillJob]:
        """The group's backfill jobs, newest first (its last 50)."""
        return await self._t.run(calls.group_backfills(id))


class AsyncBackfill:
    """A backfill job: ``job``, the server's ``BackfillJob`` as last read, whose fields read on the
    handle too (``status``, ``progress.fraction``, ``resume_at``...), and the calls that follow it."""

    def __init__(self, transport: AsyncTransport, job: BackfillJob) -> None:
        self._t = transport
        self.job = job

    def __getattr__(self, name: str) -> Any:
        return getattr(self.job, name)

    @property
    def id(self) -> str:
        return self.job.id

    async def refresh(self) -> BackfillJob:
        """Read the job again: its status and progress now."""
        self.job = await self._t.run(calls.get_backfill(self.job.id))
        return self.job

    async def cancel(self) -> BackfillJob:
        """Cancel the job (the workers stop at their next batch); Conflict if it has ended."""
        self.job = await self._t.run(calls.cancel_backfill(self.job.id))
        return self.job

    async def wait(
        self, *, progress: bool | None = False, poll_s: float = 1.0, timeout_s: float | None = None,
    ) -> BackfillJob:
        """Read the job every ``poll_s`` seconds until it ends - done, failed or cancelled - and
        return it as it ended: a failed or cancelled job is returned, not raised (``status`` and
        ``error`` say what happened). ``progress`` draws its bar on stderr: the fraction read, the
        traces read, the pairs scored, and until when a paused job waits for its budget (None:
        only when stderr is a terminal). After ``timeout_s`` seconds, TimeoutError; the job goes on."""
        bar, deadline = BackfillBar(progress), Deadline(timeout_s)
        while True:
            job = await self.refresh()
            timed_out = deadline.passed()
            bar.draw(job, last=timed_out)
            if job.status in BACKFILL_ENDED:
                return job
            if timed_out:
                raise TimeoutError(f"backfill {job.id} is still {job.status} after {timeout_s} s; it goes on")
            await self._t.pause(deadline.nap(poll_s))


class Backfills:
    """``client.monitor.backfills``: a job by its id (``client.monitor.scorer_groups.backfill``
    starts one)."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def get(self, id: str) -> AsyncBackfill:
        return AsyncBackfill(self._t, await self._t.run(calls.get_backfill(id)))

    async def cancel(self, id: str) -> BackfillJob:
        """Cancel a job that has not ended; Conflict if it has."""
        return await self._t.run(calls.cancel_backfill(id))


class Sessions:
    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def scores(self, session_id: str) -> builtins.list[SessionScore]:
        return await self._t.run(calls.session_scores(session_id))


class Scorers(Generic[S]):
    """``client.monitor.judges`` / ``.patterns`` / ``.customs``: fields by snake_case or camelCase."""

    def __init__(self, transport: AsyncTransport, model: type[S]) -> None:
        self._t, self._model, self._path = transport, model, calls.SCORER_PATHS[model]

    async def list(self) -> builtins.list[S]:
        return await self._t.run(calls.list_docs(self._model, self._path))

    async def get(self, id: str) -> S:
        return await self._t.run(calls.get_doc(self._model, self._path, id))

    async def create(self, **fields: Any) -> S:
        return await self._t.run(calls.create_doc(self._model, self._path, fields))

    async def update(self, id: str, **fields: Any) -> S:
        """Changes the fields given; fails with PreconditionFailed if someone else changed the
        scorer between this call's read and its write."""
        response = await self._t.send(calls.get_doc(self._model, self._path, id))
        stored = self._model.model_validate_json(response.content)
        body, etag = calls.merged(stored, fields), response.headers.get("etag")
        return await self._t.run(calls.replace_doc(self._model, self._path, id, body, etag))

    async def delete(self, id: str) -> None:
        await self._t.run(calls.delete_doc(self._path, id))


class Judges(Scorers[Judge]):
    """``client.monitor.judges``: judges, and the graded examples their prompts show them."""

    def __init__(self, transport: AsyncTransport) -> None:
        super().__init__(transport, Judge)

    async def examples(self, id: str) -> builtins.list[JudgeExample]:
        return await self._t.run(calls.judge_examples(id))

    async def add_example(self, id: str, *, input: str | None = None, output: str | None = None,
                          rating: float | None = None, reason: str | None = None, from_item: str | None = None,
                          from_row: Mapping[str, Any] | None = None) -> JudgeExample:
        """An example written out (``input``, ``output``, ``rating``, ``reason``), or taken from a
        labelled review item (``from_item``) or a dataset row (``from_row``: dataset, row, version)."""
        body = {k: v for k, v in (("input", input), ("output", output), ("rating", rating), ("reason", reason),
                                  ("fromItem", from_item), ("fromRow", from_row)) if v is not None}
        return await self._t.run(calls.add_judge_example(id, body))

    async def delete_example(self, id: str, example_id: str) -> None:
        await self._t.run(calls.delete_judge_example(id, example_id))

    async def align(self, id: str, *, candidate: Mapping[str, Any], dataset: str | None = None,
                    queue: str | None = None, version: int | None = None) -> Alignment:
        """Start measuring ``candidate`` (``criteria``, ``examples``, ``model``) against the judge on
        the labels of ``dataset`` or ``queue`` it never saw; read it back with ``alignment``."""
        body = {k: v for k, v in (("candidate", dict(candidate)), ("dataset", dataset), ("queue", queue),
                                  ("version", version)) if v is not None}
        return await self._t.run(calls.start_alignment(id, body))

    async def alignment(self, id: str, alignment_id: str) -> Alignment:
        return await self._t.run(calls.get_alignment(id, alignment_id))

    async def alignments(self, id: str) -> builtins.list[Alignment]:
        return await self._t.run(calls.list_alignments(id))

    async def promote(self, id: str, alignment_id: str, *, force: bool = False) -> Judge:
        """Make the alignment run's candidate the judge (refused when it agreed worse, unless forced)."""
        return await self._t.run(calls.promote_judge(id, alignment_id, force))


class Budgets:
    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def list(self) -> builtins.list[Budget]:
        return await self._t.run(calls.list_docs(Budget, "budgets"))

    async def get(self, project_id: str) -> BudgetView:
        return await self._t.run(calls.get_doc(BudgetView, "budgets", project_id))

    async def set(
        self, project_id: str, judge_calls_per_window: int, window_seconds: int | None = None,
        judge_tokens_per_window: int | None = None,
    ) -> Budget:
        """Calls per window, and optionally tokens per window (each call reserves a ceiling of
        its tokens, settled to the usage its judge reports). An operator key sets the budget
        (``window_seconds`` unset: the stored window, else 3600); the project's own key may only
        lower it - its figures become the project's own caps, refused above the operators'."""
        call = calls.put_budget(project_id, judge_calls_per_window, window_seconds, judge_tokens_per_window)
        return await self._t.run(call)

    async def delete(self, project_id: str) -> None:
        await self._t.run(calls.delete_doc("budgets", project_id))


class Channels:
    """Alert channels; a secret goes in and is never read back (``has_secret`` says if one is set)."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def list(self) -> builtins.list[Channel]:
        return await self._t.run(calls.list_docs(Channel, "channels"))

    async def get(self, id: str) -> Channel:
        return await self._t.run(calls.get_doc(Channel, "channels", id))

    async def create(self, agent_id: str, url: str, secret: str | None = None, **extra: Any) -> Channel:
        return await self._t.run(calls.create_channel(agent_id, url, secret, extra))

    async def delete(self, id: str) -> None:
        await self._t.run(calls.delete_doc("channels", id))


class ReviewQueues:
    """``client.monitor.review_queues``: where people check the judges on live traffic. A
    reviewer key may ``list``, ``get``, take the ``next`` item and ``label`` it - nothing else."""

    def __init__(self, transport: AsyncTransport) -> None:
        self._t = transport

    async def list(self) -> builtins.list[ReviewQueue]:
        return await self._t.run(calls.list_queues())

    async def get(self, id: str) -> ReviewQueue:
        return await self._t.run(calls.get_queue(id))

    async def create(self, name: str, group_ids: Sequence[str], rule: Mapping[str, Any], **extra: Any) -> ReviewQueue:
        """``extra``: ``origins``, ``reviewers_per_item``, ``reservation_seconds``, ``capacity``,
        ``keep_days``, ``max_bytes``; ``project_id`` when an operator key creates."""
        return await self._t.run(calls.create_queue({"name": name, "group_ids": list(group_ids), "rule": rule,
                                                     **extra}))

    async def update(self, id: str, *, if_match: str | None = None, **fields: Any) -> ReviewQueue:
        return await self._t.run(calls.update_queue(id, fields, if_match))

    async def delete(self, id: str, *, if_match: str | None = None) -> None:
        await self._t.run(calls.delete_doc("review-queues", id, if_match))

    async def items(self, id: str, *, state: str = "open", limit: int = 50, cursor: str | None = None) -> ItemPage:
        """A page of items: open ones oldest first (``state="all"``: every item, newest first)."""
        return await self._t.run(calls.queue_items(id, state, limit, cursor))

    async def add(self, id: str, rating_ids: Sequence[str], *, group_id: str | None = None) -> AddedItems:
        """Put results in the queue by hand: rating ids among the latest results of one group it
        watches (``group_id``: implied when it watches one)."""
        return await self._t.run(calls.add_items(id, rating_ids, group_id))

    async def calls(self, item_id: str) -> builtins.list[JudgeCallRecord]:
        """The judge calls behind an item's result (while the group's latest results keep them)."""
        return await self._t.run(calls.item_calls(item_id))

    async def progress(self, id: str) -> ReviewProgress:
        """Where this key stands: open items now, items done, items it labelled."""
        return await self._t.run(calls.queue_progress(id))

    async def next(self, id: str) -> ItemView | None:
        """Reserve the next item for this key (or the one it holds); None when there is none."""
        return await self._t.run(calls.next_item(id))

    async def item(self, item_id: str) -> ItemView:
        return await self._t.run(calls.get_item(item_id))

    async def label(self, item_id: str, rating: float, *, members: Mapping[str, Any] | None = None,
                    comment: str | None = None) -> Labelled:
        """This key's label of an item it holds (or its label changed while the item is open):
        ``members`` by ref id, each ``{"agree": bool, "rating": 0-10?}``."""
        return await self._t.run(calls.label_item(item_id, rating, members, comment))

    async def export(self, id: str, *, name: str | None = None, dataset: str | None = None) -> Dataset:
        """A dataset (or a new version of ``dataset``) of the queue's labelled items, ready for
        ``grade``: ``humanRating`` is the reviewers' median."""
        body = {k: v for k, v in (("name", name), ("dataset", dataset)) if v is not None}
        return await self._t.run(calls.export_queue(id, body))


class Monitor:
    def __init__(self, transport: AsyncTransport) -> None:
        self.scorer_groups = ScorerGroups(transport)
        self.review_queues = ReviewQueues(transport)
        self.backfills = Backfills(transport)
        self.sessions = Sessions(transport)
        self.judges = Judges(transport)
        self.patterns: Scorers[Pattern] = Scorers(transport, Pattern)
        self.customs: Scorers[CustomEvaluator] = Scorers(transport, CustomEvaluator)
        self.budgets = Budgets(transport)
        self.channels = Channels(transport)
        self._t = transport

    async def judge_templates(self) -> builtins.list[JudgeTemplate]:
        """The shipped judge rubrics, each with what it reads and rows people labelled;
        ``judges.create(template=name, ...)`` starts a judge from one (fields given override it)."""
        return (await self._t.run(calls.judge_templates())).items


class AsyncClient:
    """The API's client, from its address and an API key: ``.monitor``, ``.datasets`` and
    ``.evaluations``. Use it as a context manager (``with Client(...)``, ``async with
    AsyncClient(...)``) or ``close()`` it, which also closes the httpx client it sends with."""

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 30.0, retry: Retry | None = None,
                 http: httpx.AsyncClient | None = None) -> None:
        self._transport = AsyncTransport(base_url, api_key, timeout_s=timeout_s, retry=retry or Retry(), http=http)
        self.monitor = Monitor(self._transport)
        self.datasets = AsyncDatasets(self._transport)
        self.evaluations = AsyncEvaluations(self._transport)

    async def close(self) -> None:
        await self._transport.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
