"""A pool of warm, sandboxed Python processes that run users' code scorers.

Each process runs ``scoring/_sandbox_runner.py`` under ``python -I -S`` (no site-packages, no
environment variables honoured), with an empty environment, in an empty read-only directory, in
a network namespace of its own when ``unshare --net`` is allowed, and with limits: address space
(a big allocation raises MemoryError), 64 open files, no file growth, and a CPU-time backstop. An
audit hook refuses starting programs, sockets, native code, writing files, and reading files
outside the standard library. The parent enforces the wall-clock timeout: a process that does not
answer in time is killed (SIGKILL to its process group) and replaced, so a runaway scorer costs
only its own process.

A process compiles a scorer version (``key``) once and keeps its score() for later calls; the
parent remembers which keys a process holds and sends the code only to processes without it.

What this does NOT guarantee - audit hooks are no security boundary (PEP 578):
* Processes are shared by all scorers. Hostile code can monkeypatch builtins or the runner, or
  read the protocol descriptors, and so watch or alter later calls of other scorers in the same
  process. Background threads are caught (the process is replaced) but not prevented.
* Code runs as the service's user. Reading files is limited by the hook to the standard library;
  ``os.stat``/``os.listdir`` are not audited. Running the service as a dedicated unprivileged
  user, in a container without secrets on disk, is the real boundary.
* ``os.write``/``os.read`` on inherited descriptors, ``os._exit``, signals raised by C code and
  crashes of the interpreter are not audited; they can only break the process they run in.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

_RUNNER = Path(__file__).with_name("_sandbox_runner.py")
# Nothing of the service's environment - credentials live there - reaches user code.
_CHILD_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
_START_TIMEOUT_S = 10.0  # a fresh process must say "ready" within this
_EXIT_WAIT_S = 1.0  # how long a process that closed its pipe gets to report how it ended
_KEYS_PER_PROCESS = 256  # compiled scorers a process keeps (least recently used go first)
_CALLS_PER_PROCESS = 1000  # then the process is replaced, shedding whatever state user code left
_MAX_REQUEST_BYTES = 16 * 1024 * 1024
_REPLY_LIMIT = 64 * 1024  # replies are a few hundred bytes; a longer line is not from the runner


class CodeScorerError(Exception):
    """Why a code scorer produced no verdict. ``str(exc)`` is a short reason a person reads.

    ``retriable`` is True only for infrastructure failures (a process could not be started, the
    pool is closed); everything the user's code caused - including crashes, which cannot be told
    apart from infrastructure crashes - is not retriable.
    """

    def __init__(self, reason: str, *, retriable: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retriable = retriable


class _Broken(Exception):
    """The process stopped speaking the protocol: end of file, garbage, or a reply out of turn."""

    def __init__(self, what: str, *, ended: bool = False) -> None:
        super().__init__(what)
        self.ended = ended  # its end of the pipe closed: the process is probably exiting


@dataclass(eq=False)
class _Slot:
    """One place in the pool; it holds at most one process, and keeps its place when the
    process is replaced, so the number of slots - the concurrency - never changes."""

    proc: asyncio.subprocess.Process | None = None
    loaded: OrderedDict[str, None] = field(default_factory=OrderedDict)  # keys the process holds
    calls: int = 0


class SandboxPool:
    def __init__(self, size: int = 2, *, memory_limit_mb: int = 256, python: str = sys.executable,
                 isolate_network: bool = True) -> None:
        if size < 1:
            raise ValueError("a sandbox pool needs at least one process")
        self._size = size
        self._memory_limit_mb = memory_limit_mb
        self._python = python
        self._isolate_network = isolate_network
        self._prefix: list[str] = []  # ["/usr/bin/unshare", "--net"] once the probe succeeded
        self._slots = [_Slot() for _ in range(size)]
        self._idle: asyncio.Queue[_Slot] = asyncio.Queue()
        self._replacements: set[asyncio.Task[None]] = set()
        self._workdir: str | None = None
        self._started = False
        self._closed = False
        self._seq = 0
        self._compilations = 0

    @property
    def size(self) -> int:
        return self._size

    @property
    def network_isolated(self) -> bool:
        """True when processes run in a network namespace of their own (no network at all)."""
        return bool(self._prefix)

    @property
    def live_processes(self) -> int:
        return sum(1 for s in self._slots if s.proc is not None and s.proc.returncode is None)

    @property
    def compilations(self) -> int:
        """How many times any process compiled a scorer (once per key per process)."""
        return self._compilations

    async def start(self) -> None:
        """Spawn ``size`` warm processes. Raises CodeScorerError (retriable) if they cannot start."""
        if self._started:
            return
        self._started = True
        # Shared by all processes, empty and read-only: nothing lands there, nothing is left over.
        self._workdir = tempfile.mkdtemp(prefix="scorer-sandbox-")
        os.chmod(self._workdir, 0o500)
        if self._isolate_network:
            await self._probe_unshare()
        try:
            procs = await asyncio.gather(*(self._spawn() for _ in self._slots))
        except BaseException:
            await self.close()
            raise
        for slot, proc in zip(self._slots, procs, strict=True):
            slot.proc = proc
            self._idle.put_nowait(slot)
        log.info("sandbox pool started", size=self._size, memory_limit_mb=self._memory_limit_mb,
                 network_isolated=self.network_isolated)

    async def close(self) -> None:
        """Kill every process; idempotent. Calls in flight fail with a retriable error."""
        if self._closed:
            return
        self._closed = True
        for slot in self._slots:
            if slot.proc is not None:
                _kill(slot.proc)
        await asyncio.gather(*self._replacements, return_exceptions=True)
        for slot in self._slots:
            if slot.proc is not None:
                await _reap(slot.proc)
                slot.proc = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)

    async def run(self, key: str, code: str, args: dict[str, Any], timeout_s: float) -> float | bool:
        """Run score(input, output, expected, spans, metadata) of ``code`` in a free process.

        Returns a bool, or a number as float (NaN, inf or 1.5 as they are: ranges are checked
        elsewhere). Waits for a free process when all are busy. Raises CodeScorerError.
        """
        if not self._started or self._closed:
            raise CodeScorerError("sandbox pool is not running", retriable=True)
        # Encoded once, before taking a process: a bad argument is the caller's problem alone.
        try:
            args_json = json.dumps(args)
        except (TypeError, ValueError) as exc:
            raise CodeScorerError(f"arguments are not JSON: {exc}") from exc
        if len(args_json) + len(code) > _MAX_REQUEST_BYTES:
            raise CodeScorerError(f"arguments and code exceed {_MAX_REQUEST_BYTES // 2**20} MiB")

        slot = await self._idle.get()
        in_call = False  # a process interrupted mid-call is in an unknown state: never reuse it
        handed_over = False  # the slot went to a replacement task, which returns it to the pool
        try:
            if self._closed:
                raise CodeScorerError("sandbox pool is not running", retriable=True)
            if slot.proc is None or slot.proc.returncode is not None:
                # An earlier replacement failed, or the process died while idle (say, the OOM
                # killer): start one now rather than blame this call's code for the corpse.
                slot.proc, slot.calls = None, 0
                slot.loaded.clear()
                slot.proc = await self._spawn()
            proc = slot.proc
            in_call = True
            try:
                reply = await asyncio.wait_for(self._exchange(slot, proc, key, code, args_json, timeout_s),
                                               timeout_s)
            except TimeoutError:
                failure = CodeScorerError(f"timed out after {round(timeout_s * 1000)} ms")
            except _Broken as broken:
                failure = CodeScorerError(await _crash_reason(proc, broken, timeout_s))
            else:
                in_call = False
                slot.calls += 1
                value = reply.get("value")
                if reply.get("ok") is True and isinstance(value, bool | int | float):
                    if slot.calls >= _CALLS_PER_PROCESS:
                        handed_over = True
                        self._replace_soon(slot)  # in the background: this caller has its answer
                    return value if isinstance(value, bool) else float(value)
                failure = CodeScorerError(str(reply.get("error") or "sandbox crashed (protocol error)")[:400])
                if reply.get("ok") is False and not reply.get("fatal"):
                    raise failure  # the code failed; its process is fine
            # The process is gone or untrustworthy: replace it before reporting, so that when
            # run() raises, the pool is whole again. Shielded: the replacement outlives a cancel.
            handed_over = True
            await asyncio.shield(self._replace_soon(slot))
            if self._closed:
                raise CodeScorerError("sandbox pool is not running", retriable=True)
            raise failure
        finally:
            if not handed_over:
                if in_call:  # cancelled while the process was working
                    self._replace_soon(slot)
                else:
                    self._idle.put_nowait(slot)

    async def _exchange(self, slot: _Slot, proc: asyncio.subprocess.Process, key: str, code: str,
                        args_json: str, timeout_s: float) -> dict[str, Any]:
        assert proc.stdin is not None
        send_code = key not in slot.loaded
        while True:  # twice at most: again, with the code, if the process no longer held the key
            self._seq += 1
            rid = self._seq
            head = json.dumps({"id": rid, "key": key, "code": code if send_code else None,
                               "timeout": timeout_s})
            # Splice the pre-encoded arguments in rather than encoding them again.
            request = head[:-1] + ', "args": ' + args_json + "}\n"
            try:
                proc.stdin.write(request.encode())
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise _Broken("pipe closed", ended=True) from exc
            reply = await _read_message(proc)
            if reply.get("id") != rid:
                raise _Broken("reply out of turn")
            if not reply.get("missing"):
                break
            if send_code:
                raise _Broken("code sent but reported missing")
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

    def _replace_soon(self, slot: _Slot) -> asyncio.Task[None]:
        """Kill the slot's process now; spawn its successor in a task that then frees the slot."""
        if slot.proc is not None:
            _kill(slot.proc)
        task = asyncio.get_running_loop().create_task(self._replace(slot))
        self._replacements.add(task)
        task.add_done_callback(self._replacements.discard)
        return task

    async def _replace(self, slot: _Slot) -> None:
        try:
            if slot.proc is not None:
                await _reap(slot.proc)
            slot.proc, slot.calls = None, 0
            slot.loaded.clear()
            if not self._closed:
                try:
                    slot.proc = await self._spawn()
                except CodeScorerError as exc:
                    # The slot stays empty; the next run() that takes it tries again.
                    if not self._closed:
                        log.warning("could not replace a sandbox process", reason=str(exc))
        finally:
            self._idle.put_nowait(slot)

    async def _spawn(self) -> asyncio.subprocess.Process:
        cmd = [*self._prefix, self._python, "-I", "-S", str(_RUNNER), str(self._memory_limit_mb),
               str(_KEYS_PER_PROCESS)]
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, env=_CHILD_ENV, cwd=self._workdir,
                start_new_session=True,  # its own process group, killed as a whole
                limit=_REPLY_LIMIT)
        except OSError as exc:
            raise CodeScorerError(f"could not start a sandbox: {exc}", retriable=True) from exc
        try:
            hello = await asyncio.wait_for(_read_message(proc), _START_TIMEOUT_S)
            if hello.get("ready") is not True:
                raise _Broken(str(hello.get("error")))
        except (TimeoutError, _Broken) as exc:
            _kill(proc)
            await _reap(proc)
            raise CodeScorerError(f"could not start a sandbox: {exc or 'no answer'} "
                                  f"(exit code {proc.returncode})", retriable=True) from exc
        except BaseException:
            _kill(proc)
            raise
        if self._closed:  # close() ran while this process was starting
            _kill(proc)
            await _reap(proc)
            raise CodeScorerError("sandbox pool is not running", retriable=True)
        return proc

    async def _probe_unshare(self) -> None:
        """Use `unshare --net` if it works here (it needs root or user namespaces)."""
        unshare = shutil.which("unshare")
        reason = "unshare not found"
        if unshare is not None:
            try:
                probe = await asyncio.create_subprocess_exec(
                    unshare, "--net", self._python, "-I", "-S", "-c", "pass", env=_CHILD_ENV,
                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE)
                try:
                    _, err = await asyncio.wait_for(probe.communicate(), _START_TIMEOUT_S)
                except TimeoutError:
                    _kill(probe)
                    await _reap(probe)
                    err = b"probe timed out"
                if probe.returncode == 0:
                    self._prefix = [unshare, "--net"]
                    return
                reason = err.decode(errors="replace").strip()[-200:] or f"exit code {probe.returncode}"
            except OSError as exc:
                reason = str(exc)
        log.warning("code scorers will have network access: unshare --net is unavailable", reason=reason)


async def _read_message(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    try:
        line = await proc.stdout.readline()
    except ValueError as exc:  # longer than the stream limit
        raise _Broken("oversized reply") from exc
    if not line.endswith(b"\n"):
        raise _Broken("end of file", ended=True)
    try:
        message = json.loads(line)
    except ValueError as exc:
        raise _Broken("garbled reply") from exc
    if not isinstance(message, dict):
        raise _Broken("garbled reply")
    return message


async def _crash_reason(proc: asyncio.subprocess.Process, broken: _Broken, timeout_s: float) -> str:
    """Name how the process ended, giving it a moment to exit after closing its pipe."""
    if not broken.ended:
        return f"sandbox crashed (protocol error: {broken})"
    try:
        code = await asyncio.wait_for(proc.wait(), _EXIT_WAIT_S)
    except TimeoutError:
        return f"sandbox crashed ({broken})"
    if code == -signal.SIGXCPU:  # the CPU backstop fired before the wall clock
        return f"timed out after {round(timeout_s * 1000)} ms"
    return f"sandbox crashed (exit code {code})"


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:  # already reaped: its pid may belong to someone else now
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:  # not the group leader after all (should not happen)
        proc.kill()


async def _reap(proc: asyncio.subprocess.Process) -> None:
    try:
        await asyncio.wait_for(proc.wait(), _START_TIMEOUT_S)
    except TimeoutError:
        log.warning("a killed sandbox process did not exit", pid=proc.pid)
