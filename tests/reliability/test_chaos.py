"""Chaos: several workers share a backlog while faults hit them one after another, and they ride
every fault out in-process.

On a broker and a Redis of the test's own (both are hurt here, so no other test sees them), two
`scorer-worker run` processes consume a backlog of traces, each scored by a judge group (one
call to the local judge per trace) and a deterministic group. While they work, in this order:

1. one worker is killed (SIGKILL): its leases are left behind, its uncommitted work redelivered;
2. a new worker joins the consumer group (a rebalance with work in flight);
3. one worker is frozen (SIGSTOP) past the consumer session timeout, so the group moves its
   partitions away, then resumed (SIGCONT): it comes back with stale work in hand;
4. Redis is frozen for ~8 s (SIGSTOP, then SIGCONT): every worker waits for it in-process;
5. the broker is killed (SIGKILL) and restarted on the same port with the same data.

Then, from the ratings topic and the judge's own count of calls:

- no pair is missing: every (trace, group) pair has a rating;
- one rating id and one value per pair, and it is the expected value (a pair may be published
  again under the same id with the same value: at-least-once). A worker resuming from a freeze
  finds its members' deadlines passed on the clock - a pause is not a timeout: it hands such
  pairs back and scores them afresh (``consumers.pauses``), so a "timed out" verdict from a
  freeze fails the test like any wrong value. It never publishes a pair another worker took over
  and scored meanwhile (a second value under one id; found by this test, fixed by confirming the
  lease before publishing, ``Claims.confirm``);
- judge calls are repeated only for work that was in flight when a fault hit (REPEAT_BOUND), and
  every HTTP call made to the judge took a budget slot (retries included);
- the money and tokens the project used are never less than what the judge answered (its own
  count of every completion's usage, at the price table: what a provider bills), and exceed it
  by at most the ceilings of the reservations never settled - a worker killed or frozen with
  calls in flight, at most one per slot taken beyond the pairs judged (a settlement counted twice
  falls below the judge's count; one never made, above the bound);
- no worker exits for an outage shorter than SGW_OUTAGE_TOLERANCE_S: every worker the test did
  not kill still runs at the end, and exits 0 on SIGTERM;
- the consumer group's committed offsets reach the end of the traces topic.

CI runs one round (~90 s). A heavier run repeats the faults over more traces, one backlog per
round: ``SGW_CHAOS_ROUNDS=5 ./dev chaos`` (docs/operate/reliability.md).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from redis.asyncio import Redis

from adapters.stores.claims import Claims
from devtools.judge_server import Behaviour, JudgeServer
from devtools.redis_servers import LocalRedis
from devtools.services import LocalKafka
from scoring.judge_prompt import ANSWER_MAX_TOKENS, MESSAGE_OVERHEAD_TOKENS
from scoring.models import Judge
from scoring.ports import TokenUsage
from scoring.prices import Pricing, call_cost, nanos, parse_prices
from services.groups import MonitorClient
from tests.support.chaos import RatingsTail, Workers, commit_lag, read_everything, wait_committed
from tests.support.harness import produce, worker_env

ROUNDS = int(os.environ.get("SGW_CHAOS_ROUNDS", "1"))
pytestmark = [pytest.mark.integration, pytest.mark.alone, pytest.mark.timeout(150 + 150 * ROUNDS)]

# The backlog: every trace is one pair per group. Judge answers take JUDGE_DELAY_S, so a worker
# rates about MAX_IN_FLIGHT / JUDGE_DELAY_S traces a second and the backlog outlasts the faults.
TRACES_PER_ROUND = 1600
GROUPS = ("judged", "deterministic")
JUDGE_CALLS_PER_TRACE = 1  # the judged group has one judge member; the other group calls none
JUDGE_DELAY_S = 0.3
MAX_IN_FLIGHT = 12  # traces a worker scores at once (SGW_MAX_IN_FLIGHT)
PARTITIONS = 6
WORKERS = 2  # running at once: one is killed and a new one joins in each round
FAULTS = ("kill -9 a worker", "a worker joins", "freeze a worker", "freeze Redis", "kill and restart the broker")
# Each fault is let loose once this share of the round's pairs is rated (at once if more are): the
# faults come one after another, and the last still finds about half of the work to do.
FAULT_AT = (0.05, 0.06, 0.25, 0.40, 0.50)
SESSION_TIMEOUT_S = 10  # aiokafka's default consumer session timeout (the worker keeps it)
FREEZE_WORKER_S = SESSION_TIMEOUT_S + 3  # past it: the group takes the frozen worker's partitions
FREEZE_REDIS_S = 8
BROKER_DOWN_S = 2  # between the kill and the restart (which itself takes some seconds)
# A judge call is repeated only when a pair is claimed again, which needs its lease to expire
# (or be given up) before it was marked done: only pairs in flight when a fault hits. A fault
# may interrupt at most what every running worker has in flight, each trace costing its judge
# calls once more.
REPEAT_BOUND = ROUNDS * len(FAULTS) * WORKERS * MAX_IN_FLIGHT * JUDGE_CALLS_PER_TRACE
# Short leases, so work left by a killed or frozen worker is taken over within seconds.
CLAIM_LEASE_S, MEMBER_DEADLINE_S, JUDGE_TIMEOUT_S = 4, 3, 2.5
STALE_GRACE_S = 5  # a resumed worker publishes what it held within this many seconds

CATALOG = {
    "judges": [{"id": "quality", "name": "Quality", "criteria": "Helpful?"}],
    "patterns": [{"id": "apology", "name": "Apology", "polarity": "failure", "template": "apology"}],
    "groups": [
        {"id": "judged", "name": "Judged", "projectId": "p-chaos",
         "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 0, "severity": "low"},
         "members": [{"kind": "judge", "refId": "quality", "weight": 1, "gate": False}]},
        {"id": "deterministic", "name": "Deterministic", "projectId": "p-chaos",
         "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 0, "severity": "low"},
         "members": [{"kind": "pattern", "refId": "apology", "weight": 1, "gate": False}]},
    ],
    "budgets": [{"projectId": "p-chaos", "judgeCallsPerWindow": 10_000_000, "windowSeconds": 86400,
                 "judgeTokensPerWindow": 10**12, "judgeCostPerWindow": 10**6}],  # counted, never reached
}
PRICES = {"gpt-4o-mini": {"input": 0.15, "output": 0.6}}  # per million tokens (SGW_JUDGE_PRICES)


def trace(i: int) -> tuple[bytes, bytes]:
    """Trace ``c-i``: the judge rates it i % 11 and counts its calls under its id; every third
    one apologises (the deterministic group gives it 0, the others 10)."""
    output = f"answer {i} [[rating={i % 11}]] [[key=c-{i}]]" + (" I'm sorry" if i % 3 == 0 else "")
    return f"c-{i}".encode(), orjson.dumps({
        "traceId": f"c-{i}", "projectId": "p-chaos", "agentId": "a", "timestamp": "2026-12-02T13:00:00Z",
        "spans": [{"spanId": "r", "input": "q", "output": output}]})


def expected_rating(trace_id: str, group: str) -> float:
    i = int(trace_id.removeprefix("c-"))
    if group == "judged":
        return float(i % 11)
    return 0.0 if i % 3 == 0 else 10.0


# --- The faults ----------------------------------------------------------------------------------

@dataclass(kw_only=True)
class Chaos(Workers):
    """The workers, the services and the faults."""

    kafka: LocalKafka
    redis: LocalRedis
    freezes: list[tuple[float, float]] = field(default_factory=list)  # (SIGSTOP, SIGCONT), wall clock

    # 3. A worker stops answering (a long GC pause, a frozen VM) past the session timeout: the
    #    group gives its partitions away, then it comes back holding work that is no longer its.
    async def freeze_a_worker(self) -> None:
        frozen = self.running[0]
        assert frozen.proc is not None
        frozen.proc.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        try:
            await asyncio.sleep(FREEZE_WORKER_S)
        finally:
            frozen.proc.send_signal(signal.SIGCONT)
            self.freezes.append((stopped_at, time.time()))
        await asyncio.to_thread(frozen.wait_ready)

    def stale_after_freeze(self, rating: dict[str, Any]) -> bool:
        """A member "timed out" in a rating made just as a frozen worker resumed."""
        scored_at = datetime.fromisoformat(rating["scoredAt"]).timestamp()
        timed_out = any("timed out" in (m.get("detail") or "") for m in rating["members"])
        return timed_out and any(stopped <= scored_at <= resumed + STALE_GRACE_S for stopped, resumed in self.freezes)

    # 4. Redis stops answering: claims, done marks and the catalog watcher wait for it.
    async def freeze_redis(self) -> None:
        assert self.redis.proc is not None
        os.kill(self.redis.proc.pid, signal.SIGSTOP)
        try:
            await self.watch(FREEZE_REDIS_S)
        finally:
            os.kill(self.redis.proc.pid, signal.SIGCONT)

    # 5. The broker crashes and comes back where it was, with its data.
    async def restart_the_broker(self) -> None:
        self.kafka.kill()
        await self.watch(BROKER_DOWN_S)
        await asyncio.to_thread(self.kafka.restart)

    def faults(self) -> list[Callable[[], Awaitable[None]]]:
        return [self.kill_a_worker, self.a_worker_joins, self.freeze_a_worker, self.freeze_redis,
                self.restart_the_broker]


@dataclass(frozen=True)
class Money:
    """What the judge answered, by its own count - tokens and their cost at PRICES (nanos, each
    call rounded up as the worker rounds it) - and the most one reservation holds back: the
    ceiling of the largest prompt the judge was sent, and its cost."""

    tokens: int
    cost: int
    ceiling: int
    cost_ceiling: int

    @classmethod
    def of(cls, judge: JudgeServer) -> Money:
        prices = parse_prices(orjson.dumps(PRICES).decode())
        calls = list(judge.usages)
        cost = sum(nanos(call_cost(prices, "gpt-4o-mini", TokenUsage(p, c)) or 0.0) for p, c in calls)
        ceiling = max(sum(len(str(m["content"]).encode()) + MESSAGE_OVERHEAD_TOKENS for m in r["messages"])
                      for r in judge.requests) + ANSWER_MAX_TOKENS
        rates = Pricing(prices, "gpt-4o-mini").rates([Judge(id="j", name="j", criteria="c")], ANSWER_MAX_TOKENS)
        return cls(sum(p + c for p, c in calls), cost, ceiling, rates.cost(1, ceiling))


def repeated_calls(judge: JudgeServer) -> int:
    return sum(calls - 1 for calls in judge.calls_by_key.values() if calls > 1)


# --- The test ------------------------------------------------------------------------------------

async def test_workers_ride_out_kills_joins_freezes_and_outages(
        own_kafka: LocalKafka, own_redis: LocalRedis, unique: str, tmp_path: Path) -> None:
    # 1. The catalog in the test's Redis; the traces topic with room for three workers.
    redis = Redis.from_url(own_redis.url)
    await MonitorClient(redis).apply(CATALOG)
    await redis.aclose()
    bootstrap = own_kafka.bootstrap
    env = worker_env(bootstrap, own_redis.url, f"chaos-{unique}", max_in_flight=MAX_IN_FLIGHT,
                     claim_lease_s=CLAIM_LEASE_S, member_deadline_s=MEMBER_DEADLINE_S,
                     judge_timeout_s=JUDGE_TIMEOUT_S, commit_interval_s=0.5, redis_timeout_s=1,
                     topic_partitions=PARTITIONS, shutdown_timeout_s=10, judge_prices=orjson.dumps(PRICES).decode())
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(env["SGW_TRACES_TOPIC"], num_partitions=PARTITIONS, replication_factor=1)])
    await admin.close()

    with JudgeServer() as judge:
        judge.set_default(Behaviour.deterministic(delay=JUDGE_DELAY_S))
        env["SGW_JUDGE_BASE_URL"] = judge.base_url
        chaos = Chaos(kafka=own_kafka, redis=own_redis, env=env, log_dir=tmp_path)
        tail = RatingsTail(bootstrap, env["SGW_RATINGS_TOPIC"])
        began = time.monotonic()
        try:
            # 2. Two workers; then, per round, a backlog and the faults, each let loose once a
            #    share of the round's pairs is rated (so it hits workers at work).
            await asyncio.gather(*(chaos.start_worker() for _ in range(WORKERS)))
            tail.start()
            for round_ in range(ROUNDS):
                first = round_ * TRACES_PER_ROUND
                await produce(bootstrap, env["SGW_TRACES_TOPIC"], [trace(i) for i in range(first, first + TRACES_PER_ROUND)])
                for fault, share in zip(chaos.faults(), FAULT_AT, strict=True):
                    await tail.wait_for(int((first + share * TRACES_PER_ROUND) * len(GROUPS)), 120, chaos.check_running)
                    before, repeats_before, at = len(tail.pairs), repeated_calls(judge), time.monotonic()
                    await fault()
                    chaos.check_running()
                    print(f"chaos: round {round_ + 1}, {fault.__name__}: hit at {before} pairs rated, "
                          f"took {time.monotonic() - at:.1f}s, repeated judge calls before it {repeats_before}, "
                          f"{time.monotonic() - began:.0f}s in")

            # 3. Everything rated, and committed to the end of the traces topic.
            pairs = ROUNDS * TRACES_PER_ROUND * len(GROUPS)
            await tail.wait_for(pairs, 120, chaos.check_running)
            await wait_committed(bootstrap, env, PARTITIONS, chaos.check_running)
            chaos.check_running()
            print(f"chaos: every pair rated and committed {time.monotonic() - began:.0f}s in")
        finally:
            # 4. Every worker the test did not kill stops on SIGTERM, with exit code 0.
            await tail.stop()
            exits = {w.name: chaos.stop(w) for w in chaos.running}
        repeats = repeated_calls(judge)
        never_judged = ROUNDS * TRACES_PER_ROUND - len(judge.calls_by_key)
        made = sum(judge.calls_by_key.values())
        redis = Redis.from_url(env["SGW_REDIS_URL"])
        claims = Claims(redis)
        paid = await claims.budget_used("p-chaos", 86400)
        tokens_used, cost_used = await claims.tokens_used("p-chaos", 86400), await claims.cost_used("p-chaos", 86400)
        await redis.aclose()
        money = Money.of(judge)

    # 5. What was published: every pair, one id and one value each, the expected value.
    ratings = await read_everything(bootstrap, env["SGW_RATINGS_TOPIC"], PARTITIONS)
    ids: dict[tuple[str, str], set[str]] = defaultdict(set)
    values: dict[tuple[str, str], set[Any]] = defaultdict(set)
    for r in ratings:
        ids[r["traceId"], r["groupId"]].add(r["id"])
        values[r["traceId"], r["groupId"]].add(r["rating"])
    wanted = {(f"c-{i}", g) for i in range(ROUNDS * TRACES_PER_ROUND) for g in GROUPS}
    missing = len(wanted - set(ids))
    duplicate_ids = sum(len(v) > 1 for v in ids.values())
    differing = {pair for pair, v in values.items() if len(v) > 1}
    wrong = [r for r in ratings if r["rating"] != expected_rating(r["traceId"], r["groupId"])]
    # A worker that resumes from a freeze finds its members' deadlines passed on the clock. A pause
    # is not a timeout: such pairs are handed back and scored afresh (consumers/pauses.py), so a
    # "timed out" from a freeze is a failure like any other wrong value.
    timed_out_in_freeze = [r for r in wrong if chaos.stale_after_freeze(r)]
    differing_by_freeze = differing & {(r["traceId"], r["groupId"]) for r in timed_out_in_freeze}
    rescored = chaos.rescored
    failed_exits = {name: code for name, code in exits.items() if code != 0}
    lag_after_stop = await commit_lag(bootstrap, env["SGW_TRACES_TOPIC"], env["SGW_CONSUMER_GROUP"], PARTITIONS)
    print(f"chaos: rounds={ROUNDS} pairs={len(wanted)} missing={missing} duplicate_ids={duplicate_ids} "
          f"differing_values={len(differing)} (by a frozen worker: {len(differing_by_freeze)}) "
          f"wrong_values={len(wrong)} (timed out in a freeze: {len(timed_out_in_freeze)}) "
          f"rescored_after_a_pause={rescored} "
          f"republished={len(ratings) - len(ids)} repeated_judge_calls={repeats} (bound {REPEAT_BOUND}) "
          f"judge_calls_made={made} budget_slots_taken={paid} "
          f"never_judged={never_judged} exits={len(failed_exits)} commit_lag={lag_after_stop} "
          f"workers={chaos.started} wall={time.monotonic() - began:.0f}s")
    print(f"chaos: not ready because: {sorted(chaos.not_ready_seen)}")
    for r in wrong[:3]:
        print(f"chaos: wrong value {r['traceId']}/{r['groupId']} {r['id']}: {r['rating']} at {r['scoredAt']} "
              f"({r['reason']}; {[m['detail'] for m in r['members']]})")

    assert missing == 0, "every (trace, group) pair has a rating"
    assert duplicate_ids == 0, "one rating id per pair"
    assert not differing, f"one value per pair; not for {sorted(differing)[:5]}"
    assert not wrong, "each pair's value is the one its scorers give; not these: " + "; ".join(
        f"{r['traceId']}/{r['groupId']}: {r['rating']} at {r['scoredAt']} ({r['reason']})" for r in wrong[:5])
    assert repeats <= REPEAT_BOUND, "judge calls repeated only for work in flight when a fault hit"
    # The budget counts HTTP calls made (retries included), never fewer: a slot for every call.
    assert made <= paid, f"{made} judge calls made, {paid} budget slots taken"
    assert never_judged == 0, "every trace was judged"
    unsettled = paid - ROUNDS * TRACES_PER_ROUND  # slots beyond one per judged pair: at most this many never settled
    print(f"chaos: money tokens_used={tokens_used} answered={money.tokens} (+ at most {unsettled} x {money.ceiling}) "
          f"cost_used={cost_used} nanos answered={money.cost} (+ at most {unsettled} x {money.cost_ceiling})")
    assert money.tokens <= tokens_used <= money.tokens + unsettled * money.ceiling, "tokens: what was answered"
    assert money.cost <= cost_used <= money.cost + unsettled * money.cost_ceiling, "money: what was answered"
    assert not failed_exits, "\n\n".join(f"{w.name}: {failed_exits[w.name]}\n{w.logs()}"
                                         for w in chaos.running if w.name in failed_exits)
    assert lag_after_stop == 0, "the committed offsets reach the end of the traces topic"
