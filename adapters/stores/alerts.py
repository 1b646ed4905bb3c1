"""Which no-score Signals are due: at most one per group and interval.

A group whose must-pass member cannot score (a judge outage, a deleted reference, no sandbox)
has no score on every result, so no below-threshold Signal: the broken gate would go quiet.
The first result without a score raises one Signal (reason "no_score"); later ones within the
interval raise none. Each claim stores the Signal's id, derived from the result's rating id, so
a result delivered again (at-least-once) raises the same Signal again - which receivers dedupe
on - and never a second one. On PagerDuty channels the Signal opens the group's incident, and
the first result back at or over the threshold resolves it, as for any Signal.
"""

from __future__ import annotations

from collections import defaultdict

from adapters.stores import keys
from adapters.stores.client import RedisClient
from adapters.stores.scripts import ScriptPipeline

# KEYS: one alert key per group; ARGV: the candidate Signal id per key, then the interval (s).
# 1 where the Signal is due: the interval was free (claimed now) or claimed by this same Signal.
_DUE = """
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, ARGV[i], 'NX', 'EX', ARGV[#KEYS + 1]) then
    out[i] = 1
  elseif redis.call('GET', key) == ARGV[i] then
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""


class NoScoreAlerts:
    def __init__(self, redis: RedisClient, interval_s: int = 3600) -> None:
        self._redis = redis
        self._interval_s = interval_s
        self._due = redis.register_script(_DUE)

    async def due(self, candidates: list[tuple[str, str, str]]) -> set[str]:
        """Of ``candidates`` - (project, group, Signal id), in order - the Signal ids to raise:
        one script call per project, pipelined."""
        if not candidates:
            return set()
        by_project: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for project, group, signal_id in candidates:
            by_project[project].append((group, signal_id))
        async with ScriptPipeline(self._redis) as pipe:
            for project, pairs in by_project.items():
                pipe.script(self._due, [keys.no_score_alert(project, g) for g, _ in pairs],
                            [*(s for _, s in pairs), self._interval_s])
            replies = await pipe.execute()
        return {signal_id for pairs, flags in zip(by_project.values(), replies, strict=True)
                for (_, signal_id), flag in zip(pairs, flags, strict=True) if flag == 1}
