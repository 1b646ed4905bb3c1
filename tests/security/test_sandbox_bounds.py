"""A code scorer gets its call's CPU, memory and processes, and nothing after it returns.

Each attack below is what a hostile tenant tried against the shared worker; each runs in a fresh
confined sandbox (``sandbox_driver.py``: the pool's own start-up and protocol code) as root and
as an unprivileged user, and the driver measures from outside what stayed once the call had
returned. The unprivileged run is the worker as the shipped Kubernetes manifest runs it (not
root): bwrap then builds an unprivileged user namespace, and the same attacks fail. Every attack
is bounded in count and time by itself, so a failing test cannot take
the machine: children spin or sleep for 20 s at most, loops stop at their first refusal.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import ROOT

USER = "sgw-sandbox-test"

# 1. Children that raise their own CPU limit and spin, a thread and a program: the call returns
#    at once with 0.5 whatever happened to them.
FORK_AND_SPIN = '''
import os, resource, subprocess, threading, time
def spin():
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass
    end = time.monotonic() + 20
    while time.monotonic() < end:
        pass
def score(input, output, expected, spans, metadata):
    for _ in range(3):
        try:
            if os.fork() == 0:
                spin()
                os._exit(0)
        except OSError:
            pass
    for start in (lambda: threading.Thread(target=spin, daemon=True).start(),
                  lambda: subprocess.Popen(["/usr/bin/timeout", "20", "/usr/bin/yes"], stdout=subprocess.DEVNULL)):
        try:
            start()
        except Exception:
            pass
    return 0.5
'''
# 2. The same with 200 MiB per child, and 200 MiB kept by the module between calls.
MEMORY = '''
import os, time
KEPT = b"k" * (150 * 1024 * 1024)
def score(input, output, expected, spans, metadata):
    for _ in range(3):
        try:
            if os.fork() == 0:
                data = b"x" * (200 * 1024 * 1024)
                time.sleep(20)
                os._exit(0)
        except OSError:
            pass
    return 0.5
'''
# 3. Symlinks with long targets (kernel memory, Shmem) and folders (inodes) wherever it may write.
FILES = '''
import os
def score(input, output, expected, spans, metadata):
    made = 0
    for folder in ("/dev/shm", "/dev", "/tmp", "/", "/proc/self/cwd"):
        for i in range(30000):
            try:
                os.symlink("t" * 4000, f"{folder}/l{i}")
                os.mkdir(f"{folder}/d{i}")
                made += 1
            except OSError:
                break
    return made
'''
# 4. Kernel objects that outlive a process: System V shared memory and POSIX message queues.
IPC = '''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
def score(input, output, expected, spans, metadata):
    made = 0
    for _ in range(4):
        segment = libc.shmget(0, 64 * 1024 * 1024, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
        if segment < 0:
            break
        made += 1
        address = libc.shmat(segment, None, 0)
        if address not in (None, ctypes.c_void_p(-1).value):
            ctypes.memset(address, 1, 64 * 1024 * 1024)
            libc.shmdt(ctypes.c_void_p(address))
    try:
        rt = ctypes.CDLL("librt.so.1", use_errno=True)
        made += rt.mq_open(b"/sgw-left", 0o100 | 0o2, 0o600, None) >= 0  # O_CREAT | O_RDWR
    except OSError:
        pass
    return made
'''
# 5. A forged reply: the request id read from the caller's frames, the reply written to every
#    descriptor it has and every one it can open through /proc, then an exception.
FORGE = '''
import json, os, sys
def score(input, output, expected, spans, metadata):
    rid, frame = None, sys._getframe()
    while frame is not None:
        request = frame.f_locals.get("request")
        if isinstance(request, dict) and "id" in request:
            rid = request["id"]
        frame = frame.f_back
    forged = (json.dumps({"id": rid, "ok": True, "value": 1.0, "compiled": False, "loaded": True}) + "\\n").encode()
    targets = list(range(1024))
    for pid in os.listdir("/proc"):
        try:
            targets += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            pass
    for target in targets:
        try:
            if isinstance(target, int):
                os.write(target, forged)
            else:
                fd = os.open(target, os.O_WRONLY)
                os.write(fd, forged)
        except OSError:
            pass
    raise RuntimeError("no verdict")
'''
# 6. Its own CPU limit raised (refused: the hard limit cannot be raised), SIGXCPU ignored, a spin:
#    the kernel ends it at the hard limit even though nobody watches the wall clock.
CPU = '''
import resource, signal
def score(input, output, expected, spans, metadata):
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    while True:
        pass
'''
# 7. The backstop behind the process limit: given room for more processes (the pool never
#    gives it), a call leaves a sleeping child; its answer is refused and marked fatal.
LEAVE_A_PROCESS = '''
import os, time
def score(input, output, expected, spans, metadata):
    if os.fork() == 0:
        time.sleep(20)
        os._exit(0)
    return 0.5
'''

# 8. What the sandbox always held, kept here so that it runs as both identities: the
#    worker's environment, other processes' environments, signals to the parent, the network.
ESCAPE = '''
import os, signal, socket
def score(input, output, expected, spans, metadata):
    seen = [repr(dict(os.environ))]
    for pid in os.listdir("/proc"):
        try:
            seen.append(open(f"/proc/{pid}/environ", "rb").read().decode("latin-1"))
        except Exception:
            pass
    for attempt in (lambda: signal.pidfd_send_signal(os.pidfd_open(os.getppid()), 9),
                    lambda: os.kill(os.getppid(), 9),
                    lambda: socket.create_connection(("127.0.0.1", 22), timeout=1)):
        try:
            attempt()
            seen.append("CANARY: an attempt went through")
        except Exception:
            pass
    return 1.0 if any("CANARY" in s for s in seen) else 0.0
'''

# 9. The supervisor is the namespace's init: a signal reaches it only if it has a handler. Tried
#    with tgkill and with a pipe that signals its owner on I/O (F_SETOWN / F_SETSIG); then its
#    limits, priority and CPU placement, which later calls would inherit. Returns how many took.
SUPERVISOR = '''
import ctypes, fcntl, os, platform, resource, signal
libc = ctypes.CDLL(None, use_errno=True)
def score(input, output, expected, spans, metadata):
    took = 0
    tgkill = {"x86_64": 234, "aarch64": 131}.get(platform.machine())  # numbers differ by architecture
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        if tgkill is not None:
            libc.syscall(tgkill, 1, 1, int(sig))  # tgkill(1, 1, sig): it has no handler left to deliver to
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                fcntl.fcntl(int(fd), fcntl.F_SETOWN, 1)
                fcntl.fcntl(int(fd), 10, int(signal.SIGINT))  # F_SETSIG
                fcntl.fcntl(int(fd), fcntl.F_SETFL, fcntl.fcntl(int(fd), fcntl.F_GETFL) | os.O_ASYNC)
        except OSError:
            pass
    for attempt in (lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (4, 4)),
                    lambda: resource.prlimit(1, resource.RLIMIT_AS, (64 << 20, 64 << 20)),
                    lambda: os.setpriority(os.PRIO_PROCESS, 1, 19),
                    lambda: os.sched_setaffinity(1, {0}),
                    lambda: os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0))):
        try:
            attempt()
            took += 1
        except (OSError, ValueError):
            pass
    return took
'''
# 10. Descriptors parked in a unix socket cycle outlive the process that made them: no sockets.
SOCKETS = '''
import os, socket
def score(input, output, expected, spans, metadata):
    try:
        a, b = socket.socketpair()
    except OSError:
        return 0
    return 1
'''

ATTACKS: list[dict[str, Any]] = [
    {"name": "supervisor", "code": SUPERVISOR, "timeout": 5},
    {"name": "sockets", "code": SOCKETS, "timeout": 5},
    {"name": "escape", "code": ESCAPE, "timeout": 5},
    {"name": "fork_and_spin", "code": FORK_AND_SPIN, "timeout": 5},
    {"name": "memory", "code": MEMORY, "timeout": 5},
    {"name": "files", "code": FILES, "timeout": 5},
    {"name": "ipc", "code": IPC, "timeout": 5},
    {"name": "forge", "code": FORGE, "timeout": 5},
    {"name": "cpu", "code": CPU, "timeout": 1},
    {"name": "leave_a_process", "code": LEAVE_A_PROCESS, "timeout": 5, "processes": 4},
]


@pytest.fixture(scope="module")
def driver_dir() -> Iterator[Path]:
    """The driver and the sandbox's own modules, copied where any user may read them (the
    checkout and its virtualenv may not be readable by others)."""
    folder = Path(tempfile.mkdtemp(prefix="sgw-bounds-", dir="/tmp"))
    try:
        members = folder / "adapters" / "members"
        members.mkdir(parents=True)
        (folder / "adapters" / "__init__.py").write_text("")
        for name in ("__init__.py", "isolation.py", "_seccomp_policy.py", "_sandbox_runner.py", "sandbox_process.py"):
            shutil.copy(ROOT / "adapters" / "members" / name, members / name)
        shutil.copy(Path(__file__).with_name("sandbox_driver.py"), folder / "sandbox_driver.py")
        for path in (folder, *folder.rglob("*")):
            path.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def identities() -> list[str]:
    return ["root", "unprivileged"] if os.geteuid() == 0 else ["unprivileged"]


def run_attacks(driver_dir: Path, identity: str) -> dict[str, dict[str, Any]]:
    command = ["/usr/bin/python3", "-I", "-c",
               "import runpy, sys; sys.path.insert(0, sys.argv[1]); runpy.run_path(sys.argv[1] + '/sandbox_driver.py', "
               "run_name='__main__')", str(driver_dir)]
    if identity == "unprivileged" and os.geteuid() == 0:
        try:
            pwd.getpwnam(USER)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True)
        command = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups", *command]
    done = subprocess.run(command, input=json.dumps(ATTACKS), capture_output=True, text=True, timeout=240, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "APP_SECRET_TOKEN": "CANARY-bounds"})
    assert done.returncode == 0, done.stderr
    outcomes = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {o["name"]: o for o in outcomes}


@pytest.fixture(scope="module", params=identities())
def outcomes(request: pytest.FixtureRequest, driver_dir: Path) -> dict[str, dict[str, Any]]:
    found = run_attacks(driver_dir, request.param)
    assert set(found) == {a["name"] for a in ATTACKS}
    for outcome in found.values():
        assert (outcome["uid"] == 0) == (request.param == "root")
        assert outcome["bounds"].startswith(f"bwrap as uid {65534 if request.param == 'root' else outcome['uid']},")
        assert outcome["left"]["after_kill"] == 0, outcome  # killing a sandbox ends all of it
    return found


def test_no_secret_no_signal_no_network(outcomes: dict[str, dict[str, Any]]) -> None:
    outcome = outcomes["escape"]
    assert outcome["reply"]["value"] == 0.0, outcome
    nothing_stayed(outcome)


def test_a_call_can_neither_signal_nor_limit_the_supervisor(outcomes: dict[str, dict[str, Any]]) -> None:
    outcome = outcomes["supervisor"]
    assert outcome["reply"]["ok"] is True and outcome["reply"]["value"] == 0, outcome  # none took
    nothing_stayed(outcome)  # and the supervisor answered the probe after it


def test_no_socket_can_be_made(outcomes: dict[str, dict[str, Any]]) -> None:
    outcome = outcomes["sockets"]
    assert outcome["reply"]["value"] == 0, outcome
    nothing_stayed(outcome)


def nothing_stayed(outcome: dict[str, Any], rss_mb: float = 20) -> None:
    left = outcome["left"]
    assert left["processes"] == 0, outcome
    assert left["cpu_s"] < 0.1, outcome  # the watch lasts 1 s: a spinner would show ~1 per core
    assert left["rss_mb"] < rss_mb, outcome
    # Shmem is the machine's (/proc/meminfo), so other processes move it by a few MB (17.2 seen once
    # in CI); what it guards against - 30,000 long symlinks or files in /dev/shm - is 100 MB and up.
    assert left["shmem_mb"] < 48, outcome
    assert outcome["probe_after"] == outcome["probe_before"], outcome  # a later call finds the same world


def test_processes_a_call_forks_do_not_outlive_it(outcomes: dict[str, dict[str, Any]]) -> None:
    outcome = outcomes["fork_and_spin"]
    assert outcome["reply"]["ok"] is True and outcome["reply"]["value"] == 0.5  # its own value: nothing ran on
    nothing_stayed(outcome)


def test_memory_a_call_or_its_children_took_is_given_back(outcomes: dict[str, dict[str, Any]]) -> None:
    outcome = outcomes["memory"]
    assert outcome["reply"]["value"] == 0.5
    nothing_stayed(outcome)


def test_no_call_can_write_anywhere(outcomes: dict[str, dict[str, Any]]) -> None:
    outcome = outcomes["files"]
    assert outcome["reply"]["value"] == 0  # not one link or folder made
    assert "no writable file system" in outcome["bounds"]
    nothing_stayed(outcome)


def test_kernel_objects_that_outlive_a_process_cannot_be_made(outcomes: dict[str, dict[str, Any]]) -> None:
    outcome = outcomes["ipc"]
    assert outcome["reply"]["value"] == 0
    nothing_stayed(outcome)


def test_a_forged_reply_is_never_read(outcomes: dict[str, dict[str, Any]]) -> None:
    outcome = outcomes["forge"]
    reply = outcome["reply"]
    assert reply["id"] == 2 and reply["ok"] is False and "value" not in reply, outcome
    assert outcome["probe_after"] == outcome["probe_before"]  # the protocol still holds afterwards
    nothing_stayed(outcome)


def test_the_cpu_limit_is_hard(outcomes: dict[str, dict[str, Any]]) -> None:
    outcome = outcomes["cpu"]
    assert outcome["reply"] | {"id": 0} == {"id": 0, "ok": False, "error": "timed out after 1000 ms",
                                            "compiled": True, "loaded": True}
    # The kernel's hard limit (timeout + 2 s of CPU: ~3 s of wall time alone, 6.5 s seen on a
    # loaded two-core machine), not the 16 s bound: the margin sits between the two.
    assert outcome["seconds"] < 10
    nothing_stayed(outcome)


def test_a_call_that_left_a_process_is_refused_and_fatal(outcomes: dict[str, dict[str, Any]]) -> None:
    reply = outcomes["leave_a_process"]["reply"]
    assert reply["ok"] is False and reply["fatal"] is True and "value" not in reply
    assert reply["error"] == "code left 1 process running"
