"""The program each sandbox process runs: a supervisor that runs each request of users' code in a child of its own.

Standard library only, started inside ``adapters.members.isolation``'s confinement. The one rule: the
supervisor never runs tenant code, and each child - no descriptor but its own result pipe, no fork, a hard
CPU limit - ends before the answer is sent. Why, and the protocol with the worker: docs/design-notes.md.
"""

from __future__ import annotations

import builtins
import ctypes
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
    from types import CodeType

MESSAGE_CHARS = 300  # a reason is read by a person; a megabyte-long exception message is not
_MAX_PROCESSES = 64  # RLIMIT_NPROC of the supervisor itself (it forks one child at a time)
_RESULT_BYTES = 4096  # what one subject's result may take on the child's pipe (a line is ~50)
_PR_SET_DUMPABLE = 4
# Standard modules loaded once here, so that a scorer importing them does not load them again in
# every child. Loading a module runs only the standard library's code, never a tenant's.
_PRELOADED = ("re", "math", "string", "collections", "itertools", "functools", "unicodedata",
              "difflib", "statistics")


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
    return _cut(text)


def _cut(text: str) -> str:
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"


# --- the supervisor's own set-up -------------------------------------------------------------------

def _take_protocol_fds() -> tuple[int, int]:
    """Move the protocol pipes to private descriptors and point 0, 1, 2 at /dev/null."""
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


def _forbid_inspection() -> None:
    """Not dumpable: a process of the same uid (the call's child) can then neither open this
    one's descriptors through /proc/PID/fd nor read or write its memory through /proc/PID/mem."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


# --- the child: where tenant code runs ------------------------------------------------------------

def _child(code: CodeType, subjects: list[dict[str, Any]], result_fd: int, cpu_s: int,
           processes: int, memory_mb: int) -> None:
    """Runs in the forked child and never returns: confine, load the module, score each subject,
    write one line per subject to ``result_fd``, exit."""
    try:
        os.closerange(3, result_fd)  # the protocol pipes above all: no reply can be forged
        os.closerange(result_fd + 1, 1 << 16)
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))  # soft: SIGXCPU; hard: SIGKILL
        try:
            score = _load(code, memory_mb)
        except _Refusal as refusal:
            _write(result_fd, {"module": refusal.reason})
            return
        for args in subjects:
            try:
                _write(result_fd, {"v": _call(score, args, memory_mb)})
            except _Refusal as refusal:
                _write(result_fd, {"e": refusal.reason})
    finally:
        os._exit(0)  # no atexit handler, finaliser or buffered write of the tenant's runs


def _load(code: CodeType, memory_mb: int) -> Callable[..., Any]:
    """Run the module code; return its score()."""
    namespace: dict[str, Any] = {"__name__": "scorer", "__builtins__": builtins}
    try:
        exec(code, namespace)
    except MemoryError:
        raise _Refusal(f"ran out of memory (limit {memory_mb} MiB)") from None
    except BaseException as exc:  # SystemExit too: the verdict is an error, not an exit
        raise _Refusal(_describe(exc)) from None
    score: Callable[..., Any] | None = namespace.get("score")
    if not callable(score):
        raise _Refusal("code defines no score() function")
    return score


def _call(score: Callable[..., Any], args: dict[str, Any], memory_mb: int) -> float | bool:
    try:
        # An argument the code never names is not sent (scoring/members/code_arguments.py): None.
        value = score(args.get("input"), args.get("output"), args.get("expected"), args.get("spans"),
                      args.get("metadata"))
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


def _write(fd: int, message: dict[str, Any]) -> None:
    try:
        _send(fd, message)
    except OSError:
        os._exit(0)  # the supervisor stopped reading: nothing more of this child is wanted


# --- the supervisor: one request -------------------------------------------------------------------

def _result(line: bytes) -> dict[str, Any]:
    """One line from a child, checked: ``{"v": verdict}``, ``{"e": reason}``, or (first line
    only) ``{"module": reason}`` when the module did not load. Anything else - a reply written to
    the pipe, garbage - is a protocol error. The child ran tenant code, so a line says only what
    that call's own code could have returned or raised; it never frames the reply."""
    try:
        entry = json.loads(line)
    except Exception:  # ValueError, RecursionError: the content is not ours
        entry = None
    if isinstance(entry, dict) and len(entry) == 1:
        value = entry.get("v")
        if isinstance(value, bool):
            return {"ok": True, "value": value}
        if isinstance(value, int | float):
            try:  # an integer written to the pipe by hand may be past a float (score() refuses those)
                return {"ok": True, "value": float(value)}
            except OverflowError:
                return {"ok": False, "error": "score() returned an int too large for a float"}
        for name in ("e", "module"):
            if isinstance(entry.get(name), str):
                return {"ok": False, "error": _cut(entry[name])} | ({"module": True} if name == "module" else {})
    return {"ok": False, "error": "sandbox crashed (protocol error)"}


def _ended(status: int, timeout_s: float) -> str:
    """Why a child stopped before writing a subject's result."""
    if os.WIFSIGNALED(status):
        if os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL):  # the CPU limits
            return f"timed out after {round(timeout_s * 1000)} ms"
        return f"sandbox crashed (exit code -{os.WTERMSIG(status)})"
    return f"sandbox crashed (exit code {os.waitstatus_to_exitcode(status)})"


class _Runner:
    def __init__(self, memory_mb: int, cache_size: int, processes: int, own_pid_namespace: bool) -> None:
        self.memory_mb = memory_mb
        self.cache_size = cache_size
        self.processes = processes
        self.own_pid_namespace = own_pid_namespace
        # Compiled module code by scorer version; least recently used first.
        self.cache: OrderedDict[str, CodeType] = OrderedDict()

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        rid, key, source = request["id"], request["key"], request["code"]
        # "loaded": whether this process now holds the key, so the parent knows to send the code.
        reply: dict[str, Any] = {"id": rid, "compiled": False, "loaded": False}
        code = self.cache.get(key)
        if code is None:
            if source is None:
                return {"id": rid, "missing": True}
            try:
                code = _compile(key, source)
            except _Refusal as refusal:
                return reply | {"ok": False, "error": refusal.reason}
            reply["compiled"] = True
            self.cache[key] = code
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        self.cache.move_to_end(key)
        reply["loaded"] = True
        # One call ("args"), or many subjects of one scorer in one message ("batch").
        batch = "batch" in request
        subjects: list[dict[str, Any]] = request["batch"] if batch else [request["args"]]
        timeout_s = float(request["timeout"])
        results: list[dict[str, Any]] = []
        try:
            while len(results) < len(subjects):
                # A child that stops early costs the subject it was on; the rest go to a new child.
                ran, ended = self._run(code, subjects[len(results):], timeout_s)
                results += ran
                if ended is not None:
                    results.append({"ok": False, "error": ended})
        except _Refusal as refusal:  # the module itself: no subject can be scored
            return reply | {"ok": False, "error": refusal.reason}
        left = self._others()
        if left:
            return reply | {"ok": False, "fatal": True,
                            "error": f"code left {left} process{'es' if left > 1 else ''} running"}
        if batch:
            return reply | {"ok": True, "results": results}
        return reply | results[0]

    def _run(self, code: CodeType, subjects: list[dict[str, Any]],
             timeout_s: float) -> tuple[list[dict[str, Any]], str | None]:
        """Score ``subjects`` in one child: the results it wrote, and why it stopped early (None
        when it wrote one for every subject). Raises _Refusal when the module did not load."""
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            _child(code, subjects, write_end, math.ceil(timeout_s) + 1, self.processes, self.memory_mb)
        os.close(write_end)
        try:
            data = _read_results(read_end, len(subjects))
        finally:
            os.close(read_end)  # a child still writing gets EPIPE and ends
        _, status = os.waitpid(pid, 0)
        lines = data.split(b"\n")[:-1]  # the last piece is empty, or a line the child did not finish
        results = [_result(line) for line in lines[: len(subjects)]]
        if results and results[0].pop("module", False):
            raise _Refusal(results[0]["error"])
        for result in results:
            result.pop("module", None)  # said past the first line: an error like any other
        return results, None if len(results) == len(subjects) else _ended(status, timeout_s)

    def _others(self) -> int:
        """Processes in this sandbox's PID namespace besides the supervisor and bubblewrap's init."""
        if not self.own_pid_namespace:
            return 0  # unsafe-none: the host's processes are all visible, and none is ours
        me = os.getpid()
        return sum(1 for name in os.listdir("/proc") if name.isdigit() and int(name) not in (1, me))


def _compile(key: str, source: str) -> CodeType:
    try:
        return compile(source, f"<scorer {key}>", "exec")
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise _Refusal(f"{type(exc).__name__}: {exc.msg}{where}") from None
    except (ValueError, MemoryError, RecursionError) as exc:  # a NUL byte, a nesting too deep
        raise _Refusal(_describe(exc)) from None


def _read_results(fd: int, count: int) -> bytes:
    """What a child wrote: until ``count`` lines, end of file, or ``count + 1`` results' worth of
    bytes - what one child may say. Not waiting for end of file once every line is in, so that a
    process the call left holding the pipe cannot keep the supervisor waiting."""
    chunks: list[bytes] = []
    size = lines = 0
    while lines < count and size <= (count + 1) * _RESULT_BYTES:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        lines += chunk.count(b"\n")
    return b"".join(chunks)


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
    memory_mb, cache_size, processes = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    own_pid_namespace = sys.argv[4] == "1"
    # The supervisor is its PID namespace's init: a signal reaches it only if it has a handler,
    # and Python's SIGINT handler is the one it would have. Without it no call can signal it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    proto_in, proto_out = _take_protocol_fds()
    sys.dont_write_bytecode = True  # the file system is read-only: imports must not try to write .pyc
    try:
        _apply_limits(memory_mb)
        _forbid_inspection()
        for name in _PRELOADED:
            __import__(name)
    except BaseException as exc:
        _send(proto_out, {"ready": False, "error": _describe(exc)})
        return
    _send(proto_out, {"ready": True})
    runner = _Runner(memory_mb, cache_size, processes, own_pid_namespace)
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
