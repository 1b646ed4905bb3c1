"""Claims: pairs' dedupe and the judge-call budget, one module by design - one Redis round trip decides both.

One Lua call per project of a batch (pipelined) decides every pair atomically: done or skipped (nothing
again), busy (another worker's live lease), claimed (the group's judge calls reserved all or nothing) or
exhausted. The one rule: a group is never scored on a partial panel, and a pair another worker holds is
never counted finished before its done mark. The decisions and the keys: docs/design-notes.md.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from adapters.stores import keys
from adapters.stores.claim_scripts import CLAIM, CONFIRM, MARK_DONE, RELEASE, RESERVE
from adapters.stores.client import RedisClient
from adapters.stores.scripts import ScriptPipeline
from adapters.stores.verdicts import Paid
from scoring.claim_request import DAY_S, ClaimRequest
from scoring.frozen import frozen
from scoring.prices import NO_RATES
from scoring.verdict_cache import MAX_ENTRY_BYTES, CachePolicy

ClaimState = Literal["claimed", "done", "skipped", "busy", "exhausted"]

def claim_hash(request: ClaimRequest) -> str:
    """The hash a pair's claim is kept in: its project's, of its subject's day."""
    return keys.dedupe_claims(request.project_id, request.day)


def claim_field(request: ClaimRequest) -> str:
    """The pair's field in that hash."""
    return keys.dedupe_field(request.group_id, request.subject_key)


def done_mark(request: ClaimRequest, rating_id: str) -> str:
    """What a done pair keeps: its rating id, and the revision of the group that rated it."""
    return f"done:{rating_id}@{request.revision}" if request.revision else f"done:{rating_id}"


@frozen
class ClaimResult:
    state: ClaimState
    detail: str  # the stored value for done/busy ("done:<ratingId>"), budget used when exhausted
    # With verdict keys looked up: the claimed pair's keys it reserved a call for (this pair
    # pays for them), the calls and tokens it reserved, and the verdicts found stored (key, entry).
    leads: tuple[str, ...] = ()
    calls: int = 0
    tokens: int = 0
    cost: int = 0  # nanos, under a money cap
    cached: tuple[tuple[str, bytes], ...] = ()


# A pair's verdict cache keys to look up at claim time: (key, token ceiling of its call); a key of
# None is a call paid for elsewhere (under way in this process): nothing to look up or reserve.
VerdictLookup = Sequence[tuple[str | None, int]]


def new_owner() -> str:
    """A token naming this worker process in leases, unique across restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Claims:
    """The claims of one kind of work. ``fill`` is a backfill's: a pair counts as done only when
    it was rated under its group's current revision (a changed rubric grades past traffic again,
    a re-run grades nothing twice), a pair once skipped for budget is graded, and a pair that
    finds the budget exhausted is left as it was (the job pauses and comes back to it)."""

    def __init__(self, redis: RedisClient, *, owner: str | None = None, lease_s: float = 120.0,
                 done_ttl_s: int = keys.DEDUPE_DONE_TTL_S, fill: bool = False) -> None:
        self._redis = redis
        self.fill = fill
        self.owner = owner or new_owner()
        self.lease_s = lease_s
        self.lease_ms = int(lease_s * 1000)
        self._done_ttl_s = done_ttl_s
        self._claim = redis.register_script(CLAIM)
        self._release = redis.register_script(RELEASE)
        self._confirm = redis.register_script(CONFIRM)
        self._reserve = redis.register_script(RESERVE)
        self._mark_done = redis.register_script(MARK_DONE)

    def spend(self, request: ClaimRequest, reserve: ReserveCalls | None = None,
              tokens_reserved: int | None = None, cost_reserved: int | None = None,
              claimed_at: float | None = None) -> PairSpend:
        """The pair's budget for the judge calls decided while it is scored (``scoring.ports.JudgeSpend``).
        ``reserve`` makes the reservation; the trace loop passes one that batches the pairs'.
        ``tokens_reserved``, ``cost_reserved``: what its claim reserved, when the verdict cache
        made it less than the request's ceilings; ``claimed_at``: the time its claim reserved at
        (the window it reserved in; default now)."""
        return PairSpend(request, reserve or self.reserve, tokens_reserved, cost_reserved, claimed_at)

    async def reserve(self, reservation: Reservation) -> bool:
        """One reservation alone (``reserve_many`` of one)."""
        (granted,) = await self.reserve_many([reservation])
        return granted

    async def reserve_many(self, reservations: Sequence[Reservation], now: float | None = None) -> list[bool]:
        """Reserve more judge calls (and, under a token or money cap, their token and money
        ceilings) for claimed pairs from their projects' windows: one script call each, one round
        trip for all. A refusal is False, and with ``skip_when_refused`` the pair is marked skipped
        for budget (never scored, as at claim time)."""
        if not reservations:
            return []
        now = time.time() if now is None else now
        async with ScriptPipeline(self._redis) as pipe:
            for r in reservations:
                request, at = r.request, now if r.at is None else r.at
                window_start = int(at) // request.budget_window_s * request.budget_window_s
                money = keys.judge_cost(request.project_id, window_start)
                tokens = r.tokens if request.counts_tokens else 0
                pipe.script(
                    self._reserve,
                    [keys.judge_budget(request.project_id, window_start),
                     keys.judge_tokens(request.project_id, window_start), claim_hash(request), money,
                     money if request.group_cost_cap is None else _group_cost_key(request, at)],
                    [self.owner, _limit(request.calls_cap), request.budget_window_s * 2, r.calls,
                     claim_field(request), int(r.skip_when_refused), _limit(request.tokens_cap), tokens,
                     _limit(request.cost_cap), request.cost(r.calls, tokens), _limit(request.group_cost_cap),
                     keys.GROUP_COST_TTL_S])
            replies = await pipe.execute()
        return [bool(reply) for reply in replies]

    async def claim_many(self, requests: list[ClaimRequest], now: float | None = None,
                         lookups: Sequence[VerdictLookup] | None = None,
                         verdict_buckets: Sequence[int] = ()) -> list[ClaimResult]:
        """Claim every pair of a batch in one round trip: one script call per project. With
        ``lookups`` (per request, its verdict cache keys) read in ``verdict_buckets``
        (``CachePolicy.reading``), each claimed pair reserves judge calls only for the keys not
        stored and not paid for by an earlier pair of the batch."""
        if not requests:
            return []
        now = time.time() if now is None else now
        # One call per project and budget (a batch's requests of a project share its budget).
        by_project: dict[tuple[str, int | None, int, int | None, int | None], list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            by_project[(r.project_id, r.calls_cap, r.budget_window_s, r.tokens_cap, r.cost_cap)].append(i)
        results: list[ClaimResult | None] = [None] * len(requests)
        looked_up: list[list[str]] = []  # per project: its verdict keys, in the script's order
        async with ScriptPipeline(self._redis) as pipe:
            for indexes in by_project.values():
                first = requests[indexes[0]]
                window_start = int(now) // first.budget_window_s * first.budget_window_s
                hashes: dict[str, int] = {}
                verdicts: dict[str, int] = {}
                group_caps: dict[str, tuple[int, int]] = {}  # a group's money key (its day): index, cap
                args: list[str | int] = []
                for i in indexes:
                    r = requests[i]
                    spec = ",".join(f"{0 if key is None else verdicts.setdefault(key, len(verdicts) + 1)}:{ceiling}"
                                    for key, ceiling in lookups[i]) if lookups is not None else ""
                    group = 0
                    if r.group_cost_cap is not None:
                        group, _ = group_caps.setdefault(_group_cost_key(r, now),
                                                         (len(group_caps) + 1, r.group_cost_cap))
                    rates = r.rates if r.counts_cost else NO_RATES
                    args += [hashes.setdefault(claim_hash(r), len(hashes) + 1), claim_field(r), r.judge_calls,
                             r.judge_tokens if r.counts_tokens else 0, r.revision, spec,
                             rates.per_token, rates.per_call, group]
                header: list[str | int] = [self.owner, self.lease_ms, _limit(first.calls_cap),
                                           first.budget_window_s * 2, self._done_ttl_s, _limit(first.tokens_cap),
                                           int(self.fill), len(hashes), len(verdicts), _limit(first.cost_cap),
                                           len(group_caps), keys.GROUP_COST_TTL_S, *verdicts,
                                           *(cap for _, cap in group_caps.values())]
                looked_up.append(list(verdicts))
                buckets = [keys.judge_verdicts(first.project_id, b) for b in verdict_buckets] if verdicts else []
                pipe.script(self._claim, [keys.judge_budget(first.project_id, window_start),
                                          keys.judge_tokens(first.project_id, window_start),
                                          keys.judge_cost(first.project_id, window_start),
                                          *hashes, *group_caps, *buckets],
                            header + args)
            replies = await pipe.execute()
        for indexes, reply, verdict_keys in zip(by_project.values(), replies, looked_up, strict=True):
            stored_verdicts = dict(zip(verdict_keys, reply[STRIDE * len(indexes):], strict=True))
            for n, i in enumerate(indexes):
                at = STRIDE * n
                leads = _text(reply[at + 2])
                mine = lookups[i] if lookups is not None else ()
                found = tuple((key, value if isinstance(value, bytes) else value.encode()) for key, _ in mine
                              if key is not None and (value := stored_verdicts[key]))
                ours = tuple(verdict_keys[int(k) - 1] for k in leads.split(",")) if leads else ()
                results[i] = ClaimResult(state=_text(reply[at]), detail=_text(reply[at + 1]),  # type: ignore[arg-type]
                                         leads=ours, calls=int(reply[at + 3]), tokens=int(reply[at + 4]),
                                         cost=int(reply[at + 5]), cached=found)
        return results  # type: ignore[return-value]

    async def mark_done(self, done: list[tuple[ClaimRequest, str]],
                        tokens: Sequence[tuple[ClaimRequest, int]] = (), now: float | None = None,
                        saved: Sequence[tuple[ClaimRequest, int, int]] = (),
                        costs: Sequence[tuple[ClaimRequest, int]] = (),
                        settled: Sequence[Settlement] = (), batch: str | None = None,
                        paid: Sequence[tuple[ClaimRequest, Paid]] = (), cache: CachePolicy | None = None) -> int:
        """Mark pairs done with their rating ids, once their outputs are acknowledged, and settle
        what they reserved (``PairSpend.settlements``: each in the window it was reserved in -
        ``tokens`` and ``costs``, in the window of ``now``, are the same for one window): the
        judge tokens to the usage reported, the money (nanos) to what the calls cost, in the
        project's window and the group's day. ``saved`` counts the (calls, tokens) the verdict
        cache saved them in their windows; ``paid``, the verdicts their judge calls paid for, are
        kept in the verdict cache (``cache``) with the done marks - only for the pairs whose mark
        is the first (``MARK_DONE``). One script call per project, pipelined: a round trip for the
        batch. ``batch``: its id, so that marking it again (a replay after a connection lost
        mid-pipeline) settles and counts nothing twice. Returns how many verdicts were kept."""
        now = time.time() if now is None else now
        settled = [*settled, *(Settlement(r, now, tokens=d) for r, d in tokens),
                   *(Settlement(r, now, cost=d) for r, d in costs)]
        if not done and not settled and not saved:
            return 0
        by_project: dict[str, tuple[dict[str, dict[str, str]], dict[tuple[str, int], int]]] = {}
        for request, rating_id in done:
            hashes, _ = by_project.setdefault(request.project_id, ({}, defaultdict(int)))
            hashes.setdefault(claim_hash(request), {})[claim_field(request)] = done_mark(request, rating_id)
        for s in settled:
            request, window_s = s.request, s.request.budget_window_s
            window_start = int(s.at) // window_s * window_s
            _, settle = by_project.setdefault(request.project_id, ({}, defaultdict(int)))
            if s.tokens:
                settle[(keys.judge_tokens(request.project_id, window_start), window_s * 2)] += s.tokens
            if s.cost and request.cost_cap is not None:
                settle[(keys.judge_cost(request.project_id, window_start), window_s * 2)] += s.cost
            if s.cost and request.group_cost_cap is not None:
                settle[(_group_cost_key(request, s.at), keys.GROUP_COST_TTL_S)] += s.cost
        spared: dict[str, dict[tuple[str, int], tuple[int, int]]] = defaultdict(dict)
        for (project, key, window_s), counted in _saved_by_window(saved, now).items():
            by_project.setdefault(project, ({}, defaultdict(int)))
            spared[project][(key, window_s)] = counted
        verdicts: dict[str, list[str | bytes]] = defaultdict(list)  # per project: hash, field, key, entry
        for request, p in paid if cache is not None else ():
            entry = p.verdict.encode()
            if len(entry) <= MAX_ENTRY_BYTES and request.project_id in by_project:
                verdicts[request.project_id] += [claim_hash(request), claim_field(request), p.key, entry]
        newest = cache.reading(now)[0] if cache is not None else 0
        async with ScriptPipeline(self._redis) as pipe:
            for project, (hashes, settle) in by_project.items():
                args: list[str | bytes | int] = [keys.ONCE_TTL_S if batch is not None else 0, self._done_ttl_s,
                                                 len(hashes)]
                for fields in hashes.values():
                    args.append(len(fields))
                    for field, value in fields.items():
                        args += [field, value]
                args.append(len(settle))
                for (_, ttl_s), delta in settle.items():
                    args += [delta, ttl_s]
                args.append(len(spared[project]))
                for (_, window_s), (calls, saved_tokens) in spared[project].items():
                    args += [calls, saved_tokens, window_s * 2]
                names = [*hashes, *(key for key, _ in settle), *(key for key, _ in spared[project])]
                kept = verdicts.get(project, [])
                args.append(len(kept) // 4)
                if kept and cache is not None:
                    index = {name: i for i, name in enumerate(hashes, 1)}
                    args += [cache.per_bucket, cache.expires_at_ms(newest)]
                    for v in range(0, len(kept), 4):
                        args += [index.get(str(kept[v]), 0), *kept[v + 1:v + 4]]
                    names.append(keys.judge_verdicts(project, newest))
                if batch is not None:
                    names.append(keys.once(project, batch))
                pipe.script(self._mark_done, names, args)
            replies = await pipe.execute()
        return sum(max(int(n), 0) for n in replies)

    async def confirm(self, requests: list[ClaimRequest]) -> list[bool]:
        """Whether this worker still holds each pair's lease - renewed if so - right before it
        publishes: a worker that stalled (frozen, starved) past its lease may have lost the pair
        to another, which scored it since; publishing then would put a second value under the
        pair's rating id."""
        if not requests:
            return []
        by_project: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            by_project[r.project_id].append(i)
        held = [False] * len(requests)
        async with ScriptPipeline(self._redis) as pipe:
            for indexes in by_project.values():
                hashes: dict[str, int] = {}
                args: list[str | int] = [self.owner, self.lease_ms]
                for i in indexes:
                    args += [hashes.setdefault(claim_hash(requests[i]), len(hashes) + 1), claim_field(requests[i])]
                pipe.script(self._confirm, list(hashes), args)
            replies = await pipe.execute()
        for indexes, reply in zip(by_project.values(), replies, strict=True):
            for n, i in enumerate(indexes):
                held[i] = bool(reply[n])
        return held

    async def release(self, requests: list[ClaimRequest]) -> None:
        """Give up leases this worker still holds (shutdown with work unfinished), so another
        worker need not wait for them to expire."""
        if not requests:
            return
        by_project: dict[str, list[ClaimRequest]] = defaultdict(list)
        for r in requests:
            by_project[r.project_id].append(r)
        async with ScriptPipeline(self._redis) as pipe:
            for mine in by_project.values():
                hashes: dict[str, int] = {}
                args: list[str | int] = [self.owner]
                for r in mine:
                    args += [hashes.setdefault(claim_hash(r), len(hashes) + 1), claim_field(r)]
                pipe.script(self._release, list(hashes), args)
            await pipe.execute()

    async def stored(self, request: ClaimRequest) -> str:
        """What is kept for a pair ("lease:...", "done:<ratingId>[@<revision>]", "skipped:budget"), or ""."""
        value = await self._redis.hget(claim_hash(request), claim_field(request))
        return _text(value) if value is not None else ""

    async def budget_used(self, project_id: str, window_s: int, now: float | None = None) -> int:
        now = time.time() if now is None else now
        value = await self._redis.get(keys.judge_budget(project_id, int(now) // window_s * window_s))
        return int(value or 0)

    async def saved(self, project_id: str, window_s: int, now: float | None = None) -> tuple[int, int]:
        """The judge calls and tokens the verdict cache saved the project in the window."""
        now = time.time() if now is None else now
        calls, tokens = await self._redis.hmget(keys.judge_saved(project_id, int(now) // window_s * window_s),
                                                ["calls", "tokens"])
        return int(calls or 0), int(tokens or 0)

    async def cost_used(self, project_id: str, window_s: int, now: float | None = None) -> int:
        """Nanos of money of the window under a money cap: what calls settled cost, plus the
        ceilings of calls not settled yet."""
        now = time.time() if now is None else now
        return int(await self._redis.get(keys.judge_cost(project_id, int(now) // window_s * window_s)) or 0)

    async def group_cost_used(self, project_id: str, group_id: str, now: float | None = None) -> int:
        """Nanos of money of the group's day (UTC) under its ``maxCostPerDay``."""
        now = time.time() if now is None else now
        return int(await self._redis.get(keys.judge_group_cost(project_id, group_id, int(now) // DAY_S)) or 0)

    async def tokens_used(self, project_id: str, window_s: int, now: float | None = None) -> int:
        """Judge tokens of the window: the usage of calls settled, plus the ceilings of calls not
        settled yet (in flight, or whose worker stopped before it could settle them)."""
        now = time.time() if now is None else now
        value = await self._redis.get(keys.judge_tokens(project_id, int(now) // window_s * window_s))
        return int(value or 0)


@dataclass(frozen=True, slots=True)
class Reservation:
    """Judge calls (and their token ceiling) a claimed pair asks for while it is scored."""

    request: ClaimRequest
    calls: int
    tokens: int
    skip_when_refused: bool  # a gates-first panel's: refused, the pair is skipped for budget
    at: float | None = None  # when asked: the window (and day) it is kept in; None: the batch's time


@dataclass(frozen=True, slots=True)
class Settlement:
    """What to add to the window (and day) of ``at`` once a pair is done: its tokens and money
    (nanos) - negative where the ceilings reserved exceed what the calls used and cost."""

    request: ClaimRequest
    at: float
    tokens: int = 0
    cost: int = 0


# How a pair's reservation reaches Redis: ``Claims.reserve`` alone, or - the pair protocol's -
# batched with other pairs' into one ``reserve_many`` and riding out a Redis outage. The one
# callback on the budget path, and on purpose: the budget's arithmetic is the store's, but
# batching across pairs and the outage rule are the loop's (``consumers``), and the core's panel
# sees neither (``scoring.ports.JudgeSpend``).
ReserveCalls = Callable[[Reservation], Awaitable[bool]]


class PairSpend:
    """One claimed pair's ``JudgeSpend``: its reservations go to its project's budget window, and
    it remembers the token and money ceilings reserved - and when - so that ``settlements`` can
    turn them into the usage and cost the judges reported, each in the window it was kept in."""

    def __init__(self, request: ClaimRequest, reserve: ReserveCalls, tokens_reserved: int | None = None,
                 cost_reserved: int | None = None, claimed_at: float | None = None) -> None:
        self.request, self._reserve_one = request, reserve
        self.counts_tokens = request.counts_tokens
        claimed = request.judge_tokens if tokens_reserved is None else tokens_reserved
        self.tokens_reserved = claimed if self.counts_tokens else 0
        self.cost_reserved = request.cost(request.judge_calls, self.tokens_reserved) if cost_reserved is None \
            else cost_reserved
        # When its claim reserved (the window and day it reserved in), and what it reserved
        # since, each when: a pair scored across a window's end settles each where it was kept.
        self.claimed_at = time.time() if claimed_at is None else claimed_at
        self.later: list[tuple[float, int, int]] = []

    async def reserve_panel(self, calls: int, tokens: int) -> bool:
        return await self._reserve(calls, tokens, skip_when_refused=True)

    async def reserve_retry(self, tokens: int) -> bool:
        return await self._reserve(1, tokens, skip_when_refused=False)

    async def _reserve(self, calls: int, tokens: int, *, skip_when_refused: bool) -> bool:
        tokens = tokens if self.counts_tokens else 0
        at = time.time()
        granted = await self._reserve_one(Reservation(self.request, calls, tokens, skip_when_refused, at))
        if granted:
            cost = self.request.cost(calls, tokens)
            self.tokens_reserved += tokens
            self.cost_reserved += cost
            self.later.append((at, tokens, cost))
        return granted

    def settlements(self, tokens_reported: int, cost_reported: int | None) -> list[Settlement]:
        """What the pair's done mark settles: each reservation made while it was scored given
        back in the window it was made in, and the claim's window (and day) counting the usage
        and cost reported less what the claim reserved (negative: the ceilings overshoot). An
        unknown cost (a call whose API reported no token counts) keeps the money ceilings: never
        less than it may have cost."""
        money = self.request.counts_cost and cost_reported is not None
        later_tokens = sum(t for _, t, _ in self.later)
        later_cost = sum(c for _, _, c in self.later) if money else 0
        first = Settlement(self.request, self.claimed_at, tokens_reported - (self.tokens_reserved - later_tokens),
                           (cost_reported or 0) - (self.cost_reserved - later_cost) if money else 0)
        given_back = [Settlement(self.request, at, -tokens, -cost if money else 0) for at, tokens, cost in self.later]
        return [s for s in (first, *given_back) if s.tokens or s.cost]


STRIDE = 6  # the claim script's reply per pair: state, detail, leads, calls, tokens, money


def _limit(cap: int | None) -> int:
    return -1 if cap is None else cap


def _group_cost_key(request: ClaimRequest, now: float) -> str:
    """The group's money key of today (UTC): the day the money is spent, not the subject's."""
    return keys.judge_group_cost(request.project_id, request.group_id, int(now) // DAY_S)


def _saved_by_window(saved: Sequence[tuple[ClaimRequest, int, int]],
                     now: float) -> dict[tuple[str, str, int], tuple[int, int]]:
    """(calls, tokens) saved, summed by project and its window key (and its length)."""
    by: dict[tuple[str, str, int], tuple[int, int]] = {}
    for request, calls, tokens in saved:
        window_s = request.budget_window_s
        key = (request.project_id, keys.judge_saved(request.project_id, int(now) // window_s * window_s), window_s)
        had = by.get(key, (0, 0))
        by[key] = (had[0] + calls, had[1] + tokens)
    return by


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
