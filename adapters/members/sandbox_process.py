"""One sandbox process: start it confined, send it a request, read its reply, name how it ended.

This is the layer under ``adapters.members.sandbox``'s pool, which decides which process serves
whom and when one is replaced; here is only what it takes to talk to one process running
``adapters/members/_sandbox_runner.py`` (whose docstring describes the protocol: one JSON object
per line each way). Kept apart so that the pool reads as slots, tenancy and batching, and the
pipes, handshakes and exit codes are read once, here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

from adapters.members.isolation import CHILD_ENV, Confinement

# The standard library's logger: this module and isolation.py import nothing outside it, so that
# the security tests can drive a sandbox with Debian's python3 as an unprivileged user.
log = logging.getLogger(__name__)

_RUNNER_SOURCE = Path(__file__).with_name("_sandbox_runner.py").read_text()
_START_TIMEOUT_S = 10.0  # a fresh process must say "ready" within this
_EXIT_WAIT_S = 1.0  # how long a process that closed its pipe gets to report how it ended
MAX_REQUEST_BYTES = 16 * 1024 * 1024
# A reply is a few hundred bytes a subject; a batch's, up to 256 subjects whose reasons (300
# characters, non-ASCII escaped to six bytes each) may take ~2 KiB apiece. A longer line is not
# from the runner.
_REPLY_LIMIT = 1 << 20


class Broken(Exception):
    """The process stopped speaking the protocol: end of file, garbage, or a reply out of turn."""

    def __init__(self, what: str, *, ended: bool = False) -> None:
        super().__init__(what)
        self.ended = ended  # its end of the pipe closed: the process is probably exiting


class StartFailed(Exception):
    """A process could not be started, or did not say it was ready; ``str(exc)`` says why."""


async def spawn(confinement: Confinement, memory_limit_mb: int, keys: int,
                processes_per_call: int = 1) -> asyncio.subprocess.Process:
    """Start one runner inside ``confinement``, limited to ``memory_limit_mb`` and keeping ``keys``
    compiled scorers, and wait for its "ready". A call's code may run ``processes_per_call``
    processes (its own included: 1 forbids fork and threads). Raises StartFailed; a process that
    does not get that far is killed with its sandbox."""
    seccomp_fd = confinement.seccomp_pipe()
    own_pid_namespace = "1" if confinement.mode == "bwrap" else "0"
    cmd = confinement.command(["-I", "-S", "-c", _RUNNER_SOURCE, str(memory_limit_mb), str(keys),
                               str(processes_per_call), own_pid_namespace], seccomp_fd)
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env=CHILD_ENV, cwd="/",
            pass_fds=() if seccomp_fd is None else (seccomp_fd,),
            start_new_session=True,  # its own process group, killed as a whole
            limit=_REPLY_LIMIT)
    except OSError as exc:
        raise StartFailed(f"could not start a sandbox: {exc}") from exc
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
    try:
        hello = await asyncio.wait_for(_read_message(proc), _START_TIMEOUT_S)
        if hello.get("ready") is not True:
            raise Broken(str(hello.get("error")))
    except (TimeoutError, Broken) as exc:
        kill(proc)
        await reap(proc)
        raise StartFailed(f"could not start a sandbox: {exc or 'no answer'} "
                          f"(exit code {proc.returncode})") from exc
    except BaseException:
        kill(proc)
        raise
    return proc


async def exchange(proc: asyncio.subprocess.Process, rid: int, key: str, code: str | None,
                   timeout_s: float, *, field: str, payload_json: bytes) -> dict[str, Any]:
    """Send one request - ``code`` None when the process should hold ``key`` - with the
    pre-encoded ``payload_json`` as ``field`` ("args" or "batch"), and read its reply.
    Raises Broken when the pipe closes or the reply is not the answer to this request."""
    assert proc.stdin is not None
    head = json.dumps({"id": rid, "key": key, "code": code, "timeout": timeout_s}).encode()
    # Splice the pre-encoded arguments in rather than encoding them again.
    request = b"".join((head[:-1], b', "', field.encode(), b'": ', payload_json, b"}\n"))
    try:
        proc.stdin.write(request)
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise Broken("pipe closed", ended=True) from exc
    reply = await _read_message(proc)
    if reply.get("id") != rid:
        raise Broken("reply out of turn")
    return reply


async def _read_message(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    try:
        line = await proc.stdout.readline()
    except ValueError as exc:  # longer than the stream limit
        raise Broken("oversized reply") from exc
    if not line.endswith(b"\n"):
        raise Broken("end of file", ended=True)
    try:
        message = json.loads(line)
    except ValueError as exc:
        raise Broken("garbled reply") from exc
    if not isinstance(message, dict):
        raise Broken("garbled reply")
    return message


async def crash_reason(proc: asyncio.subprocess.Process, broken: Broken, timeout_s: float) -> str:
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


def kill(proc: asyncio.subprocess.Process) -> None:
    """End a sandbox process with everything it runs. Under bubblewrap that is its child, the
    init of the sandbox's PID namespace: the kernel ends the whole namespace with it, and
    bubblewrap reaps it and exits by itself. Killing bubblewrap first would leave that child a
    zombie of the host's init, which in a container may never reap it (a pid lost per sandbox
    ended). Without such a child (unsafe-none, or not started that far): the process group."""
    if proc.returncode is not None:  # already reaped: its pid may belong to someone else now
        return
    inits = _namespace_inits(proc.pid)
    for pidfd in inits:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass
        finally:
            os.close(pidfd)
    if not inits:
        _kill_group(proc)


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:  # not the group leader after all (should not happen)
        proc.kill()


def _namespace_inits(pid: int) -> list[int]:
    """Process descriptors (pidfds) of the children of ``pid`` that live in another PID
    namespace than it does. A pidfd is taken before the child is checked, so a signal sent
    through it reaches that process or none - never one that took its pid after it was reaped."""
    try:
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    inits = []
    for child in children:
        try:
            pidfd = os.pidfd_open(int(child))
        except OSError:
            continue
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
            ours = int(stat[stat.rindex(")") + 2:].split()[1]) == pid  # still the child of ``pid``
            if ours and os.readlink(f"/proc/{child}/ns/pid") != namespace:
                inits.append(pidfd)
                continue
        except (OSError, ValueError):
            pass
        os.close(pidfd)
    return inits


async def reap(proc: asyncio.subprocess.Process) -> None:
    """Wait for a killed process to exit; if it does not soon, kill the sandbox's init again
    (it may have been starting), then the process group."""
    for end in (kill, _kill_group):
        try:
            await asyncio.wait_for(proc.wait(), _EXIT_WAIT_S)
            return
        except TimeoutError:
            end(proc)
    try:
        await asyncio.wait_for(proc.wait(), _START_TIMEOUT_S)
    except TimeoutError:
        log.warning("a killed sandbox process did not exit (pid %d)", proc.pid)
