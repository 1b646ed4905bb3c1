"""How long the event loop was held: a ticker due every ``TICK_S`` observes how late it ran.

One coroutine that holds the loop (a parse on the loop, a blocking call, a long pure-Python step)
holds every other one in the process: the API answers nothing, the worker scores nothing and its
Kafka heartbeats wait. Request latencies show that only for requests that were being answered,
and a client's own timing adds its own process's delays; the lateness of a ticker inside the
process is the loop's own account. Exported as ``sgw_event_loop_stall_seconds`` by the worker
and by the API.
"""

from __future__ import annotations

import asyncio

from worker.metrics import EVENT_LOOP_STALL

TICK_S = 0.1  # ten observations a second: cheap, and fine enough for stalls that matter (>= 0.1 s)


async def watch_loop_stalls(stop: asyncio.Event) -> None:
    """Observe the loop's lateness every ``TICK_S`` until ``stop``."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + TICK_S
        await asyncio.sleep(TICK_S)
        EVENT_LOOP_STALL.observe(max(0.0, loop.time() - due))
