"""The sandbox when the worker itself is not root (the shipped Kubernetes manifest runs as uid
10001): bwrap then builds an unprivileged user namespace, and the same attacks fail.

As root, the test creates an ordinary user with ``useradd`` and runs, as that user, a driver
that does what ``scoring.members.sandbox`` does for one call - ``scoring.members.isolation.prepare`` (its
non-root branch), one confined runner, one request - with Debian's python3, since the
worker's virtualenv is not readable by other users. The driver holds a secret in its
environment, as the worker would.
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

import pytest

from tests.e2e.harness import ROOT

USER = "sgw-sandbox-test"
SECRET = "CANARY-unprivileged-worker-secret"

ATTACK = '''
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

DRIVER = '''
import asyncio, json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import isolation

async def main():
    assert os.geteuid() != 0
    confinement = await isolation.prepare("bwrap", "/usr/bin/python3", 65534)
    runner = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_runner.py")).read()
    fd = confinement.seccomp_pipe()
    proc = await asyncio.create_subprocess_exec(
        *confinement.command(["-I", "-S", "-c", runner, "256", "8"], fd), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, env=isolation.CHILD_ENV, pass_fds=(fd,), start_new_session=True)
    os.close(fd)
    assert json.loads(await proc.stdout.readline())["ready"]
    args = {"input": "", "output": "", "expected": None, "spans": [], "metadata": {}}
    proc.stdin.write((json.dumps({"id": 1, "key": "k", "code": sys.stdin.read(), "timeout": 5, "args": args}) + "\\n").encode())
    await proc.stdin.drain()
    print(json.dumps({"uid": os.geteuid(), "confinement": confinement.description,
                      "reply": json.loads(await proc.stdout.readline())}))
    proc.kill()

asyncio.run(main())
'''


@pytest.fixture
def unprivileged_user() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("the suite already runs unprivileged: the sandbox tests cover this path")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], check=True)
    yield USER


@pytest.fixture
def driver_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="sgw-unprivileged-", dir="/tmp"))
    try:
        for name in ("isolation.py", "_seccomp_policy.py", "_sandbox_runner.py"):
            shutil.copy(ROOT / "scoring" / "members" / name, folder / name)
        (folder / "driver.py").write_text(DRIVER)
        for path in (folder, *folder.iterdir()):
            path.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_an_unprivileged_worker_confines_code_the_same_way(unprivileged_user: str, driver_dir: Path) -> None:
    done = subprocess.run(
        ["setpriv", f"--reuid={unprivileged_user}", f"--regid={unprivileged_user}", "--init-groups",
         "/usr/bin/python3", "-I", str(driver_dir / "driver.py")],
        input=ATTACK, capture_output=True, text=True, timeout=60, cwd="/",
        env={"PATH": "/usr/bin:/bin", "APP_SECRET_TOKEN": SECRET})
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["uid"] == pwd.getpwnam(unprivileged_user).pw_uid
    assert outcome["confinement"].startswith("bwrap as uid")
    assert outcome["reply"] == {"id": 1, "compiled": True, "loaded": True, "ok": True, "value": 0.0}
