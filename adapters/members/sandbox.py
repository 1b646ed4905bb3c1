"""The pool of warm, confined processes that run tenants' code scorers: one concept, who serves whom and when.

Talking to one process is ``adapters.members.sandbox_process``; the confinement, ``adapters.members.isolation``.
The one rule: tenants never share a process (one project at a time, replaced before another), and fail
closed - without confinement every call fails, unless the operator chose ``unsafe-none``.
Limits, fair shares, warm code: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog

from adapters.members.isolation import Confinement, IsolationMode, IsolationUnavailable, prepare
from adapters.members.sandbox_process import (
    MAX_REQUEST_BYTES,
    Broken,
    StartFailed,
    crash_reason,
    exchange,
    kill,
    reap,
    spawn,
)
from scoring.members.fair_share import FairShare
from scoring.ports import CodeScorerError

log = structlog.get_logger(__name__)

_KEYS_PER_PROCESS = 256  # compiled scorers a process keeps (least recently used go first)
# Then the process is replaced. User code leaves no state in it (each request runs in a child
# of its own, which ends with it): what is shed is the supervisor's own drift (its allocator's
# arenas). A replacement costs a sandbox start, ~20 ms of CPU: every 1,000 calls that was a
# third of a batched call's CPU (62 -> 42 us, ``tests.bench.bench_sandbox --batch 64``).
_CALLS_PER_PROCESS = 100_000
_BATCH_CALLS = 256  # subjects in one message at most
_BATCH_SECONDS_PER_CALL = 0.05  # what a batch's deadline grows by per extra subject
DEFAULT_PYTHON = "/usr/bin/python3"  # Debian's: readable by the sandbox uid, has python3-seccomp


@dataclass(eq=False)
class _Slot:
    """One place in the pool; it holds at most one process, and keeps its place when the
    process is replaced, so the number of slots - the concurrency - never changes."""

    proc: asyncio.subprocess.Process | None = None
    project: str | None = None  # whose code the process has run: no one else's may run there
    loaded: OrderedDict[str, None] = field(default_factory=OrderedDict)  # keys the process holds
    calls: int = 0
    # The process that takes over: started in the background past half this one's life, so no
    # call waits for a process to start when this one is retired. It outlives ``forget``.
    spare: asyncio.Task[asyncio.subprocess.Process] | None = None

    def forget(self) -> None:
        self.proc, self.project, self.calls = None, None, 0
        self.loaded.clear()


class SandboxPool:
    def __init__(self, size: int = 2, *, memory_limit_mb: int = 256, per_project: int | None = None,
                 isolation: IsolationMode = "bwrap", python: str = DEFAULT_PYTHON,
                 sandbox_uid: int = 65534) -> None:
        if size < 1:
            raise ValueError("a sandbox pool needs at least one process")
        self._size = size
        # Rule and order of the processes' shares: scoring.members.fair_share (default: half the pool).
        self._share = FairShare(size, max(1, min(size, per_project if per_project is not None else size // 2)),
                                closed=lambda: CodeScorerError("sandbox pool is not running", retriable=True))
        self._per_project = self._share.per_project
        self._memory_limit_mb = memory_limit_mb
        self._isolation: IsolationMode = isolation
        self._python = python
        self._sandbox_uid = sandbox_uid
        self._confinement: Confinement | None = None
        self._unavailable: str | None = "not started"
        self._slots = [_Slot() for _ in range(size)]
        self._idle: list[_Slot] = list(self._slots)
        self._started = False
        self._closed = False
        self._seq = 0
        self._compilations = 0
        self._recycled = 0
        self._messages = 0
        self._cold_starts = 0
        self._reaping: set[asyncio.Task[None]] = set()

    @property
    def size(self) -> int:
        return self._size

    @property
    def per_project(self) -> int:
        return self._per_project

    @property
    def available(self) -> bool:
        return self._unavailable is None

    @property
    def unavailable_reason(self) -> str | None:
        return self._unavailable

    @property
    def confinement(self) -> str:
        return self._confinement.description if self._confinement else ""

    @property
    def bounds(self) -> str:
        """The confinement and the per-call bounds in force ("" until started, or unavailable)."""
        return self._confinement.bounds if self._confinement else ""

    @property
    def live_processes(self) -> int:
        return sum(1 for s in self._slots if s.proc is not None and s.proc.returncode is None)

    @property
    def compilations(self) -> int:
        """How many times any process compiled a scorer (once per key per process)."""
        return self._compilations

    @property
    def messages(self) -> int:
        """Requests sent to sandbox processes (a batch is one)."""
        return self._messages

    @property
    def recycled_for_another_project(self) -> int:
        return self._recycled

    @property
    def cold_starts(self) -> int:
        """Calls that had to wait for a process to start (no spare was ready or starting): after
        a crash, a timeout or a switch of tenant - not when a process is retired for age."""
        return self._cold_starts

    async def start(self) -> None:
        """Set up the confinement and warm ``size`` processes. Never raises: if any of it fails
        (a missing binary, an identity this process may not take, a start that fails), the pool
        stays unavailable - code scorers fail closed - and says why."""
        if self._started:
            return
        self._started = True
        try:
            self._confinement = await prepare(self._isolation, self._python, self._sandbox_uid)
            procs = await self._warm()
        except Exception as exc:  # whatever it is, no code may run: the reason is shown, not raised
            self._confinement = None
            self._unavailable = _setup_failure(exc)
            log.error("code scorers will not run: the sandbox cannot be set up", reason=self._unavailable)
            return
        self._unavailable = None
        for slot, proc in zip(self._slots, procs, strict=True):
            slot.proc = proc
        if self._isolation == "unsafe-none":
            log.warning("code scorers run WITHOUT isolation (SGW_CODE_SANDBOX=unsafe-none): tenants' "
                        "code can read this process's secrets and reach the network")
        log.info("sandbox pool started", size=self._size, per_project=self._per_project,
                 memory_limit_mb=self._memory_limit_mb, bounds=self.bounds)

    async def _warm(self) -> list[asyncio.subprocess.Process]:
        """A process per slot, or none: if one fails to start, those started are killed."""
        started = await asyncio.gather(*(self._spawn() for _ in self._slots), return_exceptions=True)
        failure = next((p for p in started if isinstance(p, BaseException)), None)
        procs = [p for p in started if not isinstance(p, BaseException)]
        if failure is None:
            return procs
        for proc in procs:
            kill(proc)
            await reap(proc)
        raise failure

    async def close(self) -> None:
        """Kill every process; idempotent. Calls in flight fail with a retriable error."""
        if self._closed:
            return
        self._closed = True
        self._share.close()  # callers waiting for a process fail now, retriable; none is handed one
        for slot in self._slots:
            if slot.proc is not None:
                kill(slot.proc)
        for slot in self._slots:
            if slot.proc is not None:
                await reap(slot.proc)
                slot.forget()
        spares = [slot.spare for slot in self._slots if slot.spare is not None]
        for spare in spares:
            if spare.done() and not spare.cancelled() and spare.exception() is None:
                kill(spare.result())
                await reap(spare.result())
            else:
                spare.cancel()  # a process half started is killed by _spawn
        await asyncio.gather(*spares, *self._reaping, return_exceptions=True)

    async def run(self, project: str, key: str, code: str, args: dict[str, Any],
                  timeout_s: float) -> float | bool:
        """Run score(input, output, expected, spans, metadata) of ``code`` for ``project``.

        Returns a bool, or a number as float (NaN, inf or 1.5 as they are: ranges are checked
        elsewhere). Waits for a free process of this project's share. Raises CodeScorerError.
        """
        if self._unavailable is not None and self._started:
            raise CodeScorerError(f"sandbox unavailable: {self._unavailable}")
        if not self._started or self._closed:
            raise CodeScorerError("sandbox pool is not running", retriable=True)
        # Encoded once, before taking a process: a bad argument is the caller's problem alone.
        try:
            args_json = json.dumps(args).encode()
        except (TypeError, ValueError) as exc:
            raise CodeScorerError(f"arguments are not JSON: {exc}") from exc
        if len(args_json) + len(code) > MAX_REQUEST_BYTES:
            raise CodeScorerError(f"arguments and code exceed {MAX_REQUEST_BYTES // 2**20} MiB")

        slot = await self._acquire(project)
        try:
            return await self._call(slot, project, key, code, args_json, timeout_s)
        except CodeScorerError:
            raise  # _call already kept or discarded the process, as the failure warranted
        except BaseException:
            await _discard(slot)  # interrupted mid-request (cancelled): its state is unknown
            raise
        finally:
            await self._release(slot, project)

    async def run_many(self, project: str, key: str, code: str, calls: list[dict[str, Any]],
                       timeout_s: float) -> list[float | bool | CodeScorerError]:
        """``run`` for many subjects of one scorer version, in one message per chunk: one pipe
        round trip instead of one per subject. Each entry is the value or the CodeScorerError of
        that subject. A chunk that fails as a whole (a subject hangs or crashes the process) is
        run again one subject at a time, so each subject gets its own verdict and reason."""
        if len(calls) == 1:
            return [await self._run_one(project, key, code, calls[0], timeout_s)]
        if self._unavailable is not None and self._started:
            return [CodeScorerError(f"sandbox unavailable: {self._unavailable}")] * len(calls)
        results: list[float | bool | CodeScorerError] = []
        for start in range(0, len(calls), _BATCH_CALLS):
            chunk = calls[start:start + _BATCH_CALLS]
            try:
                results += await self._run_chunk(project, key, code, chunk, timeout_s)
            except CodeScorerError:
                results += [await self._run_one(project, key, code, args, timeout_s) for args in chunk]
        return results

    async def _run_one(self, project: str, key: str, code: str, args: dict[str, Any],
                       timeout_s: float) -> float | bool | CodeScorerError:
        try:
            return await self.run(project, key, code, args, timeout_s)
        except CodeScorerError as exc:
            return exc

    async def _run_chunk(self, project: str, key: str, code: str, chunk: list[dict[str, Any]],
                         timeout_s: float) -> list[float | bool | CodeScorerError]:
        if not self._started or self._closed:
            raise CodeScorerError("sandbox pool is not running", retriable=True)
        try:
            batch_json = orjson.dumps(chunk)  # bytes, as they go down the pipe
        except TypeError:  # what orjson refuses (an integer past 64 bits...): the slow encoder
            try:
                batch_json = json.dumps(chunk).encode()
            except (TypeError, ValueError) as exc:
                raise CodeScorerError(f"arguments are not JSON: {exc}") from exc
        if len(batch_json) + len(code) > MAX_REQUEST_BYTES:
            raise CodeScorerError("a batch is too large for one message")  # run one by one instead
        # Each subject gets the scorer's own timeout; the batch a little more per extra subject.
        deadline_s = timeout_s + (len(chunk) - 1) * min(timeout_s, _BATCH_SECONDS_PER_CALL)
        slot = await self._acquire(project)
        try:
            proc = await self._ready(slot, project)
            try:
                reply = await asyncio.wait_for(
                    self._exchange(slot, proc, key, code, batch_json, deadline_s, field="batch"), deadline_s)
            except (TimeoutError, Broken):
                await _discard(slot)
                raise CodeScorerError("the batch failed as a whole") from None
            slot.calls += len(chunk)
            entries = reply.get("results")
            if reply.get("ok") is not True or not isinstance(entries, list) or len(entries) != len(chunk):
                if reply.get("fatal") or reply.get("ok") is not False:
                    await _discard(slot)
                reason = str(reply.get("error") or "sandbox crashed (protocol error)")[:400]
                return [CodeScorerError(reason)] * len(chunk)  # e.g. the code does not compile
            self._wear(slot)
            return [_verdict(entry) for entry in entries]
        except BaseException as exc:
            if not isinstance(exc, CodeScorerError):
                await _discard(slot)  # cancelled mid-request
            raise
        finally:
            await self._release(slot, project)

    # --- slots ---------------------------------------------------------------------------------

    async def _acquire(self, project: str) -> _Slot:
        """An idle slot within ``project``'s fair share: one already serving it if any, else an
        empty one, else the least recently used (recycled for this project)."""
        if self._closed:
            raise CodeScorerError("sandbox pool is not running", retriable=True)
        await self._share.acquire(project)  # a share held means an idle slot: one per share
        if self._closed:  # closed while this call waited: the slot is not to be used
            self._share.release(project)
            raise CodeScorerError("sandbox pool is not running", retriable=True)
        slot = (next((s for s in reversed(self._idle) if s.project == project), None)
                or next((s for s in self._idle if s.project is None), None)
                or self._idle[0])
        self._idle.remove(slot)
        return slot

    async def _release(self, slot: _Slot, project: str) -> None:
        self._idle.append(slot)
        self._share.release(project)

    async def _ready(self, slot: _Slot, project: str) -> asyncio.subprocess.Process:
        """The slot's process, fit to run ``project``'s code: another tenant's is replaced."""
        if slot.proc is not None and slot.project not in (None, project):
            await _discard(slot)  # another tenant's process: never reused across projects
            self._recycled += 1
        if slot.proc is None or slot.proc.returncode is not None:
            slot.forget()
            slot.proc = await self._take_spare(slot)
            if slot.proc is None:
                self._cold_starts += 1
                slot.proc = await self._spawn()
        slot.project = project
        return slot.proc

    def _wear(self, slot: _Slot) -> None:
        """After a call: a process past half its calls gets a replacement starting in the
        background; one at the end of its calls is retired (shedding whatever state user code
        left), and the next call takes the replacement, already started (or starting, when one
        batch took the process from under half to its end)."""
        if slot.calls >= _CALLS_PER_PROCESS // 2 and slot.spare is None and not self._closed:
            slot.spare = asyncio.create_task(self._spawn())
        if slot.calls >= _CALLS_PER_PROCESS:
            retired = slot.proc
            slot.forget()
            if retired is not None:
                kill(retired)
                reaping = asyncio.create_task(reap(retired))
                self._reaping.add(reaping)
                reaping.add_done_callback(self._reaping.discard)

    @staticmethod
    async def _take_spare(slot: _Slot) -> asyncio.subprocess.Process | None:
        """The slot's replacement process once it has started, or None (none, or it failed to
        start: the caller starts one itself, and its error is the caller's)."""
        spare, slot.spare = slot.spare, None
        if spare is None:
            return None
        try:
            proc = await spare
        except CodeScorerError:
            return None
        return proc if proc.returncode is None else None

    async def _call(self, slot: _Slot, project: str, key: str, code: str, args_json: bytes,
                    timeout_s: float) -> float | bool:
        proc = await self._ready(slot, project)
        try:
            reply = await asyncio.wait_for(self._exchange(slot, proc, key, code, args_json, timeout_s), timeout_s)
        except TimeoutError:
            await _discard(slot)
            raise CodeScorerError(f"timed out after {round(timeout_s * 1000)} ms") from None
        except Broken as broken:
            why = await crash_reason(proc, broken, timeout_s)
            await _discard(slot)
            raise CodeScorerError(why) from None
        slot.calls += 1
        value = _value(reply)
        if value is not None:
            self._wear(slot)
            return value
        if reply.get("ok") is not False or reply.get("fatal"):
            await _discard(slot)
        raise CodeScorerError(str(reply.get("error") or "sandbox crashed (protocol error)")[:400])

    async def _exchange(self, slot: _Slot, proc: asyncio.subprocess.Process, key: str, code: str,
                        args_json: bytes, timeout_s: float, field: str = "args") -> dict[str, Any]:
        """One request on ``slot``'s process, with the code only if the process does not hold
        ``key`` (or says it no longer does); keeps the pool's record of what it holds."""
        send_code = key not in slot.loaded
        while True:  # twice at most: again, with the code, if the process no longer held the key
            self._seq += 1
            self._messages += 1
            reply = await exchange(proc, self._seq, key, code if send_code else None, timeout_s,
                                   field=field, payload_json=args_json)
            if not reply.get("missing"):
                break
            if send_code:
                raise Broken("code sent but reported missing")
            send_code = True
        if reply.get("compiled"):
            self._compilations += 1
        if reply.get("loaded"):
            slot.loaded[key] = None
            slot.loaded.move_to_end(key)
            while len(slot.loaded) > _KEYS_PER_PROCESS:  # mirrors the process's own cache
                slot.loaded.popitem(last=False)
        else:
            slot.loaded.pop(key, None)
        return reply

    async def _spawn(self) -> asyncio.subprocess.Process:
        assert self._confinement is not None
        try:
            proc = await spawn(self._confinement, self._memory_limit_mb, _KEYS_PER_PROCESS)
        except StartFailed as exc:
            raise CodeScorerError(str(exc), retriable=True) from exc
        if self._closed:  # close() ran while this process was starting
            kill(proc)
            await reap(proc)
            raise CodeScorerError("sandbox pool is not running", retriable=True)
        return proc


def _value(reply: dict[str, Any]) -> float | bool | None:
    """An ``ok`` reply's value as a bool or a float; None when there is none that is one."""
    value = reply.get("value")
    if reply.get("ok") is not True or not isinstance(value, bool | int | float):
        return None
    if isinstance(value, bool):
        return value
    try:
        return float(value)
    except OverflowError:  # the runner converts; this is the backstop
        return None


def _setup_failure(exc: Exception) -> str:
    """Why the sandbox cannot be set up, for /readyz and the log."""
    if isinstance(exc, IsolationUnavailable):
        return str(exc)
    if isinstance(exc, CodeScorerError):
        return f"could not start sandbox processes: {exc}"
    return f"setting up the sandbox failed: {type(exc).__name__}: {exc}"[:400]


def _verdict(entry: Any) -> float | bool | CodeScorerError:
    """One subject's entry of a batch reply."""
    if isinstance(entry, dict):
        value = _value(entry)
        if value is not None:
            return value
        return CodeScorerError(str(entry.get("error") or "sandbox crashed (protocol error)")[:400])
    return CodeScorerError("sandbox crashed (protocol error)")


async def _discard(slot: _Slot) -> None:
    """Kill the slot's process (with its sandbox) and forget it; the next call starts another."""
    if slot.proc is not None:
        kill(slot.proc)
        await asyncio.shield(reap(slot.proc))
    slot.forget()
