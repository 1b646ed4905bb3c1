"""End to end: the worker as a subprocess on the real broker and Redis, judges through the
local judge server, an external scorer through a local HTTP server, code scorers in their
sandboxes. Every kept (trace, group) is rated once with the right score; Signals exactly below
threshold; webhook deliveries per Signal and channel; malformed records dead-lettered; an
exhausted budget skips whole groups; a second worker joins mid-stream without loss or doubles."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest

from devtools.judge_server import JudgeServer
from tests.support.harness import WorkerProcess, catalog_db, produce, read_topic, worker_env
from tests.support.http_fakes import Reply, ScriptedServer
from tests.support.live_scoring import catalog, check_live_scoring, trace

pytestmark = pytest.mark.integration


@pytest.fixture
def external() -> Iterator[ScriptedServer]:
    with ScriptedServer(default=Reply(body={"score": 0.5})) as s:
        yield s


@pytest.fixture
def receiver() -> Iterator[ScriptedServer]:
    with ScriptedServer(default=Reply(status=204, body=b"")) as s:
        yield s


@pytest.fixture
async def env(kafka_bootstrap: str, redis_db_url: str, unique: str, judge: JudgeServer,
              external: ScriptedServer, receiver: ScriptedServer) -> AsyncIterator[dict[str, str]]:
    async with catalog_db(redis_db_url, catalog(external.url + "/score", receiver.url)) as url:
        yield worker_env(kafka_bootstrap, url, unique, topic_partitions=4, judge_base_url=judge.base_url,
                         judge_timeout_s=5, egress_allow="127.0.0.0/8", max_trace_bytes=4096,
                         commit_interval_s=0.2)


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
async def test_live_scoring_end_to_end(env: dict[str, str], kafka_bootstrap: str, tmp_path: Path,
                                       event_loop: str) -> None:
    # The whole scenario on each event loop SGW_EVENT_LOOP offers (uvloop, the default, and Python's).
    await check_live_scoring({**env, "SGW_EVENT_LOOP": event_loop}, kafka_bootstrap, tmp_path)
    started = next(orjson.loads(line) for line in (tmp_path / "worker.log").read_text().splitlines()
                   if '"worker started"' in line)
    assert started["event_loop"] == event_loop


async def test_a_second_worker_joins_mid_stream_without_loss_or_second_ratings(
        env: dict[str, str], kafka_bootstrap: str, tmp_path: Path) -> None:
    first = WorkerProcess(env, name="first").start(tmp_path)
    second = WorkerProcess(env, name="second")
    waves = [[trace(i, "p-b") for i in range(w * 100, w * 100 + 100)] for w in range(3)]
    try:
        first.wait_ready()
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"],
                      [(t["traceId"].encode(), orjson.dumps(t)) for t in waves[0]])
        second.start(tmp_path)
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"],
                      [(t["traceId"].encode(), orjson.dumps(t)) for t in waves[1]])
        second.wait_ready()
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"],
                      [(t["traceId"].encode(), orjson.dumps(t)) for t in waves[2]])
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"],
                                   until=lambda v: len({r["id"] for r in v}) >= 300, settle_s=3)
        both_worked = first.metric("sgw_groups_scored_total") > 0 and second.metric("sgw_groups_scored_total") > 0
    finally:
        codes = (first.stop(), second.stop())
    assert codes == (0, 0), first.logs() + second.logs()
    ids = Counter(r["traceId"] for r in ratings)
    assert set(ids) == {t["traceId"] for wave in waves for t in wave}, "no trace lost"
    assert max(ids.values()) == 1, "no second rating"
    assert both_worked, "the partitions were shared"
