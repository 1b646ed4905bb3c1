"""A session-scoped scorer group: a whole conversation judged as one unit once it goes quiet.

1. a judge and an apology tripwire pattern in a group whose online profile has
   ``scope: "session"`` and a short ``idleSeconds``;
2. a three-turn conversation sent as traces that share a ``sessionId`` - no trace is scored on
   its own;
3. once the conversation has been quiet for ``idleSeconds``, the sweep judges it, and
   ``sessions.scores`` reads the verdict back.

Run it with ``./dev example 10`` (Kafka, Redis, the worker, the API and a local judge are
started for it). It reads SCORER_GROUPS_URL, SCORER_GROUPS_API_KEY, KAFKA_BOOTSTRAP,
TRACES_TOPIC and PROJECT_ID.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaProducer

from scorer_groups import Client

client = Client(os.environ["SCORER_GROUPS_URL"], os.environ["SCORER_GROUPS_API_KEY"])
run_tag = uuid.uuid4().hex[:6]

coherence = client.monitor.judges.create(
    name="Coherence", criteria="Does the agent stay consistent across turns and resolve the user's need?",
    model="coherence-model")
apology = client.monitor.patterns.create(name="Apology", polarity="failure", template="apology")
group = client.monitor.scorer_groups.create(f"Conversation quality {run_tag}", members=[
    {"kind": "judge",   "refId": coherence.id, "weight": 1, "gate": False},
    {"kind": "pattern", "refId": apology.id,   "weight": 0, "gate": True},   # an apology anywhere zeroes it
])
client.monitor.scorer_groups.update(group.id, online={
    "enabled": True,
    "sampleRate": 1.0,        # of eligible idle sessions
    "scope": "session",
    "idleSeconds": 2,         # judge once quiet for 2 seconds (120 by default)
    "alertThreshold": 6,
    "severity": "high",
})
print(f"\n== The group: {group.name} ({group.id}), scope session, idle 2 s")
time.sleep(2)  # workers pick a catalog change up within a second

session_id = f"session-{run_tag}"
TURNS = [
    ("I want to change my delivery address.", "Sure - what is the new address?"),
    ("Baker Street 221b, London.", "Done: your order now goes to Baker Street 221b."),
    ("And the delivery date?", "It arrives on Friday, as before. [[rating@coherence-model=8]]"),
]


async def send_conversation() -> None:
    producer = AIOKafkaProducer(bootstrap_servers=os.environ["KAFKA_BOOTSTRAP"])
    await producer.start()
    started = datetime.now(UTC)
    try:
        for n, (user, agent) in enumerate(TURNS):
            trace = {"traceId": f"{session_id}-turn-{n}", "projectId": os.environ["PROJECT_ID"],
                     "agentId": "support-bot", "sessionId": session_id,
                     "timestamp": (started + timedelta(seconds=n)).isoformat(),
                     "spans": [{"spanId": "root", "name": "agent.turn", "input": user, "output": agent}]}
            await producer.send_and_wait(os.environ["TRACES_TOPIC"], json.dumps(trace).encode(),
                                         key=session_id.encode())
    finally:
        await producer.stop()


asyncio.run(send_conversation())
print(f"   sent {len(TURNS)} turns of {session_id}")
print(f"   right away: sessions.scores -> {client.monitor.sessions.scores(session_id)}  (still inside its idle window)")

deadline = time.monotonic() + 90
scores = client.monitor.sessions.scores(session_id)
while not scores and time.monotonic() < deadline:
    time.sleep(0.5)
    scores = client.monitor.sessions.scores(session_id)
print("\n== Once quiet, the conversation's verdict (sessions.scores):")
for score in scores:
    print(f"   {score['kind']}: {score['rating']} - {score['justification'][:120]}")
client.close()
sys.exit(0 if scores else 1)
