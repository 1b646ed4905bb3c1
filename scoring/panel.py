"""The panel: every member of a group grades one subject, concurrently, then the blend (one concept, one module).

Each member runs under its own deadline, and every way it can fail - a deleted reference, a
judge outage, an exception in user code, a verdict off its scale - becomes a ``MemberOutcome``
with the reason, so the blend can renormalize or fail closed exactly as the spec says. Nothing a
member does can fail the panel itself.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog
from mypy_extensions import mypyc_attr

from scoring.blend import GATE_PASS_MARK, REFERENCE_DELETED, BlendResult, MemberOutcome, blend, goodness
from scoring.frozen import frozen
from scoring.judge_calls import kept, tenant_texts
from scoring.judge_prompt import build_messages, token_ceiling
from scoring.members.code_arguments import arguments_read
from scoring.members.patterns import DEADLINE_S as PATTERN_DEADLINE_S
from scoring.members.patterns import CompiledPattern, compiled
from scoring.models import CustomEvaluator, Judge, Member, Pattern, Polarity, ScorerGroup
from scoring.ports import (
    BudgetExhausted,
    CallRecorder,
    CodeSandbox,
    CodeScorerError,
    ExternalScorers,
    JudgeCall,
    Judges,
    JudgeSpend,
    MemberError,
    RetryGate,
    TokenUsage,
)
from scoring.prices import NO_PRICING, Pricing
from scoring.redact import Redactor, redact_text
from scoring.subjects import Subject
from scoring.verdict_cache import CachedVerdict, CachePolicy, JudgeKey, PairVerdicts, VerdictFlights, verdict_key

log = structlog.get_logger(__name__)

_PLANS_KEPT = 4096  # groups whose member plans are kept (all of them, past a catalog's size)
# Added to a member's own timeout so its client reports the timeout before the panel does.
DEADLINE_SLACK_S = 1.0

# Called once per member: (member kind, status, reason or None, seconds it took).
MemberObserver = Callable[[str, str, str | None, float], None]
# Called once per judge verdict whose API reported its tokens: (project, usage).
TokenObserver = Callable[[str, TokenUsage], None]


class ScorerLookup(Protocol):
    """Where the panel finds the scorers members refer to (a catalog snapshot)."""

    def judge(self, ref_id: str) -> Judge | None: ...
    def pattern(self, ref_id: str) -> Pattern | None: ...
    def custom(self, ref_id: str) -> CustomEvaluator | None: ...


@frozen
class MemberPlan:
    """A member resolved against one catalog snapshot, for scoring it on many subjects: looked
    up, compiled and hashed once, not once per subject."""

    member: Member
    pattern: Pattern | None = None  # a pattern member whose pattern exists and compiled,
    matcher: CompiledPattern | None = None
    no_match: MemberOutcome | None = None  # with the outcome it has on every subject it misses
    code: CustomEvaluator | None = None  # a code scorer member: batched through the sandbox
    code_key: str = ""


@frozen
class GroupResult:
    group: ScorerGroup
    subject: Subject
    blend: BlendResult

    @property
    def rating(self) -> float | None:
        return self.blend.score


def code_key(scorer: CustomEvaluator) -> str:
    """Names one version of a code scorer: the sandbox compiles each key once."""
    assert scorer.code is not None
    return _code_key(scorer.id, scorer.code)


@functools.lru_cache(maxsize=1024)
def _code_key(scorer_id: str, code: str) -> str:  # once per version, not once per subject
    return f"{scorer_id}:{hashlib.sha256(code.encode()).hexdigest()[:16]}"


def defers_judges(group: ScorerGroup) -> bool:
    """A gates-first group with a must-pass member that costs no judge call: its judges are
    called (and their budget reserved) only once those gates passed."""
    return group.gates_first and any(m.gate and m.kind != "judge" for m in group.members)


def upfront_judge_calls(group: ScorerGroup, scorers: ScorerLookup, subject: Subject) -> int:
    """The judge calls a pair's claim reserves: all of them, or none for a group that defers its
    judges (the panel reserves them itself, once its cheap gates passed)."""
    return 0 if defers_judges(group) else planned_judge_calls(group, scorers, subject)


def planned_judges(group: ScorerGroup, scorers: ScorerLookup, subject: Subject) -> list[Judge]:
    """The judges scoring ``subject`` will call (retries aside): a judge whose reference is gone,
    or that needs an expected answer the subject lacks, is not called."""
    planned = []
    for member in group.members:
        judge = scorers.judge(member.ref_id) if member.kind == "judge" else None
        if judge is not None and not (judge.requires_expected and subject.expected is None):
            planned.append(judge)
    return planned


def planned_judge_calls(group: ScorerGroup, scorers: ScorerLookup, subject: Subject) -> int:
    """How many judge calls scoring ``subject`` will make (retries aside)."""
    return len(planned_judges(group, scorers, subject))


def _retry_gate(spend: JudgeSpend | None, member: Member, subject: Subject, scorers: ScorerLookup) -> RetryGate | None:
    """What a judge member asks before each retry: one more slot (and its token ceiling)."""
    judge = scorers.judge(member.ref_id) if member.kind == "judge" else None
    if spend is None or judge is None:
        return None
    live: JudgeSpend = spend

    async def retry() -> bool:
        return await live.reserve_retry(token_ceiling(judge, subject) if live.counts_tokens else 0)

    return retry


def _skipped_whole(said: list[MemberOutcome | BaseException]) -> list[MemberOutcome]:
    """The members' outcomes - or, once every member ended, the budget's refusal that skips the
    pair whole (``BudgetExhausted``: never a partial panel). ``_member`` raises nothing else."""
    for outcome in said:
        if isinstance(outcome, BaseException):
            raise outcome
    return said  # type: ignore[return-value]


# Compiled (deploy/compiled.py), a class is closed to subclasses written in Python unless it says
# so: tests put a panel of their own in the loop (a scorer that stands still, one they control).
@mypyc_attr(allow_interpreted_subclasses=True)
class Panel:
    """Runs the members of groups. One per process: it holds the clients members call."""

    def __init__(
        self,
        *,
        judges: Judges | None = None,
        external: ExternalScorers | None = None,
        sandbox: CodeSandbox | None = None,
        member_deadline_s: float = 120.0,
        observe: MemberObserver | None = None,
        redact: Redactor | None = None,
        count_tokens: TokenObserver | None = None,
        verdict_cache: CachePolicy | None = None,
        pricing: Pricing = NO_PRICING,
    ) -> None:
        self._judges = judges
        self._external = external
        self._sandbox = sandbox
        # Bounds a member whatever it waits for (a judge slot, a free sandbox, the network), so
        # a panel always ends well within the lease that keeps other workers off its pair.
        self._member_deadline_s = member_deadline_s
        self._observe = observe
        self._count_tokens = count_tokens
        # Every reason and detail is published (ratings, Signals, webhook bodies): whatever a
        # member's text carries - a judge echoing a key, an error echoing a URL - is cut of
        # secrets first (``_describe``; which secrets, ``scoring.redact``).
        self._redact = redact or Redactor()
        # The bulk path's groups resolved against the snapshot in use (``_plan``), by group id.
        self._plans_for: ScorerLookup | None = None
        self._plans: dict[int, tuple[ScorerGroup, tuple[MemberPlan, ...]]] = {}
        # The verdict cache (None: off), and the judge calls under way in this process by key.
        self.verdict_cache = verdict_cache
        self.flights = VerdictFlights()
        # What the judges' calls cost (scoring.prices): the pairs' money caps reserve at it.
        self.pricing = pricing

    def verdict_keys(self, group: ScorerGroup, scorers: ScorerLookup, subject: Subject) -> list[JudgeKey]:
        """The verdict cache's keys of the judge calls scoring ``subject`` will make, one per call
        as ``planned_judges`` counts them (a judge two members name: twice, one key), with their
        token ceilings; none for a judge whose cache is off."""
        if self._judges is None or self.verdict_cache is None:
            return []
        keys: dict[str, JudgeKey] = {}
        calls = []
        for judge in planned_judges(group, scorers, subject):
            if judge.cache:
                if judge.id not in keys:
                    messages = build_messages(judge, subject)
                    key = verdict_key(subject.project_id, judge.id, self._judges.signature(judge), messages)
                    keys[judge.id] = JudgeKey(judge.id, key, token_ceiling(judge, subject, messages=messages), messages)
                calls.append(keys[judge.id])
        return calls

    async def score(self, group: ScorerGroup, subject: Subject, scorers: ScorerLookup,
                    spend: JudgeSpend | None = None, verdicts: PairVerdicts | None = None) -> GroupResult:
        """Every member on the subject, then the blend. ``spend`` is the pair's live budget: each
        judge retry reserves a slot from it, and a gates-first group reserves its judges' calls
        from it once its cheap gates passed (raising ``BudgetExhausted`` when there is no room).
        ``verdicts``: what the pair's claim found in the verdict cache (a judge whose verdict was
        paid for already is not called)."""
        if verdicts is not None and spend is not None:
            verdicts.reserve = spend.reserve_panel  # a call the claim counted on another's making
        if not defers_judges(group):
            outcomes = _skipped_whole(await asyncio.gather(*(
                self._member(m, subject, scorers, _retry_gate(spend, m, subject, scorers), verdicts)
                for m in group.members), return_exceptions=True))
            return GroupResult(group, subject, blend(outcomes))
        # Gates first: every member that costs no judge call, then the judges only if no
        # must-pass among them failed outright (one that could not score fails closed anyway,
        # but a judge gate failing would still be the stronger verdict: they run).
        members = group.members
        cheap = [i for i, m in enumerate(members) if m.kind != "judge"]
        judges = [i for i, m in enumerate(members) if m.kind == "judge"]
        said: list[MemberOutcome | None] = [None] * len(members)
        for i, outcome in zip(cheap, await asyncio.gather(*(self._member(members[i], subject, scorers)
                                                            for i in cheap)), strict=True):
            said[i] = outcome
        failed = next((o for i in cheap if members[i].gate and (o := said[i]) is not None
                       and o.goodness is not None and o.goodness < GATE_PASS_MARK), None)
        if failed is not None:
            why = f'not called: must-pass member "{failed.name}" failed first (gatesFirst)'
            for i in judges:
                said[i] = self._skipped(members[i], scorers, why)
        else:
            # Its judges' calls, less those paid for already or under way here (``_judge``).
            planned = [j for j in planned_judges(group, scorers, subject) if not self._covered(j, verdicts)]
            tokens = sum(token_ceiling(j, subject) for j in planned) if spend is not None and spend.counts_tokens else 0
            if spend is not None and planned and not await spend.reserve_panel(len(planned), tokens):
                raise BudgetExhausted(f"no room in the judge budget for {len(planned)} judge call(s)")
            if verdicts is not None:
                verdicts.reserved.update(key.key for j in planned if (key := verdicts.keys.get(j.id)) is not None)
            said_by_judges = _skipped_whole(await asyncio.gather(*(
                self._member(members[i], subject, scorers, _retry_gate(spend, members[i], subject, scorers), verdicts)
                for i in judges), return_exceptions=True))
            for i, outcome in zip(judges, said_by_judges, strict=True):
                said[i] = outcome
        return GroupResult(group, subject, blend([o for o in said if o is not None]))

    def _covered(self, judge: Judge, verdicts: PairVerdicts | None) -> bool:
        """Is this judge's verdict for the pair paid for already, or being paid for here?"""
        key = verdicts.keys.get(judge.id) if verdicts is not None else None
        return key is not None and (key.key in verdicts.hits or self.flights.flying(key.key))  # type: ignore[union-attr]

    def _skipped(self, member: Member, scorers: ScorerLookup, why: str) -> MemberOutcome:
        judge = scorers.judge(member.ref_id)
        return self._outcome(member, judge.name if judge is not None else member.ref_id, time.perf_counter(),
                             skipped=why)

    def waits(self, group: ScorerGroup, scorers: ScorerLookup) -> bool:
        """Whether scoring the group waits on the network (a judge or an external scorer); the
        others - patterns and code scorers - can be scored in bulk by ``score_many``."""
        for member in group.members:
            if member.kind == "judge":
                return True
            if member.kind == "custom":
                scorer = scorers.custom(member.ref_id)
                if scorer is not None and scorer.type == "external":
                    return True
        return False

    async def score_many(self, items: list[tuple[ScorerGroup, Subject]], scorers: ScorerLookup) -> list[GroupResult]:
        """Score many pairs at once, without a task per member: patterns in one pass (long texts in
        a thread), and each code scorer version with all its subjects of a project in one sandbox
        message. Meant for groups that do not ``wait``; any member kind still scores correctly."""
        rows: list[list[MemberOutcome | None]] = []
        code_calls: dict[tuple[str, str], list[tuple[int, int, Member, CustomEvaluator, Subject]]] = {}
        for i, (group, subject) in enumerate(items):
            row: list[MemberOutcome | None] = []
            for j, plan in enumerate(self._plan(group, scorers)):
                if plan.code is not None and self._sandbox is not None:
                    code_calls.setdefault((subject.project_id, plan.code_key), []).append(
                        (i, j, plan.member, plan.code, subject))
                    row.append(None)
                else:
                    row.append((self._pattern_inline(plan, subject) if plan.matcher is not None else None)
                               or await self._member(plan.member, subject, scorers))
            rows.append(row)
        await asyncio.gather(*(self._code_batch(project, key, calls, rows)
                               for (project, key), calls in code_calls.items()))
        return [GroupResult(group, subject, blend([o for o in row if o is not None]))
                for (group, subject), row in zip(items, rows, strict=True)]

    def _plan(self, group: ScorerGroup, scorers: ScorerLookup) -> tuple[MemberPlan, ...]:
        """The group's members resolved against ``scorers``, once per snapshot (they are immutable)."""
        if scorers is not self._plans_for:
            self._plans_for = scorers
            self._plans.clear()
        known = self._plans.get(id(group))
        if known is not None and known[0] is group:  # the group itself is held: its id stays its own
            return known[1]
        plans = tuple(self._member_plan(member, scorers) for member in group.members)
        if len(self._plans) >= _PLANS_KEPT:
            self._plans.clear()
        self._plans[id(group)] = (group, plans)
        return plans

    def _member_plan(self, member: Member, scorers: ScorerLookup) -> MemberPlan:
        if member.kind == "custom":
            custom = scorers.custom(member.ref_id)
            if custom is not None and custom.type == "code" and custom.code is not None:
                return MemberPlan(member, code=custom, code_key=code_key(custom))
            return MemberPlan(member)
        pattern = scorers.pattern(member.ref_id) if member.kind == "pattern" else None
        if pattern is None:
            return MemberPlan(member)
        try:
            matcher = compiled(pattern)
            no_match = self._describe(member, pattern.name, native=False, detail=matcher.no_match.detail,
                                      goodness=goodness("pattern", False, polarity=pattern.polarity))
        except Exception:  # whatever it is, ``_member`` turns it into the member's error, per subject
            return MemberPlan(member)
        return MemberPlan(member, pattern=pattern, matcher=matcher, no_match=no_match)

    def _pattern_inline(self, plan: MemberPlan, subject: Subject) -> MemberOutcome | None:
        """A pattern member on short text, right here (no task, no deadline to arm): the bulk
        path's common case. None for long text, which ``_member`` scores in a thread."""
        member, pattern, matcher = plan.member, plan.pattern, plan.matcher
        assert pattern is not None and matcher is not None and plan.no_match is not None
        started = time.perf_counter()
        try:
            if not matcher.short(subject.input, subject.output):
                return None
            verdict = matcher.check(subject.input, subject.output)
            g = goodness("pattern", verdict.matched, polarity=pattern.polarity)
        except Exception:  # whatever it is, ``_member`` turns it into the member's error
            return None
        if verdict is matcher.no_match:  # the common case: the outcome every such subject shares
            if self._observe is not None:
                self._observe(member.kind, plan.no_match.status, None, time.perf_counter() - started)
            return plan.no_match
        return self._outcome(member, pattern.name, started, native=verdict.matched, goodness=g,
                             detail=verdict.detail)

    async def _code_batch(self, project: str, key: str,
                          calls: list[tuple[int, int, Member, CustomEvaluator, Subject]],
                          rows: list[list[MemberOutcome | None]]) -> None:
        """One code scorer version on many subjects of one project: one sandbox message."""
        assert self._sandbox is not None
        started = time.perf_counter()
        scorer = calls[0][3]
        assert scorer.code is not None
        values: list[float | bool | CodeScorerError | TimeoutError]
        try:
            async with asyncio.timeout(self._member_deadline_s):
                reads = arguments_read(scorer.code)  # what the code names; the rest is not sent
                values = list(await self._sandbox.run_many(project, key, scorer.code,
                                                           [c[4].member_payload(reads) for c in calls],
                                                           timeout_s=scorer.timeout_ms / 1000))
        except TimeoutError as exc:
            values = [exc] * len(calls)
        except Exception as exc:  # a bug of ours must cost this scorer's calls, not the whole bulk
            log.exception("code scorer batch failed unexpectedly", project=project, key=key)
            values = [CodeScorerError(f"internal error: {type(exc).__name__}")] * len(calls)
        for (i, j, member, _, _), value in zip(calls, values, strict=True):
            if isinstance(value, TimeoutError):
                rows[i][j] = self._outcome(member, scorer.name, started,
                                           error=f"timed out after {self._member_deadline_s:g}s")
            elif isinstance(value, CodeScorerError):
                rows[i][j] = self._outcome(member, scorer.name, started, error=str(value))
            else:
                try:
                    g = goodness(member.kind, value, invert=scorer.invert)
                except ValueError as exc:
                    rows[i][j] = self._outcome(member, scorer.name, started, native=value, error=str(exc))
                else:
                    rows[i][j] = self._outcome(member, scorer.name, started, native=value, goodness=g)

    def _outcome(self, member: Member, name: str, started: float, **kw: object) -> MemberOutcome:
        """A member's outcome (``_describe``), observed: kind, status, time since ``started``."""
        result = self._describe(member, name, **kw)  # type: ignore[arg-type]
        if self._observe is not None:
            self._observe(member.kind, result.status, result.error, time.perf_counter() - started)
        return result

    def _describe(self, member: Member, name: str, *, error: str | None = None, detail: str | None = None,
                  calls: Sequence[JudgeCall] = (), **kw: object) -> MemberOutcome:
        """A member's outcome, its text cut of secrets. It is named by the label the group saved
        for it (the scorer's name when the group was saved, or the label its owner gave), so a
        renamed or deleted scorer keeps its name in every result, Signal and CI message; ``name``
        (the scorer's name, or its ref id) when it has none."""
        if error is not None:
            # A judge's error is written on the server's side (the operator's endpoint may echo its
            # key): cut of the known secrets too, but for what the tenant sent in its calls. Other
            # members' errors carry the tenant's code's or service's words: shapes only - a known
            # secret masked there would answer a guess (``scoring.redact``).
            kw["error"] = (self._redact(error, tenant_gave=[t for c in calls for t in tenant_texts(c)])
                           if member.kind == "judge" else redact_text(error))
        if detail is not None:
            # A pattern's detail is ours ("matched in output at offset 12"); other members' is a
            # judge's reason or a tenant's service's: the tenant's to steer, so shapes only.
            kw["detail"] = detail if member.kind == "pattern" else redact_text(detail)
        if calls:  # what the judge was asked holds the trace: kept cut and masked alike
            kw["calls"] = tuple(kept(call, self._redact) for call in calls)
        return MemberOutcome(name=member.label or name, kind=member.kind, weight=member.weight, gate=member.gate,
                             ref_id=member.ref_id, scorer_name=name, **kw)  # type: ignore[arg-type]

    async def _member(self, member: Member, subject: Subject, scorers: ScorerLookup,
                      retry: RetryGate | None = None, verdicts: PairVerdicts | None = None) -> MemberOutcome:
        started = time.perf_counter()
        scorer = {"judge": scorers.judge, "pattern": scorers.pattern,
                  "custom": scorers.custom}[member.kind](member.ref_id)
        name = scorer.name if scorer is not None else member.ref_id

        def outcome(**kw: object) -> MemberOutcome:
            return self._outcome(member, name, started, **kw)

        if scorer is None:
            return outcome(error=REFERENCE_DELETED)
        native: float | bool | None = None
        usage: TokenUsage | None = None
        calls: list[JudgeCall] = []  # a judge's, recorded whatever the outcome (the deadline's too)
        key = verdicts.keys.get(scorer.id) if verdicts is not None and isinstance(scorer, Judge) else None
        detail: str | None
        try:
            async with asyncio.timeout(self._member_deadline_s):
                if key is not None:
                    assert verdicts is not None and isinstance(scorer, Judge)
                    if self._judges is None:
                        raise MemberError("no judge endpoint is configured")
                    paid = await self.flights.ask(self._judges, scorer, subject, key, verdicts, retry, calls.append)
                    if isinstance(paid, CachedVerdict):  # paid for already: no usage of its own
                        g = goodness("judge", paid.rating)
                        return outcome(native=paid.rating, goodness=g, detail=paid.justification, calls=calls,
                                       cached_from=paid.paid_by)
                    native, detail, polarity, invert, usage = paid.rating, paid.justification, None, False, paid.usage
                else:
                    native, detail, polarity, invert, usage = await self._verdict(scorer, subject, retry, calls.append)
            if usage is not None and self._count_tokens is not None:
                self._count_tokens(subject.project_id, usage)
            g = goodness(member.kind, native, polarity=polarity, invert=invert)
        except BudgetExhausted:
            raise  # the pair is skipped whole (``_skipped_whole``)
        except (MemberError, CodeScorerError, ValueError) as exc:
            return outcome(native=native, error=str(exc), usage=usage, calls=calls)
        except TimeoutError:
            return outcome(error=f"timed out after {self._member_deadline_s:g}s", calls=calls)
        except Exception as exc:  # a bug of ours must cost one member, not the group
            log.exception("member scorer failed unexpectedly", kind=member.kind, ref_id=member.ref_id)
            return outcome(error=f"internal error: {type(exc).__name__}")
        return outcome(native=native, goodness=g, detail=detail, usage=usage, calls=calls)

    async def _verdict(
        self, scorer: Judge | Pattern | CustomEvaluator, subject: Subject, retry: RetryGate | None = None,
        record: CallRecorder | None = None,
    ) -> tuple[float | bool, str | None, Polarity | None, bool, TokenUsage | None]:
        """(native verdict, detail, polarity, invert, a judge's tokens) of one scorer on the subject."""
        if isinstance(scorer, Judge):
            if self._judges is None:
                raise MemberError("no judge endpoint is configured")
            # The judge client's own deadline starts once it has a slot on the endpoint.
            verdict = await self._judges.grade(scorer, subject, retry=retry, record=record)
            return verdict.rating, verdict.justification, None, False, verdict.usage
        if isinstance(scorer, Pattern):
            try:
                result = await compiled(scorer).check_off_loop(subject.input, subject.output, subject.project_id)
            except TimeoutError:
                raise MemberError(f"pattern timed out after {PATTERN_DEADLINE_S:g}s") from None
            return result.matched, result.detail, scorer.polarity, False, None
        if scorer.type == "code":
            if self._sandbox is None:
                raise MemberError("code scorers are not enabled in this process")
            assert scorer.code is not None
            value = await self._sandbox.run(subject.project_id, code_key(scorer), scorer.code,
                                            subject.member_payload(arguments_read(scorer.code)),
                                            timeout_s=scorer.timeout_ms / 1000)
            return value, None, None, scorer.invert, None
        if self._external is None:
            raise MemberError("external scorers are not enabled in this process")
        # The scorer's own timeout bounds the whole call (a body trickling in never ends a read):
        # when it fires, the reason names it, not the member deadline (which ``_member`` names).
        own_timeout = asyncio.timeout(scorer.timeout_ms / 1000 + DEADLINE_SLACK_S)
        try:
            async with own_timeout:
                value = await self._external.score(scorer, subject)
        except TimeoutError:
            if not own_timeout.expired():
                raise
            raise MemberError(f"external scorer timed out after {scorer.timeout_ms} ms") from None
        return value, None, None, scorer.invert, None
