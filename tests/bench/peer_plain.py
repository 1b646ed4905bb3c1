"""The plain peer: the deterministic scenario as someone would write it in an afternoon, with no
project code at all - aiokafka, orjson, RE2 and the groups' arithmetic written inline.

    python -m tests.bench.peer_plain BOOTSTRAP TOPIC OUT_TOPIC GROUP_ID

Per trace: decode, take the root span's input and output, run the four patterns (RE2; the card
number confirmed by its Luhn checksum) and the length scorer as a Python function, blend each of
the two groups (must-pass gates, weighted average), produce one rating per group with its members,
wait for the broker's acknowledgements, commit. No validation, sandbox, dedupe, budget, history or
Signals: the floor that the worker's guarantees are measured against. Until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import orjson
import re2
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

EMAIL = re2.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
CARD = re2.compile(r"\b\d(?:[ -]?\d){12,18}\b")
APOLOGY = re2.compile(r"(?i)\b(?:i(?:'|’)?m (?:so |very |really )?sorry|i am (?:so |very |really )?sorry|"
                      r"i apologi[sz]e|(?:my|our) apologies|sorry (?:for|about) (?:the|that|any)|"
                      r"please accept (?:my|our) apolog)")


def luhn(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        d = ord(char) - 48
        if position % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def has_card(text: str) -> bool:
    for match in CARD.finditer(text):
        digits = "".join(c for c in match.group(0) if c.isdigit())
        if 13 <= len(digits) <= 19 and luhn(digits):
            return True
    return False


def blend(members: list[dict[str, Any]]) -> float:
    """Gates first (a failed one scores 0), else the weighted average of goodness, times 10."""
    if any(m["gate"] and m["goodness"] < 0.5 for m in members):
        return 0.0
    weight = sum(m["weight"] for m in members)
    return round(10 * sum(m["weight"] * m["goodness"] for m in members) / weight, 6)


def ratings(trace: dict[str, Any]) -> list[dict[str, Any]]:
    root = next((s for s in trace["spans"] if not s.get("parentSpanId")), trace["spans"][0])
    output = root.get("output") or ""
    apology = APOLOGY.search(output) is not None
    refund = any(k in output.casefold() for k in ("refund", "return label"))
    groups = {
        "patterns": [
            {"refId": "email", "weight": 0, "gate": True, "goodness": 0.0 if EMAIL.search(output) else 1.0},
            {"refId": "card", "weight": 0, "gate": True, "goodness": 0.0 if has_card(output) else 1.0},
            {"refId": "apology", "weight": 1, "gate": False, "goodness": 0.0 if apology else 1.0},
            {"refId": "refund", "weight": 1, "gate": False, "goodness": 1.0 if refund else 0.0}],
        "code": [
            {"refId": "length", "weight": 1, "gate": False, "goodness": min(1.0, len(output) / 600)},
            {"refId": "apology", "weight": 1, "gate": False, "goodness": 0.0 if apology else 1.0}],
    }
    return [{"traceId": trace["traceId"], "projectId": trace["projectId"], "agentId": trace["agentId"],
             "groupId": group, "rating": blend(members), "members": members}
            for group, members in groups.items()]


async def run(bootstrap: str, topic: str, out: str, group_id: str) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group_id,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=1 << 20)
    await consumer.start()
    await producer.start()
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200, max_records=1000)
            acks = []
            for records in batches.values():
                for record in records:
                    for rating in ratings(orjson.loads(record.value)):
                        acks.append(await producer.send(out, key=record.key, value=orjson.dumps(rating)))
            if acks:
                await asyncio.gather(*acks)
                await consumer.commit()
    finally:
        await producer.stop()
        await consumer.stop()


if __name__ == "__main__":
    asyncio.run(run(*sys.argv[1:5]))
