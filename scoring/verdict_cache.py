"""The verdict cache: a judge's verdict on the same messages is the verdict a team already paid for, so it is paid once.

Pure: no I/O. The one rule: the key (``verdict_key``) holds the project, the judge, the call's signature
and a hash of the exact messages, so any change to what a call asks is another key and no entry is shared
across projects; only a verdict that parsed and scored is kept. The key, the lookup, the flights:
docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import field
from typing import Any

import orjson

from scoring.blend import MemberOutcome
from scoring.frozen import frozen
from scoring.judge_prompt import build_messages
from scoring.models import Judge
from scoring.ports import BudgetExhausted, CallRecorder, JudgeCall, Judges, JudgeVerdict, RetryGate, TokenUsage
from scoring.redact import redact_text
from scoring.subjects import Subject

# Bumped when the call a key stands for changes without its messages changing (the client's
# temperature, the answer's token ceiling, how an answer is parsed): old entries then miss.
CACHE_FORMAT = "sgw-verdict-1"
# Entries larger than this are not kept (a judge that wrote a book as its justification).
MAX_ENTRY_BYTES = 4_096
# Seven days: long enough that a weekly CI run of an unchanged judge, and a week's repeated
# questions, are paid once; short enough that a provider's silent update behind a model's name
# (the key cannot see it) is asked afresh within 9 1/3 days (the TTL's 4/3). SGW_JUDGE_CACHE_TTL_S.
DEFAULT_TTL_S = 7 * 86_400
# Per project (SGW_JUDGE_CACHE_MAX_ENTRIES): ~270 bytes each in Redis (docs/concepts.md).
DEFAULT_MAX_ENTRIES = 100_000
# Verdicts this process paid for lately, kept beside Redis's (bounded: a few MB): a pair claimed
# while its verdict was being paid for here finds it, whether or not the finish step wrote it yet.
RECENT_KEPT = 4_096


def verdict_key(project_id: str, judge_id: str, signature: str, messages: Sequence[dict[str, str]]) -> str:
    """The key of one judge call: 144 bits of BLAKE2b over what makes the call (``signature``:
    ``Judges.signature`` - the endpoint, model and request shape), base64url (24 characters) -
    collisions are out of reach of any project's traffic."""
    digest = hashlib.blake2b(orjson.dumps([CACHE_FORMAT, project_id, judge_id, signature, messages]),
                             digest_size=18).digest()
    return base64.urlsafe_b64encode(digest).decode()


@frozen
class CachedVerdict:
    """A verdict already paid for: its rating (0-10 as the judge said it), justification, the
    tokens the paid call cost, and the rating id whose judge call paid for it."""

    rating: float
    justification: str
    paid_by: str
    usage: TokenUsage | None = None

    def encode(self) -> bytes:
        usage = None if self.usage is None else [self.usage.prompt_tokens, self.usage.completion_tokens]
        return orjson.dumps({"r": self.rating, "j": self.justification, "p": self.paid_by, "u": usage})

    @classmethod
    def decode(cls, raw: bytes | str | None) -> CachedVerdict | None:
        """The entry, or None for anything that is not one (an entry is never trusted to raise)."""
        if not raw:
            return None
        try:
            document: Any = orjson.loads(raw)
            rating, justification, paid_by, usage = document["r"], document["j"], document["p"], document["u"]
            if (not isinstance(rating, int | float) or isinstance(rating, bool) or not isinstance(justification, str)
                    or not isinstance(paid_by, str)):
                return None
            tokens = None if usage is None else TokenUsage(*(n if isinstance(n, int) else None for n in usage[:2]))
            return cls(float(rating), justification, paid_by, tokens)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError):
            return None


# A project's verdicts live in hashes of BUCKETS_READ - 1 to a TTL (``CachePolicy``): a lookup
# reads BUCKETS_READ hashes (one HMGET each for a whole batch) and a write adds to the newest one
# (one HSET): commands per batch, not per verdict. An entry lives TTL to TTL x 4/3.
BUCKETS_READ = 4


@frozen
class CachePolicy:
    """How long verdicts are kept and how many per project (``Settings``), and the buckets that
    follow from it: ``bucket_s`` long, each holding at most ``per_bucket`` verdicts."""

    ttl_s: int = DEFAULT_TTL_S
    max_entries: int = DEFAULT_MAX_ENTRIES

    @property
    def bucket_s(self) -> int:
        return max(1, -(-self.ttl_s // (BUCKETS_READ - 1)))

    @property
    def per_bucket(self) -> int:
        return max(1, -(-self.max_entries // BUCKETS_READ))

    def reading(self, now: float) -> list[int]:
        """The buckets a lookup reads at ``now``, the newest (the one written to) first."""
        newest = int(now) // self.bucket_s
        return [newest - n for n in range(BUCKETS_READ)]

    def expires_at_ms(self, bucket: int) -> int:
        """When a bucket's hash leaves Redis: once no lookup reads it (every entry kept a TTL)."""
        return (bucket + BUCKETS_READ) * self.bucket_s * 1000


@frozen
class JudgeKey:
    """One cacheable judge call a pair will make: its key, the token ceiling a budget reserves
    for it, and the messages the key was made of (sent as they are: built once)."""

    judge_id: str
    key: str
    tokens: int
    messages: list[dict[str, str]] = field(default_factory=list, compare=False, hash=False, repr=False)


class PairVerdicts:
    """One pair's judge verdicts as its claim found them, filled by the pair protocol's claim
    step and read by the panel: ``keys`` by judge id, the ``hits`` (paid already), the keys the
    claim ``reserved`` calls for (this pair makes those calls), and what this pair paid for
    (``fresh``: kept by the finish step, once its rating id is published)."""

    __slots__ = ("claimed_at", "cost_reserved", "fresh", "hits", "keys", "rating_id", "reserve", "reserved",
                 "tokens_reserved")

    def __init__(self) -> None:
        self.rating_id = ""
        self.keys: dict[str, JudgeKey] = {}
        self.hits: dict[str, CachedVerdict] = {}
        self.reserved: set[str] = set()
        self.tokens_reserved: int | None = None  # what its claim reserved (None: the request's ceiling)
        self.cost_reserved: int | None = None  # and of money, in nanos
        self.claimed_at: float | None = None  # when: the window (and day) it reserved in
        self.fresh: dict[str, CachedVerdict] = {}
        # Reserves (calls, tokens) the claim did not, the pair skipped for budget when refused:
        # the pair's ``JudgeSpend.reserve_panel``, set by the panel (None: no budget to ask).
        self.reserve: Callable[[int, int], Awaitable[bool]] | None = None


@frozen
class Savings:
    """What the cache did for one graded subject: judge verdicts found paid for (``hits``: the
    calls saved) or called (``misses``), and the tokens the hits' paid calls cost."""

    hits: int = 0
    misses: int = 0
    tokens: int = 0


def savings(outcomes: Iterable[MemberOutcome], verdicts: PairVerdicts | None) -> Savings:
    """The cache's hits and misses among a subject's judge members (those it looked up), and
    the tokens its hits saved."""
    if verdicts is None or not verdicts.keys:
        return Savings()
    hits = misses = tokens = 0
    for o in outcomes:
        key = verdicts.keys.get(o.ref_id) if o.kind == "judge" else None
        if key is None or o.skipped is not None:
            continue
        if o.cached_from is None:
            misses += 1
            continue
        hits += 1
        paid = verdicts.hits.get(key.key)
        tokens += paid.usage.total if paid is not None and paid.usage is not None else 0
    return Savings(hits, misses, tokens)


class VerdictFlights:
    """The judge calls under way in this process, by key, and the verdicts just paid for: a pair
    whose key is being asked waits for that call instead of making its own."""

    def __init__(self, recent_kept: int = RECENT_KEPT) -> None:
        self._flying: dict[str, asyncio.Future[CachedVerdict | None]] = {}
        self._recent: OrderedDict[str, CachedVerdict] = OrderedDict()
        self._recent_kept = recent_kept

    def flying(self, key: str) -> bool:
        return key in self._flying or key in self._recent

    def known(self, key: str) -> CachedVerdict | None:
        return self._recent.get(key)

    def waiting_on(self, key: str) -> asyncio.Future[CachedVerdict | None] | None:
        return self._flying.get(key)

    async def ask(self, judges: Judges, judge: Judge, subject: Subject, key: JudgeKey, verdicts: PairVerdicts,
                  retry: RetryGate | None, record: CallRecorder) -> CachedVerdict | JudgeVerdict:
        """A judge member under the verdict cache, in order:

        1. paid for already (the claim found it, or this process paid for it lately): no call;
        2. under way here for another pair: wait for that call's verdict;
        3. otherwise call - reserving the call first when the claim did not (it counted on step 2,
           whose call then failed; no room skips the pair whole, ``BudgetExhausted``, as a claim
           does) - and, once it scored, keep it for the finish step to store.
        """
        paid = verdicts.hits.get(key.key) or self.known(key.key)
        flight = self.waiting_on(key.key) if paid is None else None
        if flight is not None:
            paid = await asyncio.shield(flight)  # our deadline ends our wait, never the other's call
        if paid is not None:
            verdicts.hits[key.key] = paid  # what it saved is counted as the claim's hits are
            record(JudgeCall(judges.model_for(judge),
                             tuple((m["role"], m["content"]) for m in key.messages or build_messages(judge, subject)),
                             None, time.time(), 0.0, 0, None, cached_from=paid.paid_by))
            return paid
        if key.key not in verdicts.reserved and verdicts.reserve is not None and \
                not await verdicts.reserve(1, key.tokens):
            raise BudgetExhausted("no room in the judge budget for a call the pair counted on another's making")
        verdicts.reserved.add(key.key)
        mine = self.take_off(key.key)
        kept: CachedVerdict | None = None
        try:
            verdict = await judges.grade(judge, subject, retry=retry, record=record, messages=key.messages or None)
            if math.isfinite(verdict.rating) and 0 <= verdict.rating <= 10:  # only a verdict that scores
                kept = CachedVerdict(verdict.rating, redact_text(verdict.justification), verdicts.rating_id,
                                     verdict.usage)
                verdicts.fresh[key.key] = kept
            return verdict
        finally:
            self.land(key.key, mine, kept)

    def take_off(self, key: str) -> asyncio.Future[CachedVerdict | None]:
        """This pair calls for ``key``: others asking meanwhile wait on the future returned."""
        flight: asyncio.Future[CachedVerdict | None] = asyncio.get_running_loop().create_future()
        self._flying[key] = flight
        return flight

    def land(self, key: str, flight: asyncio.Future[CachedVerdict | None], verdict: CachedVerdict | None) -> None:
        """The call ended: with its verdict (kept among the recent), or None when it failed -
        those who waited then call for themselves."""
        if self._flying.get(key) is flight:
            del self._flying[key]
        if not flight.done():
            flight.set_result(verdict)
        if verdict is not None:
            self._recent[key] = verdict
            self._recent.move_to_end(key)
            while len(self._recent) > self._recent_kept:
                self._recent.popitem(last=False)
