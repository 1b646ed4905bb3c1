"""The limit: a plain aiokafka stage, the least any consumer of the topic does per trace.

    python -m tests.bench.limit_stage BOOTSTRAP TOPIC OUT_TOPIC GROUP_ID GROUPS

Fetch a batch, orjson-decode every trace, produce one ~1 KB record per trace and group, wait
for the broker's acknowledgements, commit; until SIGTERM. Run as its own process so that its
CPU and memory are measured like the worker's.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

PADDING = "x" * 800  # with the fields below, about 1 KB per output record


async def run(bootstrap: str, topic: str, out: str, group_id: str, groups: int) -> None:
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
                    trace = orjson.loads(record.value)
                    for g in range(groups):
                        value = orjson.dumps({"traceId": trace["traceId"], "projectId": trace["projectId"],
                                              "groupId": f"g{g}", "rating": 7.5, "padding": PADDING})
                        acks.append(await producer.send(out, key=record.key, value=value))
            if acks:
                await asyncio.gather(*acks)
                await consumer.commit()
    finally:
        await producer.stop()
        await consumer.stop()


if __name__ == "__main__":
    bootstrap, topic, out, group_id, groups = sys.argv[1:6]
    asyncio.run(run(bootstrap, topic, out, group_id, int(groups)))
