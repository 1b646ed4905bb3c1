"""A tenant against backfill estimates, on the real broker and Redis:

- a dry run over traces of 65,000 characters with a group whose filter is a regex bomb routes them
  in slices: the event loop it shares with every other tenant's requests waits about one trace's
  routing at a time, never a whole fetched batch's (the relation is measured in the same run: the
  longest stall against the whole read's time);
- a window that starts before 1970 is clamped as a real backfill's is: an estimate, not a 500;
- an estimate answers from the tenant's own traffic: with A's one marker trace fixed, C's volume
  in the same window (1,000 traces, then 5,000) does not move A's answer - scaled by the shared
  topic's records, it said C's volume times a constant.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import httpx
import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from adapters.stores.ratings import RatingsStore
from consumers.backfill_estimate import estimate
from consumers.decode import decode_trace
from scoring.catalog import CatalogSnapshot
from scoring.models import ScorerGroup
from scoring.prices import NO_PRICING
from scoring.routing import group_pairs
from tests.support import backfill_bench
from tests.support.api_process import ApiProcess, create_key
from tests.support.backfill_bench import APOLOGY, BY_PATTERN, DAY, Bench

pytestmark = pytest.mark.integration

bench, judge_server = backfill_bench.bench, backfill_bench.judge_server  # the fixtures, for this module

BOMB = "a[ab]{999}[ab]{990}c"  # accepted at save; the NFA's worst case
TRACES = 40


def _bomb_group(project: str) -> ScorerGroup:
    return ScorerGroup.model_validate({
        "id": f"g-{project}", "name": "Bomb", "projectId": project, "members": BY_PATTERN,
        "online": {"enabled": False, "sampleRate": 1, "alertThreshold": 6, "severity": "high",
                   "filter": {"any": [{"field": "root.output", "op": "matches", "value": BOMB}] * 32}}})


def _trace(project: str, n: int) -> dict[str, object]:
    return {"traceId": f"bomb-{n}", "projectId": project, "agentId": "a",
            "timestamp": (DAY + timedelta(minutes=n)).isoformat(),
            "spans": [{"spanId": "r", "input": "q", "output": "ab" * 32_500}]}


async def test_an_estimate_over_a_bomb_filter_gives_the_loop_back_between_traces(bench: Bench) -> None:
    await bench.produce([_trace(bench.project, n) for n in range(TRACES)])
    group = _bomb_group(bench.project)
    snapshot = CatalogSnapshot(groups={group.id: group}, patterns={APOLOGY.id: APOLOGY})

    # One trace's routing, alone: what a slice may hold the loop for at most (plus a little).
    one = decode_trace("t", 0, 0, b"k", orjson.dumps(_trace(bench.project, 0)), 1 << 20)
    assert not isinstance(one, Exception) and hasattr(one, "spans")
    started = time.perf_counter()
    group_pairs(one, group, snapshot, sample_rate=1.0)  # type: ignore[arg-type]
    per_trace = time.perf_counter() - started

    stalls: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:  # another tenant's requests: how long each wait for the loop was
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            stalls.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    began = time.perf_counter()
    said = await estimate(
        lambda: AIOKafkaConsumer(bootstrap_servers=bench.bootstrap, group_id=None,
                                 max_partition_fetch_bytes=4 << 20), bench.names.traces, group, snapshot,
        from_ms=int(DAY.timestamp() * 1000), to_ms=int((DAY + timedelta(days=1)).timestamp() * 1000),
        sample_rate=1.0, history=await RatingsStore(bench.redis).history(group.id, "30d"), own_records=TRACES,
        pricing=NO_PRICING,
        currency="USD", limit=10_000, max_trace_bytes=1 << 20, max_spans=50)
    took = time.perf_counter() - began
    done.set()
    await ticking
    assert said.exact and said.pairs == 0, "the bomb filter cannot tell: no trace taken (fail closed)"
    # The read took all the traces' routing (one fetch holds them all: routed unsliced, the loop
    # waited as long); no single wait came near it - a slice is about one trace's - however
    # loaded the machine is (a busy machine stretches both alike).
    assert took > 5 * per_trace, (took, per_trace)
    assert max(stalls) < took / 4, (max(stalls), per_trace, took)


async def test_a_dry_run_window_before_1970_is_clamped_not_a_500(bench: Bench, redis_url: str,
                                                                  tmp_path: Path) -> None:
    await bench.produce([{"traceId": "t-1", "projectId": bench.project, "agentId": "a",
                          "timestamp": DAY.isoformat(), "spans": [{"spanId": "r", "input": "q", "output": "x"}]}])
    key = create_key(redis_url, "--project", bench.project)
    api = ApiProcess(redis_url, tmp_path / "api.log", env={"SGW_KAFKA_BOOTSTRAP": bench.bootstrap,
                                                          "SGW_TRACES_TOPIC": bench.names.traces}).start()
    try:
        async with httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            pattern = (await http.post("/v1/patterns", json={"name": "P", "polarity": "failure",
                                                             "template": "apology"})).json()
            group = (await http.post("/v1/scorer-groups", json={
                "name": "Past", "members": [{"kind": "pattern", "refId": pattern["id"], "weight": 1}],
                "online": {"enabled": False, "sampleRate": 1, "alertThreshold": 6, "severity": "high"}})).json()
            window = {"from": "1969-12-31T00:00:00Z", "to": (DAY + timedelta(days=1)).isoformat(), "dryRun": True}
            answer = await http.post(f"/v1/scorer-groups/{group['id']}/backfills", json=window)
    finally:
        api.stop()
    assert answer.status_code == 200, answer.text
    assert answer.json()["estimate"]["traces"] == 1


async def test_an_estimate_does_not_move_with_another_tenants_volume(bench: Bench) -> None:
    others = f"c-{bench.unique}"
    marker = {"traceId": "marker", "projectId": bench.project, "agentId": "a", "timestamp": DAY.isoformat(),
              "spans": [{"spanId": "r", "input": "q", "output": "I am so sorry [[marker]]"}]}
    group = ScorerGroup.model_validate({
        "id": f"g-{bench.unique}", "name": "Marker", "projectId": bench.project, "members": BY_PATTERN,
        "online": {"enabled": False, "sampleRate": 1, "alertThreshold": 6, "severity": "high",
                   "filter": {"field": "root.output", "op": "contains", "value": "[[marker]]"}}})
    snapshot = CatalogSnapshot(groups={group.id: group}, patterns={APOLOGY.id: APOLOGY})
    store = RatingsStore(bench.redis)
    window = int(DAY.timestamp() * 1000), int((DAY + timedelta(days=1)).timestamp() * 1000)

    def theirs(first: int, count: int) -> list[dict[str, object]]:
        return [{"traceId": f"c-{n}", "projectId": others, "agentId": "a",
                 "timestamp": (DAY + timedelta(seconds=5 * n)).isoformat(),
                 "spans": [{"spanId": "r", "input": "q", "output": "fine"}]} for n in range(first, first + count)]

    async def said() -> tuple[int, int, bool]:
        answer = await estimate(
            lambda: AIOKafkaConsumer(bootstrap_servers=bench.bootstrap, group_id=None), bench.names.traces, group,
            snapshot, from_ms=window[0], to_ms=window[1], sample_rate=1.0,
            history=await store.history(group.id, "30d"), own_records=await store.traffic(bench.project, *window),
            pricing=NO_PRICING, currency="USD", limit=200, max_trace_bytes=1 << 20, max_spans=50)
        return answer.traces, answer.pairs, answer.exact

    await bench.produce([marker, *theirs(0, 1_000)])
    small = await said()
    await bench.produce(theirs(1_000, 4_000))
    large = await said()
    assert not small[2] and not large[2], "a bounded read of the window"
    assert small[:2] == large[:2] == (1, 1), (small, large)
