"""The code-scorer sandbox, with real processes: verdicts, reasons, limits, isolation, recovery."""

from __future__ import annotations

import asyncio
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from adapters.members import isolation
from adapters.members import sandbox as sandbox_module
from adapters.members.sandbox import SandboxPool
from scoring.ports import CodeScorerError

ARGS: dict[str, Any] = {"input": "question", "output": "answer", "expected": None, "spans": [],
                        "metadata": {}}
TIMEOUT = 2.0
P = "project-a"  # the project whose code runs, unless a test says otherwise
HERE = str(Path(__file__).resolve())
ROOT = Path(__file__).resolve().parents[2]


def scorer(body: str, header: str = "") -> str:
    """Source with `header` at module level and `body` as the body of score()."""
    indented = "\n".join("    " + line for line in body.splitlines())
    return f"{header}\ndef score(input, output, expected, spans, metadata):\n{indented}\n"


@pytest.fixture(scope="module")
async def pool() -> AsyncIterator[SandboxPool]:
    sandbox = SandboxPool(2, per_project=2)
    await sandbox.start()
    assert sandbox.available, sandbox.unavailable_reason
    yield sandbox
    await sandbox.close()


async def reason(pool: SandboxPool, code: str, args: dict[str, Any] = ARGS, limit_s: float = TIMEOUT) -> str:
    """The reason the call fails with, which must not be retriable."""
    with pytest.raises(CodeScorerError) as caught:
        await pool.run(P, f"k-{hash(code)}", code, args, limit_s)
    assert not caught.value.retriable  # the user's code caused it: retrying would not help
    return str(caught.value)


# --- verdicts -----------------------------------------------------------------------------------

async def test_returns_a_float(pool: SandboxPool) -> None:
    value = await pool.run(P, "s1:a", scorer("return 0.25"), ARGS, TIMEOUT)
    assert value == 0.25 and type(value) is float
    value = await pool.run(P, "s1:b", scorer("return 1"), ARGS, TIMEOUT)  # an int becomes a float
    assert value == 1.0 and type(value) is float


async def test_returns_a_bool(pool: SandboxPool) -> None:
    assert await pool.run(P, "s2", scorer("return output == 'answer'"), ARGS, TIMEOUT) is True
    code = scorer("return output == 'answer'")
    assert await pool.run(P, "s2", code, {**ARGS, "output": "x"}, TIMEOUT) is False


async def test_arguments_are_passed_positionally(pool: SandboxPool) -> None:
    code = scorer("return len(input) + len(output) + expected['n'] + len(spans) + metadata['m']")
    args = {"input": "ab", "output": "c", "expected": {"n": 10}, "spans": [{"name": "s"}],
            "metadata": {"m": 100}}
    assert await pool.run(P, "s3", code, args, TIMEOUT) == 114.0


async def test_out_of_range_and_nan_are_returned_as_they_are(pool: SandboxPool) -> None:
    assert await pool.run(P, "s4:a", scorer("return 1.5"), ARGS, TIMEOUT) == 1.5
    nan = await pool.run(P, "s4:b", scorer("return float('nan')"), ARGS, TIMEOUT)
    assert isinstance(nan, float) and math.isnan(nan)
    assert await pool.run(P, "s4:c", scorer("return float('-inf')"), ARGS, TIMEOUT) == -math.inf


async def test_compiled_once_per_key_per_process_and_each_call_starts_afresh() -> None:
    # One process, so every call lands on it: the code is compiled once, but what a call changes
    # (module state here) ends with the call - each call runs the module anew in a child.
    sandbox = SandboxPool(1)
    await sandbox.start()
    try:
        code = scorer("global calls\ncalls += 1\nreturn calls", header="calls = 0")
        assert [await sandbox.run(P, "count:v1", code, ARGS, TIMEOUT) for _ in range(3)] == [1.0, 1.0, 1.0]
        assert sandbox.compilations == 1
        # Another version is compiled apart, and does not disturb the first.
        assert await sandbox.run(P, "count:v2", code, ARGS, TIMEOUT) == 1.0
        assert await sandbox.run(P, "count:v1", code, ARGS, TIMEOUT) == 1.0
        assert sandbox.compilations == 2
        batch = await sandbox.run_many(P, "count:v1", code, [ARGS] * 3, TIMEOUT)
        assert batch == [1.0, 2.0, 3.0], "the subjects of one message share one child"
    finally:
        await sandbox.close()


async def test_a_process_is_replaced_after_many_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_module, "_CALLS_PER_PROCESS", 2)
    sandbox = SandboxPool(1)
    await sandbox.start()
    try:
        # The third call goes to a fresh process, which has to compile the code again.
        assert [await sandbox.run(P, "recycle", scorer("return 0.5"), ARGS, TIMEOUT) for _ in range(3)] == [0.5] * 3
        assert sandbox.compilations == 2
    finally:
        await sandbox.close()


async def test_a_retired_process_is_replaced_by_one_started_in_the_background(monkeypatch: pytest.MonkeyPatch) -> None:
    # A call never waits for a process to start because the one before it reached its age:
    # its replacement starts past half the old one's calls.
    monkeypatch.setattr(sandbox_module, "_CALLS_PER_PROCESS", 4)
    sandbox = SandboxPool(1)
    await sandbox.start()
    try:
        code = scorer("return 0.5")
        assert [await sandbox.run(P, "spare", code, ARGS, TIMEOUT) for _ in range(12)] == [0.5] * 12
        assert sandbox.compilations == 3, "a fresh process (compiling again) every 4 calls"
        assert await sandbox.run_many(P, "spare", code, [ARGS] * 4, TIMEOUT) == [0.5] * 4
        assert sandbox.compilations == 4, "batches retire processes the same way"
        assert await sandbox.run(P, "spare", code, ARGS, TIMEOUT) == 0.5
        assert sandbox.compilations == 5
        assert sandbox.cold_starts == 0, "every replacement was started ahead"
        assert sandbox.live_processes == 1
    finally:
        await sandbox.close()
    assert sandbox.live_processes == 0


async def test_code_is_sent_again_when_the_process_lost_it() -> None:
    sandbox = SandboxPool(1)
    await sandbox.start()
    try:
        # The parent believes the process holds a key it never saw: the process says so, and the
        # parent resends the code.
        sandbox._slots[0].loaded["never-sent"] = None
        assert await sandbox.run(P, "never-sent", scorer("return 0.5"), ARGS, TIMEOUT) == 0.5
        assert sandbox.compilations == 1
    finally:
        await sandbox.close()


# --- reasons ------------------------------------------------------------------------------------

async def test_exception_in_score(pool: SandboxPool) -> None:
    assert await reason(pool, scorer("return 1 / 0")) == "ZeroDivisionError: division by zero"
    long = await reason(pool, scorer("raise ValueError('x' * 5000)"))
    assert long.startswith("ValueError: xxx") and len(long) <= 400


async def test_exception_at_module_level(pool: SandboxPool) -> None:
    assert await reason(pool, scorer("return 1", header="raise KeyError('setup')")) == "KeyError: 'setup'"


async def test_syntax_error_names_the_line(pool: SandboxPool) -> None:
    text = await reason(pool, "x = 1\n\ndef score(input, output:\n    return 1\n")
    assert text.startswith("SyntaxError: ") and text.endswith("(line 3)")


async def test_no_score_function(pool: SandboxPool) -> None:
    assert await reason(pool, "def scorer(*args):\n    return 1\n") == "code defines no score() function"
    assert await reason(pool, "score = 0.5\n") == "code defines no score() function"


async def test_not_a_number(pool: SandboxPool) -> None:
    assert await reason(pool, scorer("return 'high'")) == "score() returned str, expected a number in 0..1"
    assert await reason(pool, scorer("return None")) == "score() returned NoneType, expected a number in 0..1"


async def test_exit_is_reported_not_obeyed(pool: SandboxPool) -> None:
    assert await reason(pool, scorer("import sys\nsys.exit(2)")) == "SystemExit: 2"
    assert await pool.run(P, "after-exit", scorer("return 0.5"), ARGS, TIMEOUT) == 0.5


# --- limits and recovery ------------------------------------------------------------------------

async def test_infinite_loop_times_out_and_the_pool_recovers(pool: SandboxPool) -> None:
    started = time.monotonic()
    assert await reason(pool, scorer("while True:\n    pass"), limit_s=0.3) == "timed out after 300 ms"
    assert time.monotonic() - started < 2
    assert await pool.run(P, "after-loop", scorer("return 0.5"), ARGS, TIMEOUT) == 0.5


async def test_two_gib_allocation_runs_out_of_memory(pool: SandboxPool) -> None:
    code = scorer("data = bytearray(2 * 1024**3)\nreturn 1")
    assert await reason(pool, code) == "ran out of memory (limit 256 MiB)"
    assert await pool.run(P, "after-oom", scorer("return 0.5"), ARGS, TIMEOUT) == 0.5


async def test_crash_is_reported_and_others_are_unaffected(pool: SandboxPool) -> None:
    crash = pool.run(P, "crash", scorer("import os\nos._exit(3)"), ARGS, TIMEOUT)
    slow = pool.run(P, "slow", scorer("import time\ntime.sleep(0.2)\nreturn 0.75"), ARGS, TIMEOUT)
    crashed, fine = await asyncio.gather(crash, slow, return_exceptions=True)
    assert isinstance(crashed, CodeScorerError) and str(crashed) == "sandbox crashed (exit code 3)"
    assert not crashed.retriable
    assert fine == 0.75
    assert await pool.run(P, "after-crash", scorer("return 0.5"), ARGS, TIMEOUT) == 0.5


async def test_a_call_can_start_neither_a_thread_nor_a_process(pool: SandboxPool) -> None:
    # Nothing a call starts could outlive it: the kernel refuses to create either.
    thread = scorer("import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\nreturn 1")
    assert await reason(pool, thread) == "RuntimeError: can't start new thread"
    fork = scorer("import os\nif os.fork() == 0:\n    os._exit(0)\nreturn 1")
    assert await reason(pool, fork) == "BlockingIOError: [Errno 11] Resource temporarily unavailable"


async def test_cancelled_call_does_not_leak_a_busy_process(pool: SandboxPool) -> None:
    call = asyncio.ensure_future(pool.run(P, "cancel", scorer("while True:\n    pass"), ARGS, 30))
    await asyncio.sleep(0.2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    results = await asyncio.gather(*(pool.run(P, "after-cancel", scorer("return 0.5"), ARGS, TIMEOUT)
                                     for _ in range(4)))
    assert results == [0.5] * 4
    assert pool.live_processes <= pool.size  # the interrupted process is gone, not leaked


async def test_concurrent_calls_share_the_pool(pool: SandboxPool) -> None:
    code = scorer("import time\ntime.sleep(0.1)\nreturn int(input) / 10")
    started = time.monotonic()
    results = await asyncio.gather(*(pool.run(P, "conc", code, {**ARGS, "input": str(i)}, TIMEOUT)
                                     for i in range(10)))
    assert results == [i / 10 for i in range(10)]  # each caller gets its own answer
    assert time.monotonic() - started >= 0.45  # at most 2 at a time: 5 rounds of 0.1 s


# --- isolation: each test attacks the boundary the way a hostile tenant's scorer would ----------

async def test_no_secret_of_the_worker_is_readable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGW_TEST_SECRET", "hunter2-the-secret")
    sandbox = SandboxPool(1)  # started after the secret was set
    await sandbox.start()
    try:
        # Every environment it can see - its own, and every process's in its /proc - is clean.
        code = scorer(
            "seen = [str(os.environ)]\n"
            "for pid in os.listdir('/proc'):\n"
            "    try:\n        seen.append(open(f'/proc/{pid}/environ', 'rb').read().decode('latin-1'))\n"
            "    except OSError:\n        pass\n"
            "return float(any('hunter2' in s for s in seen))", header="import os")
        assert await sandbox.run(P, "env", code, ARGS, TIMEOUT) == 0.0
        # The worker's processes are not even visible: the sandbox has a PID namespace of its own.
        code = scorer(f"return float(os.path.exists('/proc/{os.getpid()}/environ') or "
                      "len([p for p in os.listdir('/proc') if p.isdigit()]) > 3)", header="import os")
        assert await sandbox.run(P, "pids", code, ARGS, TIMEOUT) == 0.0
    finally:
        await sandbox.close()


def _descendant_identities() -> set[tuple[str, str, str]]:
    """(real, effective, saved and file-system uids; the same gids; supplementary groups), as
    the host sees them, of the sandbox processes (bwrap and the runner) below this one. A child
    caught between fork and exec still carries this process's command line and identity: it is
    not a sandbox yet, and is left out."""
    parent_of: dict[int, int] = {}
    uid_of: dict[int, tuple[str, str, str]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        parent_of[int(pid)] = int(status["PPid"])
        if cmdline.startswith((b"/usr/bin/bwrap\0", b"/usr/bin/python3\0-I\0-S\0-c\0")):
            uid_of[int(pid)] = (status["Uid"].strip(), status["Gid"].strip(), status["Groups"].strip())
    me, found = os.getpid(), set()
    for pid in parent_of:
        ancestor = parent_of.get(pid)
        while ancestor not in (None, 0, 1, me):
            ancestor = parent_of.get(ancestor)
        if ancestor == me and pid in uid_of:
            found.add(uid_of[pid])
    return found


async def test_runs_as_an_unprivileged_identity(pool: SandboxPool) -> None:
    code = scorer("import time\ntime.sleep(0.5)\nreturn 1.0")
    call = asyncio.ensure_future(pool.run(P, "uid", code, ARGS, TIMEOUT))
    await asyncio.sleep(0.2)
    identities = _descendant_identities()
    assert await call == 1.0
    assert identities
    if os.geteuid() == 0:
        # Every one of its uids and gids switched (none left at root to switch back to), and no
        # supplementary group of root's kept.
        assert identities == {("\t".join(["65534"] * 4), "\t".join(["65534"] * 4), "")}, identities
    else:
        assert {uids.split()[0] for uids, _, _ in identities} == {str(os.geteuid())}


async def test_the_service_files_and_the_host_are_not_visible(pool: SandboxPool) -> None:
    here = HERE
    code = scorer(f"return float(any(os.path.exists(p) for p in ({here!r}, '/etc/passwd', '/root', '/work', '/home')))",
                  header="import os")
    assert await pool.run(P, "files", code, ARGS, TIMEOUT) == 0.0
    # Writing: only an empty scratch /tmp; the rest is read-only.
    text = await reason(pool, scorer("open('/usr/evil', 'w').write('x')\nreturn 1"))
    assert text.startswith(("OSError", "PermissionError")) and ("Read-only" in text or "denied" in text)
    stdlib = scorer("return statistics.mean([0.25, 0.75])", header="import re, json, statistics, difflib")
    assert await pool.run(P, "stdlib", stdlib, ARGS, TIMEOUT) == 0.5


async def test_network_is_unreachable(pool: SandboxPool) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        code = scorer(f"socket.create_connection(('127.0.0.1', {port}), timeout=1)\nreturn 1",
                      header="import socket")
        assert "Address family not supported" in await reason(pool, code)
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody got through


async def test_escapes_are_refused_by_the_kernel(pool: SandboxPool) -> None:
    # What the escape did next - and what else an escape needs: each call is refused.
    attempts = {
        "kill the parent": "signal.pidfd_send_signal(os.pidfd_open(os.getppid()), 9)",
        "kill pid 1": "os.kill(1, 9)",
        "new user namespace": "check(libc.unshare(0x10000000))",
        "enter a namespace": "check(libc.setns(os.open('/proc/1/ns/net', os.O_RDONLY), 0))",
        "mount": "check(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))",
        "ptrace": "check(libc.ptrace(16, 1, None, None))",  # PTRACE_ATTACH
        "read another process's memory": "open('/proc/1/mem', 'rb').read(1)",
        "start a program that escapes": "subprocess.run(['/usr/bin/unshare', '--user', 'true'], check=True)",
    }
    header = ("import ctypes, os, signal, subprocess\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "def check(rc):\n    if rc != 0:\n        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))\n")
    for what, line in attempts.items():
        text = await reason(pool, scorer(f"{line}\nreturn 1.0", header=header))
        assert text.split(":")[0] in ("PermissionError", "OSError", "CalledProcessError", "ProcessLookupError",
                                      "BlockingIOError"), \
            (what, text)


async def test_a_scorer_cannot_touch_another_projects_calls() -> None:
    # One process, so that sharing would be certain: project A patches the runner and builtins.
    sandbox = SandboxPool(1)
    await sandbox.start()
    try:
        hijack = scorer("import sys\nsys.modules['__main__']._call = lambda *a: 1.0\nreturn 0.0")
        assert await sandbox.run("tenant-a", "hijack", hijack, ARGS, TIMEOUT) == 0.0
        victim = scorer("return 0.25")
        assert await sandbox.run("tenant-b", "victim", victim, ARGS, TIMEOUT) == 0.25
        assert sandbox.recycled_for_another_project == 1
    finally:
        await sandbox.close()


async def test_one_project_cannot_hold_every_slot() -> None:
    sandbox = SandboxPool(2)  # one slot each at most
    await sandbox.start()
    try:
        assert sandbox.per_project == 1
        spin = scorer("while True:\n    pass")
        hogs = [asyncio.ensure_future(sandbox.run("hog", f"spin{i}", spin, ARGS, 30)) for i in range(2)]
        await asyncio.sleep(0.3)
        other = await asyncio.wait_for(sandbox.run("other", "quick", scorer("return 0.5"), ARGS, TIMEOUT), 10)
        assert other == 0.5
        assert not all(h.done() for h in hogs)  # the hog's calls still spin (or wait for its one slot)
        for h in hogs:
            h.cancel()
        await asyncio.gather(*hogs, return_exceptions=True)
    finally:
        await sandbox.close()


# --- fail closed, and the pool's own life ---------------------------------------------------------

async def test_without_isolation_code_does_not_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(isolation, "_SYSTEM_PATH", str(tmp_path))  # no bwrap to be found
    sandbox = SandboxPool(1)
    await sandbox.start()
    try:
        assert not sandbox.available and "bubblewrap" in (sandbox.unavailable_reason or "")
        with pytest.raises(CodeScorerError) as caught:
            await sandbox.run(P, "k", scorer("return 1"), ARGS, TIMEOUT)
        assert str(caught.value).startswith("sandbox unavailable: ") and not caught.value.retriable
        assert sandbox.live_processes == 0
    finally:
        await sandbox.close()


async def test_unsafe_none_is_an_explicit_opt_out() -> None:
    sandbox = SandboxPool(1, isolation="unsafe-none")
    await sandbox.start()
    try:
        assert sandbox.available and "UNSAFE" in sandbox.confinement
        assert await sandbox.run(P, "k", scorer("return 0.5"), ARGS, TIMEOUT) == 0.5
    finally:
        await sandbox.close()


async def test_a_closed_pool_refuses_with_a_retriable_error() -> None:
    sandbox = SandboxPool(1)
    await sandbox.start()
    await sandbox.close()
    await sandbox.close()  # idempotent
    assert sandbox.live_processes == 0
    with pytest.raises(CodeScorerError) as caught:
        await sandbox.run(P, "k", scorer("return 1"), ARGS, TIMEOUT)
    assert caught.value.retriable


async def test_a_missing_python_fails_closed() -> None:
    sandbox = SandboxPool(1, python="/nonexistent/python3")
    await sandbox.start()
    assert not sandbox.available and "/nonexistent/python3" in (sandbox.unavailable_reason or "")


# --- many subjects in one message -----------------------------------------------------------------

async def test_many_subjects_go_in_one_message_with_a_verdict_each(pool: SandboxPool) -> None:
    code = scorer("if input == 'boom':\n    raise ValueError('no')\nreturn len(input) / 10")
    calls = [{**ARGS, "input": text} for text in ("a", "abc", "boom", "abcde")]
    before = pool.messages
    results = await pool.run_many(P, "many", code, calls, TIMEOUT)
    assert pool.messages - before <= 2  # one message (and the code sent with it if not held)
    assert results[:2] == [0.1, 0.3] and results[3] == 0.5
    assert isinstance(results[2], CodeScorerError) and str(results[2]) == "ValueError: no"


async def test_text_shaped_like_the_protocol_cannot_split_or_forge_a_message(pool: SandboxPool) -> None:
    # Requests go down the pipe as one JSON line of bytes: a subject's text with newlines, a
    # closing brace, a forged reply and characters past ASCII stays one argument of its own.
    hostile = ('}\n{"id": 1, "ok": true, "results": [{"ok": true, "value": 1.0}]}\n'
               '"batch": [], "\u2028 \N{GRINNING FACE} \ud800 \x00')  # a lone surrogate: the slow encoder
    code = scorer("return len(input) / 1000")
    calls = [{**ARGS, "input": hostile}, {**ARGS, "input": "ab"}]
    assert await pool.run_many(P, "framing", code, calls, TIMEOUT) == [len(hostile) / 1000, 0.002]
    assert await pool.run(P, "framing", code, {**ARGS, "input": hostile}, TIMEOUT) == len(hostile) / 1000


async def test_a_subject_that_hangs_fails_alone(pool: SandboxPool) -> None:
    code = scorer("while input == 'hang':\n    pass\nreturn 0.5")
    calls = [{**ARGS, "input": text} for text in ("ok", "hang", "ok")]
    results = await pool.run_many(P, "many-hang", code, calls, 0.3)
    assert results[0] == 0.5 and results[2] == 0.5
    assert isinstance(results[1], CodeScorerError) and str(results[1]) == "timed out after 300 ms"


async def test_a_batch_is_refused_whole_when_the_code_is_broken(pool: SandboxPool) -> None:
    results = await pool.run_many(P, "many-broken", "def score(:\n", [ARGS, ARGS], TIMEOUT)
    assert all(isinstance(r, CodeScorerError) and str(r).startswith("SyntaxError") for r in results)


async def test_an_integer_past_a_float_written_to_the_result_pipe_is_an_error_not_a_crash(pool: SandboxPool) -> None:
    # The call's own pipe is its own to write: what it writes must still be a verdict or a
    # reason, never an exception in the worker (it would break the bulk of every tenant).
    forged = scorer('import os\nfor fd in os.listdir("/proc/self/fd"):\n'
                    '    try:\n'
                    '        pipe = int(fd) > 2 and os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")\n'
                    '    except OSError:\n'
                    '        continue\n'
                    '    if pipe:\n'
                    '        os.write(int(fd), b\'{"v": 1\' + b"0" * 400 + b"}\\n")\n'
                    '        os._exit(0)\nreturn 0.5')
    assert await reason(pool, forged) == "score() returned an int too large for a float"
    results = await pool.run_many(P, "forged-many", forged, [ARGS, ARGS], TIMEOUT)
    assert all(isinstance(r, CodeScorerError) for r in results)
    assert await pool.run(P, "after-forged", scorer("return 0.5"), ARGS, TIMEOUT) == 0.5


async def test_a_batch_of_long_non_ascii_reasons_is_still_one_message(pool: SandboxPool) -> None:
    code = scorer('raise ValueError("réponse invalide: " + "é" * 400)')
    before = pool.messages
    results = await pool.run_many(P, "long-reasons", code, [ARGS] * 256, TIMEOUT)
    assert pool.messages - before <= 2, "one message (and the code sent with it), not one per subject"
    assert all(isinstance(r, CodeScorerError) and str(r).startswith("ValueError: réponse invalide") for r in results)


def test_the_sandbox_identity_keeps_none_of_the_workers_groups(tmp_path: Path) -> None:
    # Root with supplementary groups (as a container's root may have): the sandboxes it starts
    # must hold none of them - nor root's uid or gid in any slot (setpriv, checked by ``prepare``).
    if os.geteuid() != 0:
        pytest.skip("only root switches the sandboxes' identity")
    script = tmp_path / "prepare_with_groups.py"
    script.write_text(
        "import asyncio, os, subprocess, sys\n"
        "os.setgroups([4, 27])\n"
        "from adapters.members import isolation\n"
        "from adapters.members.sandbox import DEFAULT_PYTHON\n"
        "confinement = asyncio.run(isolation.prepare('bwrap', DEFAULT_PYTHON, 65534))\n"
        "probe = 'import os; print(os.getresuid(), os.getresgid(), os.getgroups())'\n"
        "sys.stdout.write(subprocess.run([*confinement.identity, DEFAULT_PYTHON, '-I', '-S', '-c', probe],\n"
        "                                capture_output=True, text=True, check=True).stdout)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == "(65534, 65534, 65534) (65534, 65534, 65534) []".split()


async def test_what_starts_a_sandbox_comes_from_the_system_and_takes_no_inherited_descriptor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A PATH the worker inherited must not choose the program that runs as root (setpriv) or
    # bwrap; and a descriptor the worker was started with must not reach a sandbox (uvloop's
    # subprocesses do not close them in the child).
    for name in ("setpriv", "bwrap"):
        fake = tmp_path / name
        fake.write_text("#!/bin/sh\nexit 0\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    inherited = os.dup(0)
    os.set_inheritable(inherited, True)
    try:
        confinement = await isolation.prepare("bwrap", sandbox_module.DEFAULT_PYTHON, 65534)
        assert not os.get_inheritable(inherited)
    finally:
        os.close(inherited)
    assert confinement.prefix[0] == "/usr/bin/bwrap"
    if os.geteuid() == 0:
        assert confinement.identity[0] == "/usr/bin/setpriv"


def test_a_confinement_cannot_name_a_uid_without_switching_to_it() -> None:
    with pytest.raises(ValueError, match="switches to its uid"):
        isolation.Confinement("bwrap", "/usr/bin/python3", ("/usr/bin/bwrap",), b"", uid=65534)
    with pytest.raises(ValueError, match="switches to its uid"):
        isolation.Confinement("bwrap", "/usr/bin/python3", ("/usr/bin/bwrap",), b"", identity=("setpriv", "--"))


async def test_a_code_scorer_cannot_take_back_roots_identity(pool: SandboxPool) -> None:
    # The identity setpriv gave the sandbox is all it has: no saved root uid or gid to switch
    # back to, no group to add - each attempt fails, and none is left holding anything of root's.
    code = scorer("won = 0\n"
                  "for attempt in (lambda: os.setresuid(0, 0, 0), lambda: os.setuid(0), lambda: os.seteuid(0),\n"
                  "                lambda: os.setresgid(0, 0, 0), lambda: os.setgid(0), lambda: os.setgroups([0])):\n"
                  "    try:\n"
                  "        attempt()\n"
                  "        won += 1\n"
                  "    except OSError:\n"
                  "        pass\n"
                  "return float(won == 0 and 0 not in os.getresuid() + os.getresgid())", header="import os")
    assert await pool.run(P, "back-to-root", code, ARGS, TIMEOUT) == 1.0


def test_under_uvloop_no_descriptor_of_the_worker_reaches_a_sandbox(tmp_path: Path) -> None:
    # uvloop's subprocesses do not close a parent's other descriptors: a worker started with an
    # open, inheritable one (a secret file, say) must still not hand it to bwrap or the runner.
    canary = tmp_path / "canary-secret"
    canary.write_text("CANARY-fd")
    script = tmp_path / "pool_on_uvloop.py"
    script.write_text(
        "import os, sys, uvloop\n"
        "from adapters.members.sandbox import SandboxPool\n"
        f"fd = os.open({str(canary)!r}, os.O_RDONLY)\n"
        "os.set_inheritable(fd, True)\n"
        "async def main():\n"
        "    pool = SandboxPool(1)\n"
        "    await pool.start()\n"
        "    code = 'import time\\ndef score(*a):\\n    time.sleep(0.5)\\n    return 1.0\\n'\n"
        "    try:\n"
        "        assert await pool.run('p', 'k', code, {'input': '', 'output': '', 'expected': None,\n"
        "                              'spans': [], 'metadata': {}}, 2.0) == 1.0\n"
        "        holders = []\n"
        "        for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "            if int(pid) == os.getpid():\n"
        "                continue\n"
        "            try:\n"
        "                links = [os.readlink(f'/proc/{pid}/fd/{n}') for n in os.listdir(f'/proc/{pid}/fd')]\n"
        "            except OSError:\n"
        f"                continue\n"
        f"            holders += [pid for link in links if link == {str(canary)!r}]\n"
        "        print('holders', holders, 'sandboxes', pool.live_processes)\n"
        "    finally:\n"
        "        await pool.close()\n"
        "uvloop.run(main())\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    said = next(line for line in done.stdout.splitlines() if line.startswith("holders"))
    assert said.split() == ["holders", "[]", "sandboxes", "1"], done.stdout
