"""The program each sandbox process runs: load users' code scorers and call them on request.

Started by ``scoring.members.sandbox_process`` as ``python -I -S -c <this source> <memory MiB> <cache size>``,
inside the confinement of ``scoring.members.isolation`` (its own namespaces, uid, seccomp filter and
read-only file system): the operating system is the boundary, this program only keeps the
protocol. Standard library only: ``-S`` leaves nothing else importable, and the source is
passed on the command line because the service's files are not visible in the sandbox.

A process serves one project at a time (the pool recycles it before another project's call),
so what a scorer leaves behind - patched builtins, module state - reaches only later calls of
scorers of the same project.

Protocol: one JSON object per line. The parent sends
``{"id", "key", "code" (or null when this process should know the key), "timeout", "args"}``;
the child answers with the same ``id`` and either ``{"ok": true, "value"}`` or
``{"ok": false, "error"}`` (``"fatal": true`` when the process must not be reused). A request
with ``"batch": [args, ...]`` instead of ``"args"`` calls score() once per entry and answers
``{"ok": true, "results": [{"ok", "value" | "error"}, ...]}`` in the same order. Or
``{"missing": true}`` when it no longer holds the compiled code for ``key``. ``"compiled"`` says
whether this call compiled the code (so compilations can be counted), ``"loaded"`` whether the
process now holds it. The first line, sent
unasked, is ``{"ready": true}`` (or ``{"ready": false, "error"}``).
"""

from __future__ import annotations

import _thread
import builtins
import json
import math
import os
import resource
import signal
import sys
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

MESSAGE_CHARS = 300  # a reason is read by a person; a megabyte-long exception message is not
_MAX_PROCESSES = 64  # RLIMIT_NPROC: a fork bomb stops here (the parent kills the sandbox on timeout)


class _Refusal(Exception):
    """A call that produced no verdict; ``reason`` is what the parent reports."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _describe(exc: BaseException) -> str:
    """'<Type>: <message>', shortened; a user's __str__ may itself fail."""
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable message>"
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


def _take_protocol_fds() -> tuple[int, int]:
    """Move the protocol pipes to private descriptors and point 0, 1, 2 at /dev/null, so that
    print(), input() or os.write(1, ...) in user code cannot corrupt or read the protocol."""
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    return proto_in, proto_out


def _apply_limits(memory_mb: int) -> None:
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # a large allocation raises MemoryError
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # no file may grow, whatever gets through
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash must not litter the disk
    resource.setrlimit(resource.RLIMIT_NPROC, (_MAX_PROCESSES, _MAX_PROCESSES))
    # Writing past RLIMIT_FSIZE should fail with an error, not kill the process with SIGXFSZ.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def _arm_cpu_backstop(timeout_s: float) -> None:
    """Let this call use at most ceil(timeout)+1 more CPU seconds before SIGXCPU kills the
    process - the parent's wall clock normally acts first; this covers a parent that died."""
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime) + math.ceil(timeout_s) + 1
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _load(key: str, code: str, memory_mb: int) -> Callable[..., Any]:
    """Compile and run the module code once; return its score()."""
    try:
        compiled = compile(code, f"<scorer {key}>", "exec")
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise _Refusal(f"{type(exc).__name__}: {exc.msg}{where}") from None
    except (ValueError, MemoryError) as exc:  # e.g. a NUL byte in the source
        raise _Refusal(_describe(exc)) from None
    namespace: dict[str, Any] = {"__name__": "scorer", "__builtins__": builtins}
    try:
        exec(compiled, namespace)
    except MemoryError:
        raise _Refusal(f"ran out of memory (limit {memory_mb} MiB)") from None
    except BaseException as exc:  # SystemExit too: the process must outlive the scorer
        raise _Refusal(_describe(exc)) from None
    score: Callable[..., Any] | None = namespace.get("score")
    if not callable(score):
        raise _Refusal("code defines no score() function")
    return score


def _call(score: Callable[..., Any], args: dict[str, Any], memory_mb: int) -> float | bool:
    try:
        value = score(args["input"], args["output"], args["expected"], args["spans"], args["metadata"])
    except MemoryError:
        raise _Refusal(f"ran out of memory (limit {memory_mb} MiB)") from None
    except BaseException as exc:
        raise _Refusal(_describe(exc)) from None
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        try:
            return float(value)  # NaN, inf and 1.5 pass through: range checks happen elsewhere
        except OverflowError:
            raise _Refusal("score() returned an int too large for a float") from None
    raise _Refusal(f"score() returned {type(value).__name__}, expected a number in 0..1")


class _Runner:
    def __init__(self, memory_mb: int, cache_size: int) -> None:
        self.memory_mb = memory_mb
        self.cache_size = cache_size
        # Compiled score() by scorer version; least recently used first.
        self.cache: OrderedDict[str, Callable[..., Any]] = OrderedDict()

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        rid, key, code = request["id"], request["key"], request["code"]
        # "loaded": whether this process now holds the key, so the parent knows to send the code.
        reply: dict[str, Any] = {"id": rid, "compiled": False, "loaded": False}
        _arm_cpu_backstop(float(request["timeout"]))  # module-level code counts too
        score = self.cache.get(key)
        if score is None:
            if code is None:
                return {"id": rid, "missing": True}
            try:
                score = _load(key, code, self.memory_mb)
            except _Refusal as refusal:
                return reply | {"ok": False, "error": refusal.reason}
            reply["compiled"] = True
            self.cache[key] = score
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        self.cache.move_to_end(key)
        reply["loaded"] = True
        # One call ("args"), or many subjects of one scorer in one message ("batch").
        results: list[dict[str, Any]] = []
        for args in request["batch"] if "batch" in request else [request["args"]]:
            try:
                results.append({"ok": True, "value": _call(score, args, self.memory_mb)})
            except _Refusal as refusal:
                results.append({"ok": False, "error": refusal.reason})
        if "batch" in request:
            reply |= {"ok": True, "results": results}
        else:
            reply |= results[0]
        if _thread._count():
            # A thread outliving its call could watch or alter later calls of other scorers.
            reply |= {"ok": False, "error": "code left a background thread running", "fatal": True}
        return reply


def _send(fd: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()  # json writes NaN/Infinity; the parent reads them
    while data:
        data = data[os.write(fd, data):]


def _lines(fd: int) -> Iterator[bytes]:
    """The protocol lines read from fd, until end of file."""
    buffer = bytearray()
    scanned = 0  # no newline before this offset: keeps big requests linear to read
    while True:
        newline = buffer.find(b"\n", scanned)
        if newline >= 0:
            yield bytes(buffer[:newline])
            del buffer[: newline + 1]
            scanned = 0
            continue
        scanned = len(buffer)
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        buffer += chunk


def main() -> None:
    memory_mb, cache_size = int(sys.argv[1]), int(sys.argv[2])
    proto_in, proto_out = _take_protocol_fds()
    sys.dont_write_bytecode = True  # the file system is read-only: imports must not try to write .pyc
    try:
        _apply_limits(memory_mb)
    except BaseException as exc:
        _send(proto_out, {"ready": False, "error": _describe(exc)})
        return
    _send(proto_out, {"ready": True})
    runner = _Runner(memory_mb, cache_size)
    for line in _lines(proto_in):
        request: dict[str, Any] = {}
        try:
            request = json.loads(line)
            reply = runner.handle(request)
        except MemoryError:
            reply = {"id": request.get("id"), "ok": False,
                     "error": f"ran out of memory (limit {memory_mb} MiB)"}
        _send(proto_out, reply)


if __name__ == "__main__":
    main()
