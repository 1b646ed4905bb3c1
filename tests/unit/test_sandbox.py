"""The code-scorer sandbox, with real processes: verdicts, reasons, limits, isolation, recovery."""

from __future__ import annotations

import asyncio
import math
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from scoring import sandbox as sandbox_module
from scoring.sandbox import CodeScorerError, SandboxPool

ARGS: dict[str, Any] = {"input": "question", "output": "answer", "expected": None, "spans": [],
                        "metadata": {}}
TIMEOUT = 2.0


def scorer(body: str, header: str = "") -> str:
    """Source with `header` at module level and `body` as the body of score()."""
    indented = "\n".join("    " + line for line in body.splitlines())
    return f"{header}\ndef score(input, output, expected, spans, metadata):\n{indented}\n"


@pytest.fixture(scope="module")
async def pool() -> AsyncIterator[SandboxPool]:
    sandbox = SandboxPool(2)
    await sandbox.start()
    yield sandbox
    await sandbox.close()


async def reason(pool: SandboxPool, code: str, args: dict[str, Any] = ARGS, limit_s: float = TIMEOUT) -> str:
    """The reason the call fails with, which must not be retriable."""
    with pytest.raises(CodeScorerError) as caught:
        await pool.run(f"k-{hash(code)}", code, args, limit_s)
    assert not caught.value.retriable  # the user's code caused it: retrying would not help
    return str(caught.value)


# --- verdicts -----------------------------------------------------------------------------------

async def test_returns_a_float(pool: SandboxPool) -> None:
    value = await pool.run("s1:a", scorer("return 0.25"), ARGS, TIMEOUT)
    assert value == 0.25 and type(value) is float
    value = await pool.run("s1:b", scorer("return 1"), ARGS, TIMEOUT)  # an int becomes a float
    assert value == 1.0 and type(value) is float


async def test_returns_a_bool(pool: SandboxPool) -> None:
    assert await pool.run("s2", scorer("return output == 'answer'"), ARGS, TIMEOUT) is True
    code = scorer("return output == 'answer'")
    assert await pool.run("s2", code, {**ARGS, "output": "x"}, TIMEOUT) is False


async def test_arguments_are_passed_positionally(pool: SandboxPool) -> None:
    code = scorer("return len(input) + len(output) + expected['n'] + len(spans) + metadata['m']")
    args = {"input": "ab", "output": "c", "expected": {"n": 10}, "spans": [{"name": "s"}],
            "metadata": {"m": 100}}
    assert await pool.run("s3", code, args, TIMEOUT) == 114.0


async def test_out_of_range_and_nan_are_returned_as_they_are(pool: SandboxPool) -> None:
    assert await pool.run("s4:a", scorer("return 1.5"), ARGS, TIMEOUT) == 1.5
    nan = await pool.run("s4:b", scorer("return float('nan')"), ARGS, TIMEOUT)
    assert isinstance(nan, float) and math.isnan(nan)
    assert await pool.run("s4:c", scorer("return float('-inf')"), ARGS, TIMEOUT) == -math.inf


async def test_compiled_once_per_key_per_process() -> None:
    # One process, so every call lands on it: module-level state persists between calls.
    sandbox = SandboxPool(1)
    await sandbox.start()
    try:
        code = scorer("global calls\ncalls += 1\nreturn calls", header="calls = 0")
        assert [await sandbox.run("count:v1", code, ARGS, TIMEOUT) for _ in range(3)] == [1.0, 2.0, 3.0]
        assert sandbox.compilations == 1
        # Another version is compiled apart, and does not disturb the first.
        assert await sandbox.run("count:v2", code, ARGS, TIMEOUT) == 1.0
        assert await sandbox.run("count:v1", code, ARGS, TIMEOUT) == 4.0
        assert sandbox.compilations == 2
    finally:
        await sandbox.close()


async def test_a_process_is_replaced_after_many_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_module, "_CALLS_PER_PROCESS", 2)
    sandbox = SandboxPool(1)
    await sandbox.start()
    try:
        code = scorer("global calls\ncalls += 1\nreturn calls", header="calls = 0")
        # The third call waits for the fresh process, which has to compile the code again.
        assert [await sandbox.run("recycle", code, ARGS, TIMEOUT) for _ in range(3)] == [1.0, 2.0, 1.0]
        assert sandbox.compilations == 2
    finally:
        await sandbox.close()


async def test_code_is_sent_again_when_the_process_lost_it() -> None:
    sandbox = SandboxPool(1)
    await sandbox.start()
    try:
        # The parent believes the process holds a key it never saw: the process says so, and the
        # parent resends the code.
        sandbox._slots[0].loaded["never-sent"] = None
        assert await sandbox.run("never-sent", scorer("return 0.5"), ARGS, TIMEOUT) == 0.5
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
    assert await pool.run("after-exit", scorer("return 0.5"), ARGS, TIMEOUT) == 0.5


# --- limits and recovery ------------------------------------------------------------------------

async def test_infinite_loop_times_out_and_the_pool_recovers(pool: SandboxPool) -> None:
    started = time.monotonic()
    assert await reason(pool, scorer("while True:\n    pass"), limit_s=0.3) == "timed out after 300 ms"
    assert time.monotonic() - started < 2
    assert pool.live_processes == pool.size
    assert await pool.run("after-loop", scorer("return 0.5"), ARGS, TIMEOUT) == 0.5


async def test_two_gib_allocation_runs_out_of_memory(pool: SandboxPool) -> None:
    code = scorer("data = bytearray(2 * 1024**3)\nreturn 1")
    assert await reason(pool, code) == "ran out of memory (limit 256 MiB)"
    assert await pool.run("after-oom", scorer("return 0.5"), ARGS, TIMEOUT) == 0.5


async def test_crash_is_reported_and_others_are_unaffected(pool: SandboxPool) -> None:
    crash = pool.run("crash", scorer("import os\nos._exit(3)"), ARGS, TIMEOUT)
    slow = pool.run("slow", scorer("import time\ntime.sleep(0.2)\nreturn 0.75"), ARGS, TIMEOUT)
    crashed, fine = await asyncio.gather(crash, slow, return_exceptions=True)
    assert isinstance(crashed, CodeScorerError) and str(crashed) == "sandbox crashed (exit code 3)"
    assert not crashed.retriable
    assert fine == 0.75
    assert pool.live_processes == pool.size
    assert await pool.run("after-crash", scorer("return 0.5"), ARGS, TIMEOUT) == 0.5


async def test_background_thread_gets_the_process_replaced(pool: SandboxPool) -> None:
    code = scorer("import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\nreturn 1")
    assert await reason(pool, code) == "code left a background thread running"
    assert pool.live_processes == pool.size


async def test_cancelled_call_does_not_leak_a_busy_process(pool: SandboxPool) -> None:
    call = asyncio.ensure_future(pool.run("cancel", scorer("while True:\n    pass"), ARGS, 30))
    await asyncio.sleep(0.2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    results = await asyncio.gather(*(pool.run("after-cancel", scorer("return 0.5"), ARGS, TIMEOUT)
                                     for _ in range(4)))
    assert results == [0.5] * 4
    # The interrupted process is replaced in the background (the cancelled caller cannot wait).
    for _ in range(500):
        if pool.live_processes == pool.size:
            break
        await asyncio.sleep(0.01)
    assert pool.live_processes == pool.size


async def test_concurrent_calls_share_the_pool(pool: SandboxPool) -> None:
    code = scorer("import time\ntime.sleep(0.1)\nreturn int(input) / 10")
    started = time.monotonic()
    results = await asyncio.gather(*(pool.run("conc", code, {**ARGS, "input": str(i)}, TIMEOUT)
                                     for i in range(10)))
    assert results == [i / 10 for i in range(10)]  # each caller gets its own answer
    assert time.monotonic() - started >= 0.45  # at most 2 at a time: 5 rounds of 0.1 s


# --- isolation ----------------------------------------------------------------------------------

async def test_parent_environment_is_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGW_TEST_SECRET", "hunter2")
    sandbox = SandboxPool(1)  # started after the secret was set
    await sandbox.start()
    try:
        code = scorer("return float('SGW_TEST_SECRET' in os.environ or "
                      "any('hunter2' in v for v in os.environ.values()))", header="import os")
        assert await sandbox.run("env", code, ARGS, TIMEOUT) == 0.0
        names = scorer("return float(set(os.environ) <= {'PATH', 'LANG'})", header="import os")
        assert await sandbox.run("env-names", names, ARGS, TIMEOUT) == 1.0
    finally:
        await sandbox.close()


async def test_print_does_not_break_the_protocol(pool: SandboxPool) -> None:
    code = scorer('print(\'{"id": 1, "ok": true, "value": 0.0}\')\n'
                  "import sys, os\nsys.stderr.write('noise\\n')\nos.write(1, b'junk\\n')\nreturn 0.7",
                  header="print('loaded')")
    assert await pool.run("print", code, ARGS, TIMEOUT) == 0.7
    assert await pool.run("print", code, ARGS, TIMEOUT) == 0.7


async def test_network_is_blocked(pool: SandboxPool) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        port = server.getsockname()[1]
        code = scorer(f"socket.create_connection(('127.0.0.1', {port}), timeout=1)\nreturn 1",
                      header="import socket")
        assert "PermissionError" in await reason(pool, code)
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody got through


async def test_processes_have_a_network_namespace_of_their_own(pool: SandboxPool) -> None:
    if not pool.network_isolated:
        pytest.skip("unshare --net is not permitted on this machine")
    ours = os.readlink("/proc/self/ns/net")
    code = scorer(f"return float(os.readlink('/proc/self/ns/net') != {ours!r})", header="import os")
    assert await pool.run("netns", code, ARGS, TIMEOUT) == 1.0


async def test_writing_files_is_refused(pool: SandboxPool, tmp_path: Path) -> None:
    text = await reason(pool, scorer("open('out.txt', 'w').write('x')\nreturn 1"))
    assert text.startswith("PermissionError: the sandbox forbids writing files")
    target = tmp_path / "out.txt"
    text = await reason(pool, scorer(f"os.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)\nreturn 1",
                                     header="import os"))
    assert text.startswith("PermissionError")
    assert not os.listdir(tmp_path)


async def test_reading_outside_the_standard_library_is_refused(pool: SandboxPool, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    code = scorer("return float(open(metadata['path']).read() == 'hunter2')")
    for path in (str(secret), f"/proc/{os.getpid()}/environ"):
        text = await reason(pool, code, {**ARGS, "metadata": {"path": path}})
        assert text.startswith("PermissionError: the sandbox forbids reading")
    # The standard library still imports.
    stdlib = scorer("return statistics.mean([0.25, 0.75])", header="import re, json, statistics, difflib")
    assert await pool.run("stdlib", stdlib, ARGS, TIMEOUT) == 0.5


async def test_starting_programs_is_refused(pool: SandboxPool) -> None:
    text = await reason(pool, scorer("import subprocess\nsubprocess.run(['true'])\nreturn 1"))
    assert text.startswith("PermissionError")
    text = await reason(pool, scorer("return float(os.system('true'))", header="import os"))
    assert text.startswith("PermissionError")
    assert (await reason(pool, scorer("import ctypes\nreturn 1"))).startswith("PermissionError")


# --- the pool's own life ------------------------------------------------------------------------

async def test_a_closed_pool_refuses_with_a_retriable_error() -> None:
    sandbox = SandboxPool(1, isolate_network=False)
    await sandbox.start()
    await sandbox.close()
    await sandbox.close()  # idempotent
    assert sandbox.live_processes == 0
    with pytest.raises(CodeScorerError) as caught:
        await sandbox.run("k", scorer("return 1"), ARGS, TIMEOUT)
    assert caught.value.retriable


async def test_failing_to_start_is_retriable() -> None:
    sandbox = SandboxPool(1, python="/nonexistent/python3", isolate_network=False)
    with pytest.raises(CodeScorerError) as caught:
        await sandbox.start()
    assert caught.value.retriable and "could not start a sandbox" in str(caught.value)
