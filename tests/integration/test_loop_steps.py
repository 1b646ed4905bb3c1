"""The live loop's steps, each pinned on the real broker and Redis (``consumers/traces.py``).

``TraceConsumer`` runs in-process, as in ``test_loop_guarantees.py``, with what the test
controls: a panel whose members block until the test releases them or raise for a marked trace,
an events recorder (the ``PipelineEvents`` protocol), a turns recorder, claims whose polls the
test can hold (and whose releases can fail), and a producer whose sends to one topic it can hold.
Every wait is for a condition, with a deadline; no result depends on a sleep (one test holds the
loop past max.poll.interval.ms: there the length of the hold is what is tested).

The groups a test routes to: ``wait`` (a judge: scored pair by pair; no judge endpoint is
configured, so its member answers an error and the rating has no score), ``bulk`` (a pattern:
scored in bulk) and ``sess`` (session scope: only its turns are recorded here).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from structlog.testing import capture_logs

from adapters.stores import keys
from adapters.stores.claims import ClaimResult, Claims, VerdictLookup
from adapters.stores.ratings import RatingsStore
from consumers.outage import OutageGuard, OutageTooLong
from consumers.outputs import TopicNames
from consumers.traces import OutputError, TraceConsumer
from consumers.traces import TraceLoopLimits as limits
from scoring.blend import MemberOutcome, blend
from scoring.catalog import CatalogSnapshot
from scoring.claim_request import ClaimRequest
from scoring.models import Budget, Judge, Pattern, ScorerGroup
from scoring.panel import GroupResult, Panel
from scoring.subjects import Subject, Trace
from tests.support.sampling_reference import reference_keep
from tests.support.trace_loop import WAIT_S, Loop, trace, until

pytestmark = pytest.mark.integration

BLOCK = "[[block]]"  # an output carrying this makes its pairs wait for Controls.panel.release()

LIMITS = {f.name for f in dataclasses.fields(limits)}  # what the loop fixture passes as its limits


# --- what the test controls ---------------------------------------------------------------------


class Events:
    """Records every PipelineEvents call, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, tuple[Any, ...]]] = []

    def of(self, name: str) -> list[tuple[Any, ...]]:
        return [args for n, args in self.seen if n == name]

    def consumed(self, count: int) -> None: self.seen.append(("consumed", (count,)))
    def dead_lettered(self, reason: str) -> None: self.seen.append(("dead_lettered", (reason,)))
    def kept(self, project: str, group: str, count: int = 1) -> None:
        self.seen.append(("kept", (project, group, count)))
    def group_scored(self, project: str, group: str, scope: str, rating: float | None) -> None:
        self.seen.append(("group_scored", (project, group, scope)))
    def group_skipped(self, project: str, group: str, why: str, count: int = 1) -> None:
        self.seen.append(("group_skipped", (project, group, why)))
    def signal_raised(self, project: str, group: str, severity: str) -> None:
        self.seen.append(("signal_raised", (project, group, severity)))
    def in_flight(self, count: int) -> None: self.seen.append(("in_flight", (count,)))
    def committed(self, topic: str, partition: int, offset: int) -> None:
        self.seen.append(("committed", (topic, partition, offset)))
    def lag(self, topic: str, partition: int, lag: int) -> None: self.seen.append(("lag", (topic, partition, lag)))
    def latency(self, seconds: float) -> None: self.seen.append(("latency", (seconds,)))
    def rescored_after_pause(self, pairs: int) -> None: self.seen.append(("rescored_after_pause", (pairs,)))


class Turns:
    """A TurnRecorder (the session store's add_turns) that keeps the trace ids it was given."""

    def __init__(self) -> None:
        self.recorded: list[list[str]] = []

    async def add_turns(self, traces: list[Trace], now: float | None = None) -> None:
        self.recorded.append([t.trace_id for t in traces])


class ControlledPanel(Panel):
    """The real panel, with controls keyed on the subject's output:

    - ``[[block]]``: the pair waits until ``release()`` (alone or in bulk);
    - ``[[block:<group>]]``: only that group's pair waits;
    - ``[[break:<group>]]``: scoring that group's pair raises ValueError (alone and in bulk);
    - ``[[break-bulk]]``: scoring in bulk raises ValueError, scoring alone does not;
    - ``[[outage:<group>]]``: scoring that group's pair raises Redis's ConnectionError;
    - ``[[stall:<group>]]``: the first time that group's pair is scored, the whole process stands
      still for 1.5 s (the event loop blocked, as under SIGSTOP) and its member "times out".
    """

    def __init__(self) -> None:
        super().__init__(member_deadline_s=10)
        self.alone: list[tuple[str, str]] = []  # (group, trace) scored by score()
        self.batches: list[list[tuple[str, str]]] = []  # one list per score_many()
        self.entered: list[tuple[str, str]] = []  # pairs now waiting for release()
        self.released = asyncio.Event()
        self.stalled: set[tuple[str, str]] = set()

    def release(self) -> None:
        self.released.set()

    async def _control(self, group: ScorerGroup, subject: Subject, bulk: bool) -> None:
        out = subject.output
        if f"[[break:{group.id}]]" in out or (bulk and "[[break-bulk]]" in out):
            raise ValueError(f"scoring broke on {subject.trace_id}")
        if f"[[outage:{group.id}]]" in out:
            raise RedisConnectionError("redis went away while scoring")
        if BLOCK in out or f"[[block:{group.id}]]" in out:
            self.entered.append((group.id, str(subject.trace_id)))
            await self.released.wait()

    def _stall(self, group: ScorerGroup, subject: Subject, result: GroupResult) -> GroupResult:
        pair = (group.id, str(subject.trace_id))
        if f"[[stall:{group.id}]]" not in subject.output or pair in self.stalled:
            return result
        self.stalled.add(pair)
        time.sleep(1.5)  # the process stands still: nothing on the loop runs meanwhile
        member = group.members[0]
        timed_out = MemberOutcome(name=member.ref_id, kind=member.kind, weight=member.weight, gate=member.gate,
                                  ref_id=member.ref_id, error="timed out after 1s")
        return GroupResult(group, subject, blend([timed_out]))

    async def score(self, group: ScorerGroup, subject: Subject, scorers: Any, spend: Any = None,
                    verdicts: Any = None) -> GroupResult:
        self.alone.append((group.id, str(subject.trace_id)))
        await self._control(group, subject, bulk=False)
        return self._stall(group, subject, await super().score(group, subject, scorers))

    async def score_many(self, items: list[tuple[ScorerGroup, Subject]], scorers: Any) -> list[GroupResult]:
        self.batches.append([(g.id, str(s.trace_id)) for g, s in items])
        await asyncio.gather(*(self._control(g, s, bulk=True) for g, s in items))
        results = await super().score_many(items, scorers)
        return [self._stall(g, s, r) for (g, s), r in zip(items, results, strict=True)]

    def scored(self, trace_id: str) -> int:
        """How many times any group scored the trace, alone or in bulk."""
        return (sum(1 for _, t in self.alone if t == trace_id)
                + sum(1 for batch in self.batches for _, t in batch if t == trace_id))


class HeldClaims(Claims):
    """The real claims in Redis; counts ``claim_many`` calls per subject and can hold them, and
    keeps the subjects whose leases were given up."""

    def __init__(self, redis: Redis, lease_s: float = 90) -> None:
        super().__init__(redis, lease_s=lease_s)
        self.calls: list[list[str]] = []
        self.confirms: list[list[str]] = []  # subject keys of each confirm call
        self.released: list[str] = []  # subject keys given up (or tried to)
        self.release_fails = False
        self.open = asyncio.Event()
        self.open.set()

    async def claim_many(self, requests: list[ClaimRequest], now: float | None = None,
                         lookups: Sequence[VerdictLookup] | None = None,
                         verdict_buckets: Sequence[int] = ()) -> list[ClaimResult]:
        await self.open.wait()
        self.calls.append([r.subject_key for r in requests])
        return await super().claim_many(requests, now, lookups, verdict_buckets)

    async def confirm(self, requests: list[ClaimRequest]) -> list[bool]:
        self.confirms.append([r.subject_key for r in requests])
        return await super().confirm(requests)

    async def release(self, requests: list[ClaimRequest]) -> None:
        self.released.extend(r.subject_key for r in requests)
        if self.release_fails:
            raise RedisConnectionError("redis went away while giving up leases")
        await super().release(requests)

    def claims_of(self, trace_id: str) -> int:
        return sum(call.count(f"trace:{trace_id}") for call in self.calls)


class HeldProducer(AIOKafkaProducer):  # type: ignore[misc]
    """The real producer; plain sends to ``held_topic`` wait while ``held`` is clear (outputs
    use plain sends below ``BULK_RECORDS`` records per partition: every test here)."""

    def __init__(self, **config: Any) -> None:
        super().__init__(**config)
        self.held_topic = ""
        self.held = asyncio.Event()
        self.held.set()
        self.waiting = 0

    async def send(self, topic: str, *args: Any, **kwargs: Any) -> Any:
        if topic == self.held_topic and not self.held.is_set():
            self.waiting += 1
            await self.held.wait()
        return await super().send(topic, *args, **kwargs)


class BrokenBudgets(CatalogSnapshot):
    """A catalog whose budget lookup raises for projects ending in ``-broken``: routing breaks."""

    def budget(self, project_id: str) -> Budget | None:
        if project_id.endswith("-broken"):
            raise RuntimeError("x" * 400)
        return super().budget(project_id)


def group(kind: str, project: str, sample_rate: float = 1.0) -> ScorerGroup:
    member = {"wait": {"kind": "judge", "refId": "j"}, "bulk": {"kind": "pattern", "refId": "p"},
              "sess": {"kind": "pattern", "refId": "p"}, "expect": {"kind": "judge", "refId": "jx"}}[kind]
    return ScorerGroup.model_validate({
        "id": kind, "name": kind.title(), "projectId": project,
        "online": {"enabled": True, "sampleRate": sample_rate, "alertThreshold": None, "severity": "low",
                   "scope": "session" if kind == "sess" else "trace"},
        "members": [member | {"weight": 1, "gate": False}]})


def catalog(live: dict[str, tuple[str, ...]], budgets: list[Budget] = (), sample_rate: float = 1.0,  # type: ignore[assignment]
            kind: type[CatalogSnapshot] = CatalogSnapshot) -> CatalogSnapshot:
    groups = {f"{project}/{g}": group(g, project, sample_rate) for project, gs in live.items() for g in gs}
    return kind(version=1, groups=groups,
                judges={"j": Judge(id="j", name="J", criteria="Is it right?"),
                        "jx": Judge(id="jx", name="JX", criteria="Is it the expected answer?", requires_expected=True)},
                patterns={"p": Pattern(id="p", name="P", polarity="failure", contains=["refund"])},
                budgets={b.project_id: b for b in budgets})


@dataclass
class Controls:
    """What these tests control the loop with (the shared ``Loop`` carries it)."""

    panel: ControlledPanel
    claims: HeldClaims
    events: Events


async def run_until_the_rating_of_t0_is_held(loop: Loop) -> None:
    """Send t-0 and run the loop until its rating waits on its way to the broker; stop the loop."""
    loop.producer.held_topic = loop.topics.ratings
    loop.producer.held.clear()
    await loop.send("t-0")
    await loop.start()
    await until(lambda: loop.producer.waiting == 1, "t-0's rating to be held on its way out")
    await loop.halt()


async def drain_letting_held_sends_go_once_it_cancels(loop: Loop, logs: list[dict[str, Any]]) -> None:
    """Drain with a 1 s deadline; once it has cancelled the jobs past it, let held sends go."""
    draining = asyncio.create_task(loop.traces.drain(1))
    await until(lambda: logged(logs, "cancelling traces that did not finish in time") != [], "a job cancelled")
    loop.producer.held.set()
    await asyncio.wait_for(draining, WAIT_S)
    loop.stop = None  # drained


@pytest.fixture
def logs() -> Iterator[list[dict[str, Any]]]:
    """What the loop logs (structlog), as dicts: operators read these lines."""
    with capture_logs() as captured:
        yield captured


def logged(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == event]


@pytest.fixture
async def loops(kafka_bootstrap: str, redis: Redis, unique: str) -> AsyncIterator[Callable[..., Awaitable[Loop]]]:
    made: list[Loop] = []

    async def make(live: tuple[str, ...] = ("bulk",), *, snapshot: CatalogSnapshot | None = None,
                   commit_interval_s: float = 0.05, partitions: int = 1,
                   ratings_config: dict[str, str] | None = None, consumer_config: dict[str, Any] | None = None,
                   lease_s: float = 90, finish_linger_s: float = 0.005, **kw: Any) -> Loop:
        suffix = f"{unique}-{len(made)}"
        topics = TopicNames(traces=f"ls-traces-{suffix}", ratings=f"ls-ratings-{suffix}",
                            signals=f"ls-signals-{suffix}", webhooks=f"ls-webhooks-{suffix}", dlq=f"ls-dlq-{suffix}")
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([
                NewTopic(t, num_partitions=partitions if t == topics.traces else 1, replication_factor=1,
                         topic_configs=(ratings_config or {}) if t == topics.ratings else {})
                for t in (topics.traces, topics.ratings, topics.signals, topics.webhooks, topics.dlq)])
        finally:
            await admin.close()
        producer = HeldProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True)
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=f"ls-{suffix}",
                                    enable_auto_commit=False, auto_offset_reset="earliest", **(consumer_config or {}))
        project = f"p-{unique}"
        snap = snapshot or catalog({project: live})
        panel = ControlledPanel()
        claims = HeldClaims(redis, lease_s=lease_s)
        events = Events()
        traces = TraceConsumer(consumer=consumer, producer=producer, topics=topics, catalog=lambda: snap,
                               panel=panel, claims=claims, ratings=RatingsStore(redis), events=events,
                               limits=limits(commit_interval_s=commit_interval_s, finish_linger_s=finish_linger_s,
                                             **{k: kw.pop(k) for k in list(kw) if k in LIMITS}), **kw)
        # Before the loop runs: not assigned yet, and the heartbeats (read by /readyz) are times.
        assert traces.assigned_once is False and traces.fatal is None and traces.outage is None
        assert isinstance(traces.last_progress, float) and isinstance(traces.last_commit_advance, float)
        await producer.start()
        consumer.subscribe([topics.traces], listener=traces.rebalance_listener())
        loop = Loop(traces, consumer, producer, redis, project, topics, TopicPartition(topics.traces, 0),
                    kafka_bootstrap, controls=Controls(panel, claims, events), group_id=f"ls-{suffix}")
        made.append(loop)
        return loop

    yield make
    for loop in made:
        loop.controls.panel.release()
        loop.controls.claims.open.set()
        loop.producer.held.set()
        await loop.close(drain_s=2)


# --- decode and route ---------------------------------------------------------------------------


async def test_malformed_and_unroutable_records_are_dead_lettered_with_their_reason_and_the_loop_commits_past_them(
        loops: Callable[..., Awaitable[Loop]], unique: str, logs: list[dict[str, Any]]) -> None:
    project = f"p-{unique}"
    broken = f"{project}-broken"
    loop = await loops(snapshot=catalog({project: ("bulk",), broken: ("bulk",)}, kind=BrokenBudgets))
    await loop.send_raw(b"not json {", b"k-0")  # offset 0: does not decode
    await loop.send("t-1")  # offset 1
    await loop.send_raw(trace(broken, "t-2", "fine"), None)  # offset 2: its routing raises
    await loop.send("t-3")  # offset 3
    await loop.start()
    await loop.committed_to(4)

    dead = await loop.dead()
    assert [(key, letter["reason"], letter["offset"]) for key, letter in dead] == [
        (b"k-0", "not_json", 0), (None, "unprocessable", 2)]
    routing = dead[1][1]
    assert routing["error"] == "routing failed: RuntimeError: " + "x" * 300, "the reason, its message cut at 300"
    assert routing["key"] is None and orjson.loads(routing["value"])["traceId"] == "t-2"
    assert (routing["topic"], routing["partition"]) == (loop.topics.traces, 0)
    assert await loop.ratings() == [("bulk", "t-1"), ("bulk", "t-3")], "the others are scored"
    assert loop.controls.events.of("dead_lettered") == [("not_json",), ("unprocessable",)]
    assert sum(c for (c,) in loop.controls.events.of("consumed")) == 4
    assert sum(c for p, g, c in loop.controls.events.of("kept") if (p, g) == (project, "bulk")) == 2
    assert not [k for k in loop.controls.events.of("kept") if k[0] == broken]
    assert (loop.topics.traces, 0, 4) in loop.controls.events.of("committed")
    assert loop.traces.outage is None and loop.traces.fatal is None
    where = {"topic": loop.topics.traces, "partition": 0}
    assert logged(logs, "dead-lettered a record") == [
        {"event": "dead-lettered a record", "log_level": "warning", "loop": "traces", "reason": "not_json",
         "error": dead[0][1]["error"], "offset": 0} | where,
        {"event": "dead-lettered a record", "log_level": "warning", "loop": "traces", "reason": "unprocessable",
         "error": routing["error"][:300], "offset": 2} | where]
    assert logged(logs, "a trace broke a step; dead-lettered") == [
        {"event": "a trace broke a step; dead-lettered", "log_level": "warning", "step": "routing",
         "error": repr(RuntimeError("x" * 400))[:300], "offset": 2} | where]


async def test_a_record_over_max_trace_bytes_is_dead_lettered_as_too_large(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(max_trace_bytes=400)
    await loop.send("t-0", "big " * 200)
    await loop.send("t-1", "small")
    await loop.start()
    await loop.committed_to(2)
    dead = await loop.dead()
    assert [(letter["reason"], letter["offset"]) for _, letter in dead] == [("too_large", 0)]
    assert await loop.ratings() == [("bulk", "t-1")]


async def test_kept_traces_are_counted_per_project_and_group_once_per_batch(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("bulk", "wait"))
    for i in range(3):
        await loop.send(f"t-{i}")
    await loop.start()
    await loop.committed_to(3)
    kept = loop.controls.events.of("kept")
    assert sum(c for _, g, c in kept if g == "bulk") == 3 and sum(c for _, g, c in kept if g == "wait") == 3
    assert {p for p, _, _ in kept} == {loop.project}
    assert len(kept) < 6, "counted per batch, not reported once per pair"
    assert await loop.ratings() == sorted([(g, f"t-{i}") for g in ("bulk", "wait") for i in range(3)])
    latencies = [s for (s,) in loop.controls.events.of("latency")]
    assert len(latencies) == 3 and all(0 <= s < WAIT_S for s in latencies), "one latency per trace, with its last pair"
    assert sorted(loop.controls.panel.alone) == [("wait", f"t-{i}") for i in range(3)], "a judge's pairs are scored alone"
    assert {g for batch in loop.controls.panel.batches for g, _ in batch} == {"bulk"}, "a pattern's pairs in bulk"
    assert await loop.controls.claims.budget_used(loop.project, 3600) == 3, "without a budget, calls are counted by the hour"


async def test_every_record_is_counted_in_its_projects_traffic_index_parsed_or_not(
        loops: Callable[..., Awaitable[Loop]], unique: str) -> None:
    """What a backfill's estimate scales by: each project's records by hour, counted as read -
    parsed ones by their trace's project, ones finished unparsed by their routing header's (the
    first of two such headers, or one without a value, never breaks the loop) - and only the
    projects with groups: a name no catalog holds costs no Redis."""
    project, other = f"p-{unique}", f"p-{unique}-other"
    snapshot = catalog({project: ("bulk",)}).with_docs([ScorerGroup.model_validate({  # live for no trace of it
        "id": "g-other", "name": "Off", "projectId": other, "members": [{"kind": "pattern", "refId": "p"}],
        "online": {"enabled": False, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}})])
    loop = await loops(("bulk",), snapshot=snapshot)
    assert loop.project == project
    for i in range(3):
        await loop.send(f"t-{i}")
    for i in range(2):  # routing headers of a project no live group wants: finished unparsed
        await loop.producer.send_and_wait(
            loop.topics.traces, key=f"h-{i}".encode(), value=trace(other, f"h-{i}", "x"), partition=0,
            headers=[("sgw-project", None if i else b"nobody"), ("sgw-project", other.encode()), ("sgw-agent", b"a"),
                     ("sgw-trace", f"h-{i}".encode())])
    await loop.send("stranger", project=f"p-{unique}-unknown")  # no group of its project anywhere
    await loop.start()
    await loop.committed_to(6)
    await loop.traces.tick()
    hour = int(time.time() * 1000) // 3_600_000 * 3_600_000  # the records' own hour, whole
    ratings = RatingsStore(loop.redis)
    assert await ratings.traffic(loop.project, hour, hour + 3_600_000) == 3
    assert await ratings.traffic(other, hour, hour + 3_600_000) == 2
    assert await ratings.traffic(other, hour + 1_800_000, hour + 3_600_000) == 1, "half an hour: half its count"
    assert await ratings.traffic(other, hour - 3_600_000, hour) == 0, "not in another hour"
    assert not await loop.redis.exists(keys.traffic(f"p-{unique}-unknown")) and \
        not await loop.redis.exists(keys.traffic("nobody")), "no index for a project without groups"


async def test_a_group_that_samples_nothing_claims_nothing_and_the_trace_is_finished(
        loops: Callable[..., Awaitable[Loop]], unique: str) -> None:
    project, other = f"p-{unique}", f"p-{unique}-all"
    snapshot = CatalogSnapshot(version=1, groups={
        "a": group("bulk", project, sample_rate=0.0), "b": group("wait", project, sample_rate=1.0),
        "c": group("bulk", other, sample_rate=1.0)}, judges={"j": Judge(id="j", name="J", criteria="Right?")},
        patterns={"p": Pattern(id="p", name="P", polarity="failure", contains=["refund"])})
    loop = await loops(snapshot=snapshot)
    await loop.send("t-0")  # bulk samples nothing; wait keeps all
    await loop.send("t-1", project=f"p-{unique}-none")  # a project without live groups
    await loop.send("t-2", project=other)
    await loop.start()
    await loop.committed_to(3)
    assert await loop.state("bulk", "t-0") == "" and ("bulk", "t-0") not in loop.controls.panel.alone
    values = [orjson.loads(r.value) for r in await loop.read(loop.topics.ratings)]
    assert sorted((v["projectId"], v["groupId"], v["traceId"]) for v in values) == [
        (project, "wait", "t-0"), (other, "bulk", "t-2")]


async def test_a_group_sampling_half_keeps_the_traces_its_stable_sample_picks(
        loops: Callable[..., Awaitable[Loop]], unique: str) -> None:
    loop = await loops(snapshot=catalog({f"p-{unique}": ("bulk",)}, sample_rate=0.5))
    ids = [f"t-{i}" for i in range(12)]
    picked = [t for t in ids if reference_keep(t, 0.5)]
    assert 0 < len(picked) < len(ids)
    for t in ids:
        await loop.send(t)
    await loop.start()
    await loop.committed_to(len(ids))
    assert await loop.ratings() == sorted(("bulk", t) for t in picked)


async def test_a_judge_that_needs_an_expected_answer_the_trace_lacks_reserves_no_budget(
        loops: Callable[..., Awaitable[Loop]], unique: str) -> None:
    project = f"p-{unique}"
    loop = await loops(snapshot=catalog({project: ("expect",)}, [Budget(project_id=project, judge_calls_per_window=0)]))
    await loop.send("t-0")  # no expected answer: the judge will not be called, nothing to reserve
    await loop.send("t-1", expected="42")  # its judge call would be over the budget
    await loop.start()
    await loop.committed_to(2)
    assert await loop.ratings() == [("expect", "t-0")]
    assert loop.controls.events.of("group_skipped") == [(project, "expect", "budget")]


async def test_pairs_scored_alone_that_finish_together_confirm_their_leases_in_one_call(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    # A judge pair held past half its lease is confirmed before it publishes: those finishing
    # together share a script call (one round trip), as their done marks and history do.
    loop = await loops(("wait",), lease_s=1.0)
    for i in range(6):
        await loop.send(f"t-{i}", BLOCK)
    await loop.start()
    await until(lambda: len(loop.controls.panel.entered) == 6, "six judge pairs in scoring")
    await asyncio.sleep(0.6)
    loop.controls.panel.release()
    await loop.committed_to(6)
    confirmed = [key for call in loop.controls.claims.confirms for key in call]
    assert sorted(confirmed) == sorted(f"trace:t-{i}" for i in range(6)), "every pair confirmed once"
    assert len(loop.controls.claims.confirms) < 6, loop.controls.claims.confirms


@pytest.mark.parametrize("group_id", ["bulk", "wait"])
async def test_pairs_finished_within_half_their_lease_publish_without_asking_redis(
        loops: Callable[..., Awaitable[Loop]], group_id: str) -> None:
    # A lease expires only with time: one taken less than half its length ago has not, so pairs
    # that finish that soon skip the confirmation round trip; a pair that took longer asks (and
    # only it).
    loop = await loops((group_id,), lease_s=1.0)
    await loop.send("t-0")
    await loop.start()
    await loop.committed_to(1)
    assert loop.controls.claims.confirms == [], "a fresh lease is not confirmed"
    await loop.send("t-1", BLOCK)
    await until(lambda: (group_id, "t-1") in loop.controls.panel.entered, "t-1 to be in scoring")
    await asyncio.sleep(0.6)
    loop.controls.panel.release()
    await loop.committed_to(2)
    assert loop.controls.claims.confirms == [["trace:t-1"]], "an older one is"
    assert await loop.ratings() == [(group_id, "t-0"), (group_id, "t-1")]


async def test_done_marks_of_pairs_finishing_apart_share_a_call_within_the_linger(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    # Only the offset commit waits for done marks and history: pairs finishing apart still share
    # one write when the linger is longer than the time between them.
    loop = await loops(("wait",), finish_linger_s=3.0)
    writes: list[int] = []
    write = loop.traces.pairs._finish

    async def counted(items: list[Any]) -> None:
        writes.append(len(items))
        await write(items)

    loop.traces.pairs.finisher._flush = counted  # type: ignore[assignment]
    await loop.send("t-0")
    await loop.start()

    async def published() -> bool:
        return ("wait", "t-0") in await loop.ratings()

    await until(published, "t-0 to be published")
    assert writes == [], "its done mark waits for company"
    await loop.send("t-1")
    await loop.committed_to(2)
    assert writes == [2], writes


@pytest.mark.parametrize("group_id", ["wait", "bulk"])
async def test_a_member_failed_while_the_process_stood_still_is_scored_again_not_published(
        loops: Callable[..., Awaitable[Loop]], group_id: str) -> None:
    # "A pause is not a timeout": the process stands still while the pair is scored and its
    # member times out - on the clock, not on the judge. The pair is handed back, claimed again
    # and scored afresh; only that verdict is published.
    loop = await loops((group_id,))
    await loop.send("t-0", f"[[stall:{group_id}]]")
    await loop.start()
    await loop.committed_to(1)
    ratings = [orjson.loads(r.value) for r in await loop.read(loop.topics.ratings)]
    fresh = {"wait": None, "bulk": 10.0}[group_id]  # no judge endpoint here: the judge fails, quickly
    assert [(r["groupId"], r["rating"]) for r in ratings] == [(group_id, fresh)], "one rating: the fresh one"
    assert "timed out" not in orjson.dumps(ratings).decode()
    assert loop.controls.panel.scored("t-0") == 2
    assert loop.controls.events.of("rescored_after_pause") == [(1,)]
    assert "trace:t-0" in loop.controls.claims.released, "handed back before it was claimed again"


async def test_a_member_that_failed_without_a_pause_is_published_as_it_is(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    # The judge fails at once (no endpoint is configured here): a verdict about the pair, published.
    loop = await loops(("wait",))
    await loop.send("t-0")
    await loop.start()
    await loop.committed_to(1)
    assert loop.controls.panel.scored("t-0") == 1
    assert loop.controls.events.of("rescored_after_pause") == []
    (rating,) = [orjson.loads(r.value) for r in await loop.read(loop.topics.ratings)]
    assert rating["members"][0]["status"] == "failed"


async def test_a_fetch_takes_no_more_records_than_the_room_left(loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("wait",), max_in_flight=2)
    for i in range(3):
        await loop.send(f"t-{i}", BLOCK)
    await loop.start()  # the three are fetchable at once
    await until(lambda: len(loop.controls.panel.entered) == 2, "two traces in flight")
    await until(lambda: loop.consumer.paused() == {loop.tp}, "the partition to be paused")
    await loop.steps(3)
    assert sorted(t for _, t in loop.controls.panel.entered) == ["t-0", "t-1"] and await loop.state("wait", "t-2") == ""
    loop.controls.panel.release()
    await loop.committed_to(3)


async def test_a_fetch_takes_at_most_half_the_room_so_that_batches_overlap(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    # While one batch waits (the sandbox, the broker, Redis), the next is decoded and scored: a
    # batch the size of the whole room would leave the loop idle through each wait.
    loop = await loops(("wait",), max_in_flight=9)
    for i in range(10):
        await loop.send(f"t-{i}", BLOCK)
    await loop.start()  # the ten are fetchable at once
    await until(lambda: len(loop.controls.panel.entered) == 9, "nine traces in flight")
    await until(lambda: loop.consumer.paused() == {loop.tp}, "the partition to be paused")
    await loop.steps(2)
    batches = [c for (c,) in loop.controls.events.of("consumed")]
    assert sum(batches) == 9 and max(batches) == 4, "batches of at most 9 // 2, the last one what the room left"
    assert await loop.state("wait", "t-9") == ""
    loop.controls.panel.release()
    await loop.committed_to(10)


async def test_a_fetch_takes_at_most_1000_records(loops: Callable[..., Awaitable[Loop]], unique: str) -> None:
    loop = await loops(max_in_flight=5000)
    value = trace(f"p-{unique}-none", "t", "fine")  # a project without groups: decoded, then finished
    acks = [await loop.producer.send(loop.topics.traces, value=value, partition=0) for _ in range(1001)]
    await asyncio.gather(*acks)
    await loop.start()
    await loop.committed_to(1001)
    batches = [c for (c,) in loop.controls.events.of("consumed")]
    assert sum(batches) == 1001 and max(batches) <= 1000


async def test_session_scope_groups_record_turns_and_do_not_score_a_single_trace(
        loops: Callable[..., Awaitable[Loop]], unique: str) -> None:
    project = f"p-{unique}"
    plain = f"{project}-plain"  # a project without session groups
    turns = Turns()
    loop = await loops(snapshot=catalog({project: ("sess", "bulk"), plain: ("bulk",)}), turns=turns)
    await loop.send("t-0", session="s-0")
    await loop.send("t-1")  # no session
    await loop.send("t-2", session="s-2", project=plain)
    await loop.start()
    await loop.committed_to(3)
    assert [t for batch in turns.recorded for t in batch] == ["t-0"], "only a session trace of a project with one"
    assert await loop.state("sess", "t-0") == "", "a session group never claims a single trace"
    assert [g for g, _ in loop.controls.panel.alone] + [g for b in loop.controls.panel.batches for g, _ in b] == ["bulk"] * 3
    values = [orjson.loads(r.value) for r in await loop.read(loop.topics.ratings)]
    assert sorted((v["groupId"], v["traceId"]) for v in values) == [("bulk", "t-0"), ("bulk", "t-1"), ("bulk", "t-2")]


# --- claim --------------------------------------------------------------------------------------


async def test_an_exhausted_budget_skips_the_group_and_the_trace_is_finished(
        loops: Callable[..., Awaitable[Loop]], unique: str, logs: list[dict[str, Any]]) -> None:
    project = f"p-{unique}"
    loop = await loops(snapshot=catalog({project: ("wait",)}, [Budget(project_id=project, judge_calls_per_window=0)]))
    history = RatingsStore(loop.redis)
    before = (await history.history("wait", "1h")).skipped  # group ids are shared: this trace's own increase
    await loop.send("t-0")
    await loop.start()
    await loop.committed_to(1)
    assert loop.controls.events.of("group_skipped") == [(project, "wait", "budget")]
    assert await loop.state("wait", "t-0") == "skipped:budget"
    assert (await history.history("wait", "1h")).skipped == before + 1, "the ratings history shows the skip"
    assert loop.controls.panel.scored("t-0") == 0 and await loop.ratings() == []
    assert loop.controls.events.of("latency") == [], "no pair was started"
    assert logged(logs, "judge budget exhausted; group skipped") == [
        {"event": "judge budget exhausted; group skipped", "log_level": "warning", "project": project,
         "group": "wait", "trace": "t-0", "used": "0"}]


async def test_a_budgeted_group_reserves_its_judge_calls_in_the_project_budget_window(
        loops: Callable[..., Awaitable[Loop]], unique: str) -> None:
    project = f"p-{unique}"
    budget = Budget(project_id=project, judge_calls_per_window=2, window_seconds=600)
    loop = await loops(snapshot=catalog({project: ("wait",)}, [budget]))
    for i in range(3):
        await loop.send(f"t-{i}")
    await loop.start()
    await loop.committed_to(3)
    assert await loop.controls.claims.budget_used(project, 600) == 2, "two calls reserved in the 600 s window"
    assert loop.controls.events.of("group_skipped") == [(project, "wait", "budget")], "the third is over the limit"
    assert await loop.ratings() == [("wait", "t-0"), ("wait", "t-1")]


async def test_a_redelivered_done_pair_is_skipped_as_a_dedupe(loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("bulk",))
    await loop.start()
    await loop.send("t-0")
    await loop.committed_to(1)
    assert (await loop.state("bulk", "t-0")).startswith("done:")
    await loop.send("t-0")
    await loop.committed_to(2)
    assert loop.controls.events.of("group_skipped") == [(loop.project, "bulk", "dedupe")]
    assert loop.controls.panel.scored("t-0") == 1 and await loop.ratings() == [("bulk", "t-0")]


async def test_a_pair_another_worker_holds_is_polled_and_not_scored_while_its_lease_lives(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("bulk",))
    other = Claims(loop.redis, owner="another-worker", lease_s=90)
    assert [c.state for c in await other.claim_many([loop.request("bulk", "t-0")])] == ["claimed"]
    await loop.send("t-0")
    await loop.start()
    await until(lambda: loop.controls.claims.claims_of("t-0") >= 3, "the held pair to be polled twice")
    assert loop.controls.panel.scored("t-0") == 0, "not scored while the other worker's lease lives"
    assert await loop.committed() is None or await loop.committed() == 0
    await other.mark_done([(loop.request("bulk", "t-0"), "rating-elsewhere")])
    await loop.committed_to(1)
    assert loop.controls.panel.scored("t-0") == 0 and await loop.ratings() == []
    assert loop.controls.events.of("group_skipped") == [(loop.project, "bulk", "dedupe")]
    assert await loop.state("bulk", "t-0") == "done:rating-elsewhere"


async def test_a_pair_whose_other_lease_lapses_is_taken_over_and_scored(loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("bulk",))
    other = Claims(loop.redis, owner="another-worker", lease_s=90)
    await other.claim_many([loop.request("bulk", "t-0")])
    await loop.send("t-0")
    await loop.start()
    await until(lambda: loop.controls.claims.claims_of("t-0") >= 2, "the held pair to be polled")
    await other.release([loop.request("bulk", "t-0")])  # as if its lease had lapsed
    await loop.committed_to(1)
    assert loop.controls.panel.alone == [("bulk", "t-0")], "scored once, alone, once the pair was free"
    assert await loop.ratings() == [("bulk", "t-0")]
    assert (await loop.state("bulk", "t-0")).startswith("done:")
    assert loop.controls.events.of("group_skipped") == []


async def test_a_held_pair_whose_budget_runs_out_meanwhile_is_skipped_for_budget(
        loops: Callable[..., Awaitable[Loop]], unique: str) -> None:
    project = f"p-{unique}"
    loop = await loops(snapshot=catalog({project: ("wait",)}, [Budget(project_id=project, judge_calls_per_window=1)]))
    other = Claims(loop.redis, owner="another-worker", lease_s=90)
    held = loop.request("wait", "t-0", judge_calls=1, calls_cap=1)
    assert [c.state for c in await other.claim_many([held])] == ["claimed"], "the other worker spent the budget"
    await loop.send("t-0")
    await loop.start()
    await until(lambda: loop.controls.claims.claims_of("t-0") >= 2, "the held pair to be polled")
    await other.release([held])  # it gave up; the budget stays spent
    await loop.committed_to(1)
    assert loop.controls.events.of("group_skipped") == [(project, "wait", "budget")]
    assert loop.controls.panel.scored("t-0") == 0 and await loop.ratings() == []


async def test_a_held_pair_found_skipped_at_a_poll_is_not_scored(loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("wait",))
    other = Claims(loop.redis, owner="another-worker", lease_s=90)
    await other.claim_many([loop.request("wait", "t-0", judge_calls=1)])
    await loop.send("t-0")
    await loop.start()
    await until(lambda: loop.controls.claims.claims_of("t-0") >= 2, "the held pair to be polled")
    loop.controls.claims.open.clear()  # hold the loop's next poll while the pair changes hands
    await other.release([loop.request("wait", "t-0")])
    third = Claims(loop.redis, owner="third-worker")
    assert [c.state for c in await third.claim_many([loop.request("wait", "t-0", judge_calls=1, calls_cap=0)])] \
        == ["exhausted"], "a third worker found no budget: the pair is skipped"
    loop.controls.claims.open.set()
    await loop.committed_to(1)
    assert loop.controls.events.of("group_skipped") == [(loop.project, "wait", "dedupe")]
    assert loop.controls.panel.scored("t-0") == 0 and await loop.ratings() == []


# --- room: pause and resume ---------------------------------------------------------------------


async def test_partitions_are_paused_while_max_in_flight_traces_are_in_flight_and_resumed_after(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("wait",), max_in_flight=2)
    await loop.start()
    await loop.send("t-0", BLOCK)
    await loop.send("t-1", BLOCK)
    await until(lambda: len(loop.controls.panel.entered) == 2, "two traces in flight")
    await loop.send("t-2")
    await until(lambda: loop.consumer.paused() == {loop.tp}, "the partition to be paused")
    await loop.steps(3)
    assert await loop.state("wait", "t-2") == "", "no third trace is taken while two are in flight"
    assert loop.consumer.paused() == {loop.tp}
    assert max(c for (c,) in loop.controls.events.of("in_flight")) == 2

    loop.controls.panel.release()
    await loop.committed_to(3)
    assert loop.consumer.paused() == set(), "resumed once there is room"
    assert await loop.ratings() == [("wait", "t-0"), ("wait", "t-1"), ("wait", "t-2")]


async def test_a_trace_in_flight_below_max_in_flight_leaves_room_for_the_next(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("wait",), max_in_flight=2)
    await loop.start()
    await loop.send("t-0", BLOCK)
    await until(lambda: loop.controls.panel.entered == [("wait", "t-0")], "t-0 in flight")
    await loop.send("t-1")
    await until(lambda: len(loop.controls.events.of("latency")) == 1, "t-1 to be finished while t-0 is in flight")
    # Fetching t-1 filled the room (2 of 2) and paused; its end makes room again.
    await until(lambda: loop.consumer.paused() == set(), "the partition to be resumed while t-0 is in flight")
    assert not loop.controls.panel.released.is_set()
    loop.controls.panel.release()
    await loop.committed_to(2)


async def test_a_paused_loop_keeps_polling_so_the_consumer_stays_in_its_group(
        loops: Callable[..., Awaitable[Loop]], logs: list[dict[str, Any]]) -> None:
    # The room is full for two and a half times max.poll.interval.ms: a consumer that stopped
    # calling getmany meanwhile would leave its group and have its partitions (and work) revoked.
    loop = await loops(("wait",), max_in_flight=1, consumer_config={"max_poll_interval_ms": 2000},
                       max_poll_interval_s=2.0)
    await loop.send("t-0", BLOCK)
    await loop.start()
    await until(lambda: loop.controls.panel.entered == [("wait", "t-0")], "t-0 in flight")
    await until(lambda: loop.consumer.paused() == {loop.tp}, "the partition to be paused")
    await asyncio.sleep(5)  # the one sleep of this module: holding past max.poll.interval.ms is the point
    loop.controls.panel.release()
    await loop.committed_to(1)
    revoked = [entry["partitions"] for entry in logged(logs, "partitions revoked") if entry["partitions"]]
    assert revoked == [], "the consumer never left its group"


async def test_a_paused_loop_polls_no_more_often_than_staying_in_its_group_needs(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    # Polling a paused partition throws away what the fetcher had read of it in advance, to be
    # read from the broker again on resume: a full loop polls only within a quarter of
    # max.poll.interval.ms (here 300 s), not on every turn.
    loop = await loops(("wait",), max_in_flight=1)
    await loop.send("t-0", BLOCK)
    await loop.send("t-1")
    await loop.start()
    await until(lambda: loop.controls.panel.entered == [("wait", "t-0")], "t-0 in flight")
    await until(lambda: loop.consumer.paused() == {loop.tp}, "the partition to be paused")
    polls = 0
    getmany = loop.consumer.getmany

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal polls
        polls += 1
        return await getmany(*args, **kwargs)

    loop.consumer.getmany = counted  # type: ignore[method-assign]
    await loop.steps(3)  # three turns while paused, each ending on the commit interval
    assert polls == 0
    loop.controls.panel.release()
    await loop.committed_to(2)
    assert polls > 0, "resumed, it fetches again"


async def test_records_of_a_partition_revoked_since_the_fetch_are_left_and_the_rest_of_the_batch_handled(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("bulk",))
    await loop.start()

    def record(tp: TopicPartition, trace_id: str) -> ConsumerRecord:
        value = trace(loop.project, trace_id, "fine")
        return ConsumerRecord(topic=tp.topic, partition=tp.partition, offset=0, timestamp=0, timestamp_type=0,
                              key=trace_id.encode(), value=value, checksum=None, serialized_key_size=len(trace_id),
                              serialized_value_size=len(value), headers=())
    # A partition in the fetch that is not (any more) this consumer's, first in the batch: the
    # records after it are still handled. The batch is ticketed and taken beside the running loop,
    # whose own fetches find an empty topic.
    gone = TopicPartition(loop.topics.traces, 7)
    batch = loop.traces.loop._tickets({gone: [record(gone, "t-gone")], loop.tp: [record(loop.tp, "t-0")]})
    await loop.traces.take(batch)
    await loop.committed_to(1)
    assert loop.controls.claims.claims_of("t-gone") == 0, "the new owner reads it"
    assert await loop.ratings() == [("bulk", "t-0")]


async def test_a_paused_loop_still_commits_on_its_interval(loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("wait",), max_in_flight=1)
    await loop.start()
    await loop.send("t-0")
    await loop.committed_to(1)
    await loop.send("t-1", BLOCK)
    await until(lambda: len(loop.controls.panel.entered) == 1, "t-1 in flight")
    await until(lambda: loop.consumer.paused() == {loop.tp}, "the partition to be paused")
    await loop.steps(2)  # turns while paused end on the commit interval, not on room
    loop.controls.panel.release()
    await loop.committed_to(2)


# --- score: bulk and alone ----------------------------------------------------------------------


async def test_a_bulk_batch_that_raises_falls_back_to_scoring_each_pair_alone_and_dead_letters_only_the_broken_trace(
        loops: Callable[..., Awaitable[Loop]], logs: list[dict[str, Any]]) -> None:
    loop = await loops(("bulk",))
    await loop.send("t-0")
    await loop.send("t-1", "[[break:bulk]]")
    await loop.send("t-2")
    await loop.start()  # the three are in the first fetch: one batch
    await loop.committed_to(3)
    assert loop.controls.panel.batches == [[("bulk", "t-0"), ("bulk", "t-1"), ("bulk", "t-2")]]
    assert sorted(loop.controls.panel.alone) == [("bulk", "t-0"), ("bulk", "t-1"), ("bulk", "t-2")], "then each alone"
    dead = await loop.dead()
    assert [(letter["reason"], letter["offset"], letter["error"]) for _, letter in dead] == [
        ("unprocessable", 1, "scoring failed: ValueError: scoring broke on t-1")]
    assert dead[0][0] == b"t-1" and dead[0][1]["key"] == "t-1" and orjson.loads(dead[0][1]["value"])["traceId"] == "t-1"
    assert await loop.ratings() == [("bulk", "t-0"), ("bulk", "t-2")]
    assert await loop.state("bulk", "t-1") == "", "the broken pair's lease is given up"
    assert len(loop.controls.events.of("latency")) == 3
    assert logged(logs, "a trace broke a step; dead-lettered") == [
        {"event": "a trace broke a step; dead-lettered", "log_level": "warning", "step": "scoring",
         "error": repr(ValueError("scoring broke on t-1")), "topic": loop.topics.traces, "partition": 0, "offset": 1}]


async def test_a_bulk_batch_that_only_breaks_in_bulk_is_scored_pair_by_pair(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("bulk",))
    await loop.send("t-0")
    await loop.send("t-1", "[[break-bulk]]")
    await loop.start()
    await loop.committed_to(2)
    assert await loop.dead() == []
    assert await loop.ratings() == [("bulk", "t-0"), ("bulk", "t-1")]
    assert [(await loop.state("bulk", t))[:5] for t in ("t-0", "t-1")] == ["done:", "done:"]


async def test_a_trace_whose_pair_breaks_is_dead_lettered_once_its_other_pairs_are_done(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("wait", "bulk"))
    await loop.start()
    await loop.send("t-0", "[[break:wait]] [[block:bulk]]")
    await until(lambda: loop.controls.panel.entered == [("bulk", "t-0")], "the bulk pair to wait")

    async def wait_pair_gave_up() -> bool:
        return ("wait", "t-0") in loop.controls.panel.alone and await loop.state("wait", "t-0") == ""
    await until(wait_pair_gave_up, "the broken pair to give up its lease")
    await loop.steps(2)
    assert await loop.dead() == [] and await loop.committed() in (None, 0), "not before its last pair"

    loop.controls.panel.release()
    await loop.committed_to(1)
    dead = await loop.dead()
    assert [(letter["reason"], letter["offset"], letter["error"]) for _, letter in dead] == [
        ("unprocessable", 0, "scoring failed: ValueError: scoring broke on t-0")]
    assert await loop.ratings() == [("bulk", "t-0")], "its other pair is out"
    assert len(loop.controls.events.of("latency")) == 1


async def test_a_broken_pair_whose_lease_cannot_be_given_up_still_dead_letters_its_trace(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    # Giving up the lease is a courtesy (it expires anyway): its failure must not stop the loop.
    loop = await loops(("wait",))
    loop.controls.claims.release_fails = True
    await loop.send("t-0", "[[break:wait]]")
    await loop.send("t-1")
    await loop.start()
    await loop.committed_to(2)
    assert loop.controls.claims.released == ["trace:t-0"], "it was tried"
    assert [letter["error"] for _, letter in await loop.dead()] == ["scoring failed: ValueError: scoring broke on t-0"]
    assert await loop.ratings() == [("wait", "t-1")] and loop.traces.fatal is None


@pytest.mark.parametrize("group_id", ["wait", "bulk"])
async def test_an_outage_while_scoring_stops_the_loop_without_dead_lettering_or_committing(
        loops: Callable[..., Awaitable[Loop]], group_id: str) -> None:
    loop = await loops((group_id,))
    await loop.send("t-0", f"[[outage:{group_id}]]")
    await loop.start()
    assert loop.task is not None
    with pytest.raises(OutputError) as raised:
        await asyncio.wait_for(loop.task, WAIT_S)
    assert isinstance(raised.value.__cause__, RedisConnectionError)
    assert loop.traces.fatal is raised.value.__cause__
    assert await loop.dead() == [] and await loop.committed() in (None, 0)
    assert (await loop.state(group_id, "t-0")).startswith("lease:"), "not the trace's fault: nothing given up"


@pytest.mark.parametrize(("group_id", "scored_alone"), [
    ("wait", 2),  # scored pair by pair: alone the first time and again
    ("bulk", 1)])  # scored in bulk the first time, alone the second
async def test_a_pair_taken_over_while_being_scored_is_waited_for_and_scored_again_if_given_up(
        loops: Callable[..., Awaitable[Loop]], group_id: str, scored_alone: int) -> None:
    # This worker stalls on t-0 past its lease; another worker takes the pair over, then gives it
    # up unfinished: this worker's result is not published, it waits and scores the pair again.
    loop = await loops((group_id,), lease_s=1.0)
    await loop.send("t-0", BLOCK)
    await loop.start()
    await until(lambda: loop.controls.panel.entered == [(group_id, "t-0")], "t-0 to be in scoring")
    await asyncio.sleep(0.6)  # past half the lease: the worker asks whether it still holds it
    request = loop.request(group_id, "t-0", judge_calls=1 if group_id == "wait" else 0)
    await loop.controls.claims.release([request])  # as if this worker's lease had lapsed...
    other = Claims(loop.redis, owner="another-worker", lease_s=90)
    assert [c.state for c in await other.claim_many([request])] == ["claimed"]  # ...and was taken over
    polls = loop.controls.claims.claims_of("t-0")
    loop.controls.panel.release()
    await until(lambda: loop.controls.claims.claims_of("t-0") >= polls + 2, "the taken-over pair to be polled")
    assert await loop.ratings() == [] and loop.controls.panel.scored("t-0") == 1
    await other.release([request])  # the other worker gave it up
    await loop.committed_to(1)
    assert loop.controls.panel.alone == [(group_id, "t-0")] * scored_alone, "scored again, alone, once the pair was free"
    assert await loop.ratings() == [(group_id, "t-0")] and await loop.dead() == []
    assert (await loop.state(group_id, "t-0")).startswith("done:")


async def test_a_bulk_pair_taken_over_while_being_scored_is_not_published_and_its_trace_finishes(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("bulk",), lease_s=1.0)
    await loop.send("t-0", BLOCK)
    await loop.send("t-1")
    await loop.start()
    await until(lambda: loop.controls.panel.entered == [("bulk", "t-0")], "t-0 to be in scoring")
    await asyncio.sleep(0.6)  # past half the lease: the worker asks whether it still holds it
    elsewhere = Claims(loop.redis, owner="another-worker")
    await elsewhere.mark_done([(loop.request("bulk", "t-0"), "rating-elsewhere")])
    loop.controls.panel.release()
    await loop.committed_to(2)
    assert await loop.ratings() == [("bulk", "t-1")], "only the pair still held is published"
    assert loop.controls.panel.alone == [], "the lost pair is waited for, not scored again"
    assert await loop.state("bulk", "t-0") == "done:rating-elsewhere"
    assert (await loop.state("bulk", "t-1")).startswith("done:")
    assert loop.controls.events.of("group_skipped") == [(loop.project, "bulk", "dedupe")]


# --- publish ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("group_id", "other", "message"), [
    ("wait", "bulk", "publishing a result failed; the worker stops without committing it"),
    ("bulk", "wait", "publishing results failed; the worker stops without committing them")])
async def test_an_output_that_fails_sets_fatal_and_run_raises_output_error(
        loops: Callable[..., Awaitable[Loop]], group_id: str, other: str, message: str,
        logs: list[dict[str, Any]]) -> None:
    # The ratings topic refuses any record over 64 bytes: publishing a rating fails for sure. The
    # trace's other pair waits meanwhile: the failure stops the loop at once, not with the job.
    loop = await loops((group_id, other), ratings_config={"max.message.bytes": "64"})
    await loop.send("t-0", f"[[block:{other}]]")
    await loop.start()
    assert loop.task is not None
    with pytest.raises(OutputError, match=r"^an output could not be published; stopping without committing it$") \
            as raised:
        await asyncio.wait_for(loop.task, WAIT_S)
    assert loop.controls.panel.entered == [(other, "t-0")] and not loop.controls.panel.released.is_set()
    assert isinstance(loop.traces.fatal, KafkaError)
    assert raised.value.__cause__ is loop.traces.fatal
    assert await loop.committed() in (None, 0)
    assert (await loop.state(group_id, "t-0")).startswith("lease:"), "not marked done"
    assert logged(logs, message) == [{"event": message, "log_level": "error", "error": repr(loop.traces.fatal)}]


async def test_a_finished_pair_is_recorded_in_history_and_marked_done_with_its_rating_id(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("wait", "bulk"))
    store = RatingsStore(loop.redis)

    async def counted() -> dict[str, int]:  # group ids are shared: count what this trace adds
        return {g: sum(b.count for b in (await store.history(g, "24h")).buckets) for g in ("wait", "bulk")}
    before = await counted()
    await loop.send("t-0")
    await loop.start()
    await loop.committed_to(1)
    ratings = {orjson.loads(r.value)["groupId"]: orjson.loads(r.value) for r in await loop.read(loop.topics.ratings)}
    for group_id in ("wait", "bulk"):
        mark, revision = (await loop.state(group_id, "t-0")).split("@")  # done:<ratingId>@<group revision>
        assert mark == f"done:{ratings[group_id]['id']}" and revision
        assert ratings[group_id]["scope"] == "trace" and ratings[group_id]["traceId"] == "t-0"
    assert {r.key for r in await loop.read(loop.topics.ratings)} == {b"t-0"}
    after = await counted()
    assert all(after[g] > before[g] for g in ("wait", "bulk")), (before, after)


# --- shutdown -----------------------------------------------------------------------------------


async def test_drain_cancels_jobs_past_the_deadline_and_releases_their_leases(
        loops: Callable[..., Awaitable[Loop]], logs: list[dict[str, Any]]) -> None:
    loop = await loops(("wait", "bulk"), commit_interval_s=3600)
    await loop.start()
    await loop.send("t-0")
    await until(lambda: len(loop.controls.events.of("latency")) == 1, "t-0 to be finished")
    await loop.send("t-1", BLOCK)
    await until(lambda: len(loop.controls.panel.entered) == 2, "t-1's two pairs in scoring")
    await loop.halt()
    await asyncio.wait_for(loop.traces.drain(0.05), WAIT_S)  # t-1 never finishes by itself
    loop.stop = None  # drained
    assert await loop.state("wait", "t-1") == "" and await loop.state("bulk", "t-1") == "", "leases given up"
    assert await loop.committed() == 1, "drain commits what finished, up to the cancelled trace"
    assert await loop.ratings() == [("bulk", "t-0"), ("wait", "t-0")]
    assert logged(logs, "draining in-flight traces") == [
        {"event": "draining in-flight traces", "log_level": "info", "traces": 1, "deadline_s": 0.05}]
    assert logged(logs, "cancelling traces that did not finish in time") == [
        {"event": "cancelling traces that did not finish in time", "log_level": "warning", "traces": 1}]


@pytest.mark.parametrize("group_id", ["bulk", "wait"])  # scored in bulk / pair by pair
async def test_a_publish_under_way_when_drain_cancels_its_trace_completes_marked_done_and_its_lease_is_not_given_up(
        loops: Callable[..., Awaitable[Loop]], logs: list[dict[str, Any]], group_id: str) -> None:
    # t-0's rating is on its way to the broker (held there) when drain's deadline passes and
    # cancels the job: the publish is shielded - it ends, marked done with the published rating's
    # id, and its lease is never given up (a free pair whose rating is out would be scored again).
    loop = await loops((group_id,), commit_interval_s=3600)
    await run_until_the_rating_of_t0_is_held(loop)
    await drain_letting_held_sends_go_once_it_cancels(loop, logs)
    (rating,) = [orjson.loads(r.value) for r in await loop.read(loop.topics.ratings)]
    assert (await loop.state(group_id, "t-0")).split("@")[0] == f"done:{rating['id']}"
    assert loop.controls.claims.released == [], "a published pair's lease is not given up"
    # None: no commit yet (the interval is an hour); 0: drain's final commit, nothing finished
    assert await loop.committed() in (None, 0), "its job was cancelled: a redelivery finds the pair done"
    assert loop.traces.fatal is None


@pytest.mark.parametrize("group_id", ["bulk", "wait"])
async def test_a_publish_that_fails_after_drain_cancelled_its_job_is_still_reported_as_fatal(
        loops: Callable[..., Awaitable[Loop]], logs: list[dict[str, Any]], group_id: str) -> None:
    # The job is cancelled, so its failure is not the job's: the publish itself records it (the
    # worker exits 1 on a fatal error after drain, worker/app.py), and the pair keeps its lease -
    # not done, not given up.
    loop = await loops((group_id,), commit_interval_s=3600, ratings_config={"max.message.bytes": "64"})
    await run_until_the_rating_of_t0_is_held(loop)
    await drain_letting_held_sends_go_once_it_cancels(loop, logs)  # ...and the broker refuses the rating
    assert isinstance(loop.traces.fatal, KafkaError)
    assert (await loop.state(group_id, "t-0")).startswith("lease:") and loop.controls.claims.released == []


async def test_a_publish_that_never_ends_does_not_hold_drain_past_its_deadline_and_is_fatal(
        loops: Callable[..., Awaitable[Loop]], logs: list[dict[str, Any]]) -> None:
    # Its rating may be out and is not marked done: the worker must say so (it exits 1 on fatal).
    loop = await loops(("bulk",), commit_interval_s=3600)
    await run_until_the_rating_of_t0_is_held(loop)  # never let go before drain returns
    started = time.monotonic()
    await asyncio.wait_for(loop.traces.drain(0.2), WAIT_S)
    assert time.monotonic() - started < 0.2 * 2 + 3, "the job's deadline, then the publishes' deadline"
    loop.stop = None  # drained
    assert loop.producer.waiting == 1 and not loop.producer.held.is_set(), "returned with the publish still held"
    assert str(loop.traces.fatal) == "1 publishes did not finish in time"
    assert logged(logs, "publishes did not finish in time") == [
        {"event": "publishes did not finish in time", "log_level": "error", "publishes": 1}]


async def test_drain_commits_what_is_finished_even_when_giving_up_leases_fails(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("wait",), commit_interval_s=3600)
    await loop.send("t-0")
    await loop.send("t-1", BLOCK)
    await loop.start()
    await until(lambda: len(loop.controls.events.of("latency")) == 1 and loop.controls.panel.entered == [("wait", "t-1")],
                "t-0 finished and t-1 in flight")
    await loop.halt()
    loop.controls.claims.release_fails = True
    await asyncio.wait_for(loop.traces.drain(0.05), WAIT_S)
    loop.stop = None  # drained
    assert loop.controls.claims.released == ["trace:t-1"], "it was tried"
    assert await loop.committed() == 1


async def test_a_job_that_finishes_after_a_fatal_error_does_not_clear_it(loops: Callable[..., Awaitable[Loop]]) -> None:
    # /readyz reports `fatal` while the worker drains; jobs finishing meanwhile must not clear it.
    loop = await loops(("wait",))
    await loop.send("t-0", BLOCK)
    await loop.start()
    await until(lambda: loop.controls.panel.entered == [("wait", "t-0")], "t-0 in flight")
    await loop.send("t-1", "[[outage:wait]]")
    assert loop.task is not None
    with pytest.raises(OutputError):
        await asyncio.wait_for(loop.task, WAIT_S)
    fatal = loop.traces.fatal
    assert isinstance(fatal, RedisConnectionError)
    loop.controls.panel.release()
    await asyncio.wait_for(loop.traces.drain(WAIT_S), 2 * WAIT_S)
    loop.stop = None  # drained
    assert await loop.ratings() == [("wait", "t-0")], "t-0's job finished during the drain"
    assert loop.traces.fatal is fatal


async def test_finished_jobs_and_publishes_are_not_kept(loops: Callable[..., Awaitable[Loop]]) -> None:
    # Bounded memory: the loop forgets a job, its traces and its publish once they are done.
    loop = await loops(("wait", "bulk"))
    for i in range(3):
        await loop.send(f"t-{i}")
    await loop.start()
    await loop.committed_to(3)
    traces = loop.traces
    await until(lambda: not traces._jobs and not traces.pairs._publishing and not traces.pairs.unpublished,
                "nothing kept of finished work")


async def test_drain_with_nothing_in_flight_commits_what_is_finished(loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("bulk",), commit_interval_s=3600)
    await loop.send("t-0")
    await loop.start()
    await until(lambda: loop.controls.events.of("latency") != [], "t-0 to be finished")
    await loop.halt()
    await asyncio.wait_for(loop.traces.drain(5), WAIT_S)
    loop.stop = None
    assert await loop.committed() == 1


# --- commit and lag -----------------------------------------------------------------------------


async def test_the_commit_happens_on_the_interval_and_only_for_finished_offsets(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    slow = await loops(("bulk",), commit_interval_s=3600)  # the first turn's commit, then none for an hour
    await slow.send("t-0")
    await slow.start()
    await until(lambda: slow.controls.events.of("latency") != [], "t-0 to be finished")
    await slow.steps(3)
    assert await slow.committed() in (None, 0), "not before the interval has passed"
    advanced = slow.traces.last_commit_advance
    await slow.traces.commit()
    assert await slow.committed() == 1 and slow.traces.last_commit_advance > advanced
    assert slow.controls.events.of("committed") == [(slow.topics.traces, 0, 1)]
    advanced = slow.traces.last_commit_advance
    await slow.traces.commit()  # nothing moved: nothing committed
    assert slow.controls.events.of("committed") == [(slow.topics.traces, 0, 1)]
    assert slow.traces.last_commit_advance == advanced

    quick = await loops(("wait",), commit_interval_s=0.05)
    await quick.start()
    await quick.send("t-0", BLOCK)
    await quick.send("t-1")
    await until(lambda: quick.controls.events.of("latency") != [], "t-1 to be finished")
    await quick.steps(3)
    assert await quick.committed() in (None, 0), "t-0 is unfinished: nothing past it"
    quick.controls.panel.release()
    await quick.committed_to(2)
    # The broker may answer the commit before the loop reports it: the report follows.
    await until(lambda: quick.controls.events.of("committed")[-1] == (quick.topics.traces, 0, 2),
                "the commit to 2 to be reported")
    assert quick.traces.outage is None


async def test_on_revocation_only_the_revoked_partitions_are_committed(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("bulk",), commit_interval_s=3600, partitions=2)
    await loop.send("t-0", partition=0)
    await loop.send("t-1", partition=1)
    await loop.start()
    await until(lambda: len(loop.controls.events.of("latency")) == 2, "both traces finished")
    other = TopicPartition(loop.topics.traces, 1)
    await loop.traces.rebalance_listener().on_partitions_revoked({loop.tp})
    assert await loop.committed() == 1 and await loop.committed(other) is None
    assert loop.controls.events.of("committed") == [(loop.topics.traces, 0, 1)]


async def test_work_finishing_on_a_partition_lost_in_a_rebalance_does_not_block_the_commits_of_those_kept(
        loops: Callable[..., Awaitable[Loop]], logs: list[dict[str, Any]]) -> None:
    # A second member joins the group: each keeps one of the two partitions. The trace in flight
    # on the partition that left ends afterwards; its offset is not this worker's to commit any
    # more (the consumer refuses it), so it must not hold back the commits of the partition kept.
    loop = await loops(("wait",), partitions=2)
    await loop.send("t-0", BLOCK, partition=0)
    await loop.send("t-1", BLOCK, partition=1)
    await loop.start()
    await until(lambda: len(loop.controls.panel.entered) == 2, "a trace in flight on each partition")
    peer = AIOKafkaConsumer(bootstrap_servers=loop.bootstrap, group_id=loop.group_id, enable_auto_commit=False)
    peer.subscribe([loop.topics.traces])
    await peer.start()
    try:
        await until(lambda: len(loop.consumer.assignment()) == 1 and len(peer.assignment()) == 1,
                    "the partitions to be split between the two members")
        (kept,) = loop.consumer.assignment()
        loop.controls.panel.release()  # both jobs end, one on the partition that left
        await until(lambda: len(loop.controls.events.of("latency")) >= 2, "the two in-flight traces to end")
        await loop.send("t-2", partition=kept.partition)
        position = (await loop.consumer.end_offsets([kept]))[kept]

        async def kept_committed() -> bool:
            return await loop.committed(kept) == position
        await until(kept_committed, "the kept partition's commit to pass t-2")
        assert logged(logs, "commit failed; retrying on the next tick") == []
    finally:
        await peer.stop()


async def test_lag_is_reported_from_the_oldest_unfinished_offset(loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("wait",))
    await loop.start()
    await loop.send("t-0", BLOCK)
    await loop.send("t-1")
    await loop.send("t-2")
    await until(lambda: len(loop.controls.events.of("latency")) == 2, "t-1 and t-2 finished")
    await until(lambda: loop.controls.events.of("lag")[-1:] == [(loop.topics.traces, 0, 3)], "a lag of 3 behind t-0")
    loop.controls.panel.release()
    await until(lambda: loop.controls.events.of("lag")[-1:] == [(loop.topics.traces, 0, 0)], "no lag")


async def test_failing_commits_are_reported_as_an_outage_and_stop_the_loop_past_the_tolerance(
        loops: Callable[..., Awaitable[Loop]], logs: list[dict[str, Any]]) -> None:
    loop = await loops(("wait",), commit_interval_s=0.02, outages=OutageGuard(tolerance_s=1.0))
    await loop.start()
    await loop.send("t-0", BLOCK)
    await until(lambda: loop.controls.panel.entered != [], "t-0 in scoring")
    assert loop.traces.outage is None
    # The consumer loses its partition (it reads another topic now): every commit of it now fails.
    loop.consumer.unsubscribe()
    loop.consumer.assign([TopicPartition(loop.topics.signals, 0)])
    loop.controls.panel.release()
    await until(lambda: (loop.traces.outage or "").startswith("offset commits failing for "),
                "the failing commits to be reported")
    assert loop.task is not None
    with pytest.raises(OutageTooLong, match=r"offsets could not be committed for .* past the tolerance of 1s") as raised:
        await asyncio.wait_for(loop.task, WAIT_S)
    assert await loop.committed() in (None, 0)
    lasted = re.search(r"committed for (\d+)s", str(raised.value))
    assert lasted is not None and 1 <= int(lasted.group(1)) < WAIT_S
    failed = logged(logs, "commit failed; retrying on the next tick")
    assert len(failed) >= 2 and failed[0] == {"event": "commit failed; retrying on the next tick", "loop": "traces",
                                              "log_level": "warning", "error": repr(raised.value.__cause__)}


async def test_a_failing_commit_is_retried_on_the_next_tick_and_the_loop_goes_on(
        loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("wait",), commit_interval_s=0.02)  # the default tolerance: 120 s
    await loop.start()
    await loop.send("t-0", BLOCK)
    await until(lambda: loop.controls.panel.entered != [], "t-0 in scoring")
    loop.consumer.unsubscribe()
    loop.consumer.assign([TopicPartition(loop.topics.signals, 0)])
    loop.controls.panel.release()
    await until(lambda: (loop.traces.outage or "").startswith("offset commits failing for "),
                "the failing commits to be reported")
    await loop.steps(3)
    assert loop.task is not None and not loop.task.done(), "within the tolerance the loop goes on"


async def test_offsets_are_committed_without_metadata(loops: Callable[..., Awaitable[Loop]]) -> None:
    loop = await loops(("bulk",))
    await loop.send("t-0")
    await loop.start()
    await loop.committed_to(1)
    admin = AIOKafkaAdminClient(bootstrap_servers=loop.bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(loop.group_id)
    finally:
        await admin.close()
    assert {tp: (o.offset, o.metadata) for tp, o in offsets.items()} == {loop.tp: (1, "")}
