"""Chaos on clusters: workers share a backlog on a replicated Kafka cluster (three KRaft brokers)
and a Redis Cluster (three primaries, a replica each) while a Redis primary and a Kafka broker
fail over under them.

Two `scorer-worker run` processes (``SGW_REDIS_CLUSTER=true``) consume a backlog of traces,
scored by a judge group (one call to the local judge per trace), a deterministic group whose
low scores raise Signals delivered by webhook to a local receiver, and a session group that
judges each conversation (four turns) once it is quiet. While they work, in this order:

1. one worker is killed (SIGKILL);
2. a new worker joins the consumer group;
3. the Redis primary holding the project's claims is killed (SIGKILL): its replica is promoted
   after the cluster's node timeout, and the workers find it by themselves;
4. the broker leading most traces partitions is killed (SIGKILL), then restarted;
5. the killed Redis node is restarted, and rejoins as a replica.

Then, from the ratings and signals topics, the judge's count of calls and the receiver:

- no pair is missing (every trace pair, and every conversation judged whole, at four turns);
- one rating id and one value per pair (a conversation judged again at a new length is a new
  pair), the expected value;
- judge calls are repeated only for work in flight when a fault hit, and every call took a
  budget slot; a Redis failover may lose the writes of its last moments (asynchronous
  replication), so the bound counts the pairs in flight then too;
- every Signal raised was delivered to its channel;
- no worker exits, every worker the test did not kill exits 0 on SIGTERM, and the consumer
  group's offsets reach the end of the traces topic.

In ./dev test one round (about 2 minutes); ``./dev chaos --cluster`` runs SGW_CHAOS_ROUNDS.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from redis.asyncio.cluster import RedisCluster

from adapters.stores import keys
from adapters.stores.claims import Claims
from devtools.judge_server import Behaviour, JudgeServer
from devtools.redis_servers import LocalRedis, LocalRedisCluster
from devtools.services import LocalKafkaCluster
from scoring.claim_request import day_of
from services.groups import MonitorClient
from tests.support.chaos import RatingsTail, Workers, commit_lag, read_everything, wait_committed
from tests.support.harness import produce, worker_env
from tests.support.http_fakes import Reply, ScriptedServer

ROUNDS = int(os.environ.get("SGW_CHAOS_ROUNDS", "1"))
pytestmark = [pytest.mark.integration, pytest.mark.alone, pytest.mark.timeout(240 + 180 * ROUNDS)]

TRACES_PER_ROUND = 1600
TURNS = 4  # traces per conversation
TRACE_GROUPS = ("judged", "deterministic")
JUDGE_DELAY_S = 0.3
MAX_IN_FLIGHT = 12
PARTITIONS = 6
WORKERS = 2
FAULTS = ("kill -9 a worker", "a worker joins", "kill a Redis primary", "kill and restart the broker",
          "restart the Redis node")
FAULT_AT = (0.05, 0.06, 0.20, 0.40, 0.55)
BROKER_DOWN_S = 2
# Repeated judge calls: what every worker has in flight, per fault; and as many again for a Redis
# failover, whose last acknowledged writes (leases, done marks) the replica may not have had.
REPEAT_BOUND = ROUNDS * (len(FAULTS) + 1) * WORKERS * MAX_IN_FLIGHT * 2
# A delivery whose attempt a fault cut is retried soon, so the test can wait for every one.
WEBHOOK_RETRIES, DELIVERY_WAIT_S = "1s,2s,4s,8s", 60
CLAIM_LEASE_S, MEMBER_DEADLINE_S, JUDGE_TIMEOUT_S = 4, 3, 2.5
PROJECT = "p-chaos"

CATALOG: dict[str, Any] = {
    "judges": [{"id": "quality", "name": "Quality", "criteria": "Helpful?"}],
    "patterns": [{"id": "apology", "name": "Apology", "polarity": "failure", "template": "apology"}],
    "groups": [
        {"id": "judged", "name": "Judged", "projectId": PROJECT,
         "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 0, "severity": "low"},
         "members": [{"kind": "judge", "refId": "quality", "weight": 1, "gate": False}]},
        {"id": "deterministic", "name": "Deterministic", "projectId": PROJECT,
         "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 5, "severity": "low"},
         "members": [{"kind": "pattern", "refId": "apology", "weight": 1, "gate": False}]},
        {"id": "conversation", "name": "Conversation", "projectId": PROJECT,
         "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 0, "severity": "low",
                    "scope": "session", "idleSeconds": 2},
         "members": [{"kind": "judge", "refId": "quality", "weight": 1, "gate": False}]},
    ],
    "budgets": [{"projectId": PROJECT, "judgeCallsPerWindow": 10_000_000, "windowSeconds": 86400}],
}


def trace(i: int) -> tuple[bytes, bytes]:
    """Trace ``c-i``, turn ``i % TURNS`` of conversation ``cs-(i // TURNS)``: the judge rates every
    turn of a conversation alike (so the conversation too, whatever turns it has) and counts the
    call under the trace; every third trace apologises (the deterministic group: 0, a Signal)."""
    conversation = i // TURNS
    output = f"answer {i} [[rating={conversation % 11}]] [[key=c-{i}]]" + (" I'm sorry" if i % 3 == 0 else "")
    return f"c-{i}".encode(), orjson.dumps({
        "traceId": f"c-{i}", "projectId": PROJECT, "agentId": "a", "sessionId": f"cs-{conversation}",
        "timestamp": f"2026-12-02T13:00:{i % 60:02d}Z",
        "spans": [{"spanId": "r", "input": "q", "output": output}]})


def pair_of(rating: dict[str, Any]) -> tuple[Any, ...]:
    if rating["scope"] == "session":
        return rating["sessionId"], rating["turns"], rating["groupId"]
    return rating["traceId"], rating["groupId"]


def expected_rating(rating: dict[str, Any]) -> float:
    if rating["scope"] == "session":
        return float(int(rating["sessionId"].removeprefix("cs-")) % 11)
    i = int(rating["traceId"].removeprefix("c-"))
    if rating["groupId"] == "judged":
        return float(i // TURNS % 11)
    return 0.0 if i % 3 == 0 else 10.0


@dataclass(kw_only=True)
class ClusterChaos(Workers):
    kafka: LocalKafkaCluster
    redis: LocalRedisCluster
    redis_killed: LocalRedis | None = None
    failover_s: float = 0.0

    # 3. The primary holding the project's claims crashes; its replica takes over.
    async def kill_a_redis_primary(self) -> None:
        hot = keys.dedupe_claims(PROJECT, day_of(time.time()))
        self.redis_killed = self.redis.kill_primary_of(hot)
        self.failover_s = await asyncio.to_thread(self.redis.wait_promoted, hot, self.redis_killed)
        await self.watch(1)

    # 4. The broker leading most traces partitions crashes, and comes back with its data.
    async def restart_the_traces_leader(self) -> None:
        leader = await leader_of_most(self.kafka.bootstrap, self.env["SGW_TRACES_TOPIC"])
        self.kafka.kill(leader)
        await self.watch(BROKER_DOWN_S)
        await asyncio.to_thread(self.kafka.restart, leader)

    # 5. The crashed Redis node comes back, as a replica of the one promoted in its place.
    async def restart_the_redis_node(self) -> None:
        assert self.redis_killed is not None
        self.redis.restart(self.redis_killed)
        self.redis_killed = None
        await asyncio.to_thread(self.redis.wait_ready)

    def faults(self) -> list[Callable[[], Awaitable[None]]]:
        return [self.kill_a_worker, self.a_worker_joins, self.kill_a_redis_primary, self.restart_the_traces_leader,
                self.restart_the_redis_node]


async def leader_of_most(bootstrap: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    led: dict[int, int] = defaultdict(int)
    for partition in described["partitions"]:
        led[partition["leader"]] += 1
    return max(led, key=lambda node: led[node])


def delivered_ids(receiver: ScriptedServer) -> set[str]:
    return {json.loads(r.body)["data"]["id"] for r in receiver.requests if r.body}  # Standard Webhooks


async def deliveries_settled(bootstrap: str, env: dict[str, str], receiver: ScriptedServer,
                             check: Callable[[], None]) -> float:
    """Seconds until every Signal published has reached the receiver; a Signal still missing after
    DELIVERY_WAIT_S is left for the assertion to name."""
    began = time.monotonic()
    signals = {s["id"] for s in await read_everything(bootstrap, env["SGW_SIGNALS_TOPIC"], PARTITIONS)}
    while signals - delivered_ids(receiver) and time.monotonic() - began < DELIVERY_WAIT_S:
        check()
        await asyncio.sleep(0.5)
    return time.monotonic() - began


@pytest.fixture
def clusters() -> Iterator[tuple[LocalKafkaCluster, LocalRedisCluster]]:
    kafka = LocalKafkaCluster(nodes=3).start()
    try:
        redis = LocalRedisCluster().start()
        try:
            yield kafka, redis
        finally:
            redis.stop()
    finally:
        kafka.stop()


async def test_workers_ride_out_a_redis_primary_and_a_broker_failing_over(
        clusters: tuple[LocalKafkaCluster, LocalRedisCluster], unique: str, tmp_path: Path) -> None:
    kafka, redis_cluster = clusters
    bootstrap = kafka.bootstrap
    with JudgeServer() as judge, ScriptedServer(default=Reply(status=204, body=b"")) as receiver:
        # 1. The catalog (with the alert channel) on the cluster; the traces topic replicated.
        catalog = {**CATALOG, "channels": [{"agentId": "a", "url": f"{receiver.url}/hook"}]}
        client = RedisCluster.from_url(redis_cluster.url)
        await MonitorClient(client).apply(catalog)
        env = worker_env(bootstrap, redis_cluster.url, f"cchaos-{unique}", redis_cluster="true",
                         max_in_flight=MAX_IN_FLIGHT, claim_lease_s=CLAIM_LEASE_S,
                         member_deadline_s=MEMBER_DEADLINE_S, judge_timeout_s=JUDGE_TIMEOUT_S,
                         commit_interval_s=0.5, redis_timeout_s=1, topic_partitions=PARTITIONS,
                         shutdown_timeout_s=10, session_sweep_interval_s=1, egress_allow="127.0.0.0/8",
                         judge_base_url=judge.base_url, webhook_retry_schedule=WEBHOOK_RETRIES)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic(env["SGW_TRACES_TOPIC"], num_partitions=PARTITIONS,
                                            replication_factor=3, topic_configs={"min.insync.replicas": "2"})])
        await admin.close()
        judge.set_default(Behaviour.deterministic(delay=JUDGE_DELAY_S))
        chaos = ClusterChaos(kafka=kafka, redis=redis_cluster, env=env, log_dir=tmp_path)
        tail = RatingsTail(bootstrap, env["SGW_RATINGS_TOPIC"], pair_of=pair_of)
        began = time.monotonic()
        conversations = ROUNDS * TRACES_PER_ROUND // TURNS
        try:
            # 2. Two workers; per round, a backlog and the faults, each once a share is rated.
            await asyncio.gather(*(chaos.start_worker() for _ in range(WORKERS)))
            tail.start()
            for round_ in range(ROUNDS):
                first = round_ * TRACES_PER_ROUND
                await produce(bootstrap, env["SGW_TRACES_TOPIC"], [trace(i) for i in range(first, first + TRACES_PER_ROUND)])
                for fault, share in zip(chaos.faults(), FAULT_AT, strict=True):
                    await tail.wait_for(int((first + share * TRACES_PER_ROUND) * len(TRACE_GROUPS)), 150,
                                        chaos.check_running)
                    at = time.monotonic()
                    await fault()
                    chaos.check_running()
                    print(f"chaos-cluster: round {round_ + 1}, {fault.__name__}: took {time.monotonic() - at:.1f}s, "
                          f"{time.monotonic() - began:.0f}s in")

            # 3. Every trace pair and every conversation rated; committed to the end.
            await tail.wait_for_all({(f"c-{i}", g) for i in range(ROUNDS * TRACES_PER_ROUND) for g in TRACE_GROUPS}
                                    | {(f"cs-{s}", TURNS, "conversation") for s in range(conversations)}, 150,
                                    chaos.check_running)
            await wait_committed(bootstrap, env, PARTITIONS, chaos.check_running)
            settled_s = await deliveries_settled(bootstrap, env, receiver, chaos.check_running)
        finally:
            await tail.stop()
            if chaos.redis_killed is not None:
                redis_cluster.restart(chaos.redis_killed)
            exits = {w.name: chaos.stop(w) for w in chaos.running}
        made = sum(judge.calls_by_key.values())
        paid = await Claims(client).budget_used(PROJECT, 86400)
        await client.aclose()
        delivered = delivered_ids(receiver)

    # 4. What was published and delivered.
    ratings = await read_everything(bootstrap, env["SGW_RATINGS_TOPIC"], PARTITIONS)
    signals = await read_everything(bootstrap, env["SGW_SIGNALS_TOPIC"], PARTITIONS)
    ids: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    values: dict[tuple[Any, ...], set[Any]] = defaultdict(set)
    for r in ratings:
        ids[pair_of(r)].add(r["id"])
        values[pair_of(r)].add(r["rating"])
    wanted = {(f"c-{i}", g) for i in range(ROUNDS * TRACES_PER_ROUND) for g in TRACE_GROUPS}
    wanted |= {(f"cs-{s}", TURNS, "conversation") for s in range(conversations)}
    missing = len(wanted - set(ids))
    duplicate_ids = sum(len(v) > 1 for v in ids.values())
    differing = {pair for pair, v in values.items() if len(v) > 1}
    wrong = [r for r in ratings if r["rating"] != expected_rating(r)]
    session_pairs = sum(1 for pair in ids if len(pair) == 3)
    repeats = made - ROUNDS * TRACES_PER_ROUND - session_pairs  # calls beyond one per judged pair
    undelivered = {s["id"] for s in signals} - delivered
    failed_exits = {name: code for name, code in exits.items() if code != 0}
    lag_after_stop = await commit_lag(bootstrap, env["SGW_TRACES_TOPIC"], env["SGW_CONSUMER_GROUP"], PARTITIONS)
    print(f"chaos-cluster: rounds={ROUNDS} pairs={len(wanted)} missing={missing} duplicate_ids={duplicate_ids} "
          f"differing_values={len(differing)} wrong_values={len(wrong)} conversation_pairs={session_pairs} "
          f"republished={len(ratings) - len(ids)} repeated_judge_calls={repeats} (bound {REPEAT_BOUND}) "
          f"judge_calls_made={made} budget_slots_taken={paid} signals={len(signals)} "
          f"undelivered={len(undelivered)} redis_failover_s={chaos.failover_s:.1f} exits={len(failed_exits)} "
          f"commit_lag={lag_after_stop} workers={chaos.started} deliveries_settled={settled_s:.1f}s "
          f"wall={time.monotonic() - began:.0f}s")
    print(f"chaos-cluster: not ready because: {sorted(chaos.not_ready_seen)}")
    for r in wrong[:3]:
        print(f"chaos-cluster: wrong value {pair_of(r)} {r['id']}: {r['rating']} ({r['reason']})")

    assert missing == 0, f"every pair has a rating; not {sorted(wanted - set(ids))[:5]}"
    assert duplicate_ids == 0, "one rating id per pair"
    assert not differing, f"one value per pair; not for {sorted(differing)[:5]}"
    assert not wrong, "each pair's value is the one its scorers give"
    assert repeats <= REPEAT_BOUND, "judge calls repeated only for work in flight when a fault hit"
    assert made <= paid, f"{made} judge calls made, {paid} budget slots taken"
    assert signals and not undelivered, f"every Signal delivered; not {sorted(undelivered)[:5]}"
    assert not failed_exits, "\n\n".join(f"{w.name}: {failed_exits[w.name]}\n{w.logs()}"
                                         for w in chaos.running if w.name in failed_exits)
    assert lag_after_stop == 0, "the committed offsets reach the end of the traces topic"
