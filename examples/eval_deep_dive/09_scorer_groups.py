"""Scorer groups, end to end, as the spec shows them - with the SDK only:

1. two LLM judges and a PII pattern, blended into one group, "Release quality bar";
2. a dataset run graded by the group, gated in CI on the group score and on a judge;
3. the same group scoring live traffic: traces sent to the ingest topic, the ratings history
   read back, and the Signal a below-threshold trace raises, keyed ``scorer-group:<id>``.

Run it with ``./dev example 09``: Kafka, Redis, the worker, the API and a local judge are
started for it. It reads SCORER_GROUPS_URL and SCORER_GROUPS_API_KEY (the API), and
KAFKA_BOOTSTRAP, TRACES_TOPIC, SIGNALS_TOPIC and PROJECT_ID for the live part - where your agent
platform ingests traces. The local judge rates an answer by the ``[[rating@model=N]]`` markers
in it, so the verdicts below are predictable.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from scorer_groups import Client, GateFailed

client = Client(os.environ["SCORER_GROUPS_URL"], os.environ["SCORER_GROUPS_API_KEY"])
run_tag = uuid.uuid4().hex[:6]


def say(title: str, *lines: object) -> None:
    print(f"\n== {title}")
    for line in lines:
        print(f"   {line}")


# --- 1. The scorers and the group ----------------------------------------------------------------

quality = client.monitor.judges.create(name="Quality", criteria="Is the answer helpful and correct?",
                                       model="quality-model")
safety = client.monitor.judges.create(name="Safety", criteria="Is the answer safe to send?", model="safety-model")
pii = client.monitor.patterns.create(name="PII", polarity="failure", template="email")

group = client.monitor.scorer_groups.create(
    f"Release quality bar {run_tag}",
    members=[
        {"kind": "judge",   "refId": quality.id, "weight": 1, "gate": False},
        {"kind": "judge",   "refId": safety.id,  "weight": 1, "gate": True},   # must pass
        {"kind": "pattern", "refId": pii.id,     "weight": 0, "gate": True},   # gate only
    ],
)
say("The group", f"{group.name} ({group.id}): " + ", ".join(f"{m.label} w{m.weight:g}{' [must pass]' if m.gate else ''}"
                                                             for m in group.members))

# --- 2. A dataset run graded by the group, gated as CI would -------------------------------------

dataset = client.datasets.create(f"Release questions {run_tag}", rows=[
    {"input": "What is 2+2?", "expected": "4"},
    {"input": "Capital of France?"},
    {"input": "Say hi"},
])


def my_agent(question: str) -> str:
    """Your agent. This one answers well; the markers tell the local judge what to rate."""
    return f"A careful answer to {question!r}. [[rating@quality-model=8]] [[rating@safety-model=9]]"


run = client.evaluations.run(
    dataset_id=dataset.id,
    subject={"kind": "custom_agent", "displayName": "my-agent"},
    scorer_group_id=group.id,
).execute(my_agent).finalize()
say("Dataset run", *run.breakdown)
say("Per row: judges as verdicts, the pattern as a scorer row",
    *(f"row {i}: " + ", ".join(f"{j['label']} {j['rating']}" for j in judges)
      + " | " + ", ".join(f"{s['name']} matched={s['native']}" for s in scorers)
      for i, (judges, scorers) in enumerate(zip(run.judge_scorer_results, run.scorer_rows, strict=True))))

print(f"\n   gate on the group score: passed at {run.gate(fail_under=7):.2f} >= 7")
try:
    run.gate(fail_under=9.5, scorer="Safety")
except GateFailed as failed:
    print(f"   gate on Safety at 9.5: {failed} (shortfall {failed.shortfall:.2f})")

# --- 3. Live traffic --------------------------------------------------------------------------------

client.monitor.scorer_groups.update(group.id, online={
    "enabled": True,
    "sampleRate": 1.0,        # every trace, for the example (the sample dial is the cost dial)
    "alertThreshold": 6,      # Signal when the GROUP score lands below 6/10
    "severity": "high",
})
time.sleep(2)  # workers pick a catalog change up within a second

TRACES = [
    ("Where is my order?", "It shipped yesterday. [[rating@quality-model=9]] [[rating@safety-model=9]]"),
    ("Who handled my complaint?",  # PII: the must-pass pattern zeroes the group, a Signal is raised
     "That was anna.berg@example.com. [[rating@quality-model=8]] [[rating@safety-model=8]]"),
    ("The app crashes", "Try again later. [[rating@quality-model=4]] [[rating@safety-model=9]]"),
]


async def send_traces() -> list[str]:
    """What an agent platform does: every trace to the ingest topic."""
    producer = AIOKafkaProducer(bootstrap_servers=os.environ["KAFKA_BOOTSTRAP"])
    await producer.start()
    ids = []
    try:
        for n, (question, answer) in enumerate(TRACES):
            trace_id = f"trace-{run_tag}-{n}"
            ids.append(trace_id)
            trace = {"traceId": trace_id, "projectId": os.environ["PROJECT_ID"], "agentId": "support-bot",
                     "timestamp": datetime.now(UTC).isoformat(),
                     "spans": [{"spanId": "root", "name": "agent.run", "input": question, "output": answer}]}
            await producer.send_and_wait(os.environ["TRACES_TOPIC"], json.dumps(trace).encode(), key=trace_id.encode())
    finally:
        await producer.stop()
    return ids


async def signals_of(group_id: str, until: float) -> list[dict[str, object]]:
    """The Signals topic, as an alerting pipeline reads it, for this group's key."""
    consumer = AIOKafkaConsumer(os.environ["SIGNALS_TOPIC"], bootstrap_servers=os.environ["KAFKA_BOOTSTRAP"],
                                auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    found: list[dict[str, object]] = []
    try:
        while time.monotonic() < until and not found:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                found += [s for s in (json.loads(r.value) for r in records) if s["key"] == f"scorer-group:{group_id}"]
    finally:
        await consumer.stop()
    return found


trace_ids = asyncio.run(send_traces())
deadline = time.monotonic() + 90
history = client.monitor.scorer_groups.ratings(group.id, window="1h")
while history.count < len(TRACES) and time.monotonic() < deadline:
    time.sleep(0.5)
    history = client.monitor.scorer_groups.ratings(group.id, window="1h")
say("Ratings history (what the group's ratings chart draws), last hour",
    f"{history.count} results, {history.scored} scored, mean "
    f"{'-' if history.mean is None else f'{history.mean:.2f}'}, "
    f"{history.below_threshold} below the threshold")
signals = asyncio.run(signals_of(group.id, deadline))
say("Signals raised (they page the agent's webhook channels)",
    *(f"{s['key']} {s['severity']}: {s['rating']:.2f} < {s['alertThreshold']} on {s['traceId']} - "
      f"{str(s['justification'])[:90]}" for s in signals))
client.close()
sys.exit(0 if history.count >= len(TRACES) and signals else 1)
