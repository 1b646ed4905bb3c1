"""Review queues' items in Redis (issue 55): taken when their result is published, one script call
per queue, pipelined - one round trip for a batch of results whatever the queues.

Taking an item (``_TAKE``), for each item of the call, in order:

1. an item already there (its result published again: a redelivery, a worker that died before
   its done mark) is left as it is - open, held or done - and counts nothing;
2. a queue with ``capacity`` open items turns the item away and counts it: what people have not
   reached yet is not pushed out by what came after it;
3. else the item is kept, and open (oldest first);
4. items taken more than the queue's ``keepDays`` ago go, open or done, and the keys' TTL is
   pushed to ``keepDays`` (a deleted queue's keys expire then).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from scorer_groups.review_queues import ReviewItem, ReviewQueue
from scoring.stores import keys
from scoring.stores.client import RedisClient
from scoring.stores.scripts import ScriptPipeline

DAY_S = 86_400

# KEYS: items, open, created, counts. ARGV: capacity, now, keep seconds, then (id, document) pairs.
# Returns {taken, turned away}.
_TAKE = """
local capacity, now, keep = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - keep, 'LIMIT', 0, 100)
for _, id in ipairs(old) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
local taken, away = 0, 0
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HEXISTS', KEYS[1], id) == 0 then
    if redis.call('ZCARD', KEYS[2]) >= capacity then
      away = away + 1
    else
      redis.call('HSET', KEYS[1], id, ARGV[i + 1])
      redis.call('ZADD', KEYS[2], now, id)
      redis.call('ZADD', KEYS[3], now, id)
      taken = taken + 1
    end
  end
end
if taken > 0 then redis.call('HINCRBY', KEYS[4], 'taken', taken) end
if away > 0 then redis.call('HINCRBY', KEYS[4], 'turnedAway', away) end
for k = 1, 4 do redis.call('EXPIRE', KEYS[k], keep) end
return {taken, away}
"""


@dataclass(frozen=True)
class Taken:
    """What a batch did to one queue."""

    queue_id: str
    project_id: str
    taken: int
    turned_away: int


class ReviewItems:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._take = redis.register_script(_TAKE)

    async def take(self, items: Sequence[tuple[ReviewItem, ReviewQueue]], now: float) -> list[Taken]:
        """Keep ``items`` in their queues (each with its queue as the snapshot that decided it had
        it: capacity, keepDays); one round trip."""
        by_queue: dict[str, list[ReviewItem]] = defaultdict(list)
        queues: dict[str, ReviewQueue] = {}
        for item, queue in items:
            by_queue[queue.id].append(item)
            queues[queue.id] = queue
        if not by_queue:
            return []
        async with ScriptPipeline(self._redis) as pipe:
            for queue_id, of_queue in by_queue.items():
                queue = queues[queue_id]
                args: list[object] = [queue.capacity, now, queue.keep_days * DAY_S]
                for item in of_queue:
                    args += [item.id, item.to_json()]
                pipe.script(self._take, [keys.review_items(queue_id), keys.review_open(queue_id),
                                         keys.review_created(queue_id), keys.review_counts(queue_id)], args)
            replies = await pipe.execute()
        return [Taken(queue_id, queues[queue_id].project_id, int(reply[0]), int(reply[1]))
                for queue_id, reply in zip(by_queue, replies, strict=True)]

    async def page(self, queue_id: str, *, state: str = "open", limit: int = 50,
                   cursor: int = 0) -> tuple[list[ReviewItem], int | None]:
        """Open items oldest first (``state`` "open"), or every item newest first ("all")."""
        ids: list[bytes]
        if state == "open":
            ids = cast(list[bytes], await self._redis.zrange(keys.review_open(queue_id), cursor, cursor + limit))
        else:
            ids = cast(list[bytes], await self._redis.zrevrange(keys.review_created(queue_id), cursor,
                                                                cursor + limit))
        more = len(ids) > limit
        ids = ids[:limit]
        documents = await self._redis.hmget(keys.review_items(queue_id), ids) if ids else []
        items = [ReviewItem.model_validate_json(d) for d in documents if d is not None]
        return items, (cursor + limit if more else None)

    async def counts(self, queue_id: str) -> dict[str, int]:
        """Open items now; taken and turned away since the queue began."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zcard(keys.review_open(queue_id))
            pipe.hgetall(keys.review_counts(queue_id))
            open_now, counts = await pipe.execute()
        named = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in counts.items()}
        return {"open": int(open_now), "taken": named.get("taken", 0), "turnedAway": named.get("turnedAway", 0)}
