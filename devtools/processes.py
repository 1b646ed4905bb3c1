"""Local services as processes: choosing their ports, starting them on free ones, reading their
logs, stopping them. Shared by the Kafka (``devtools.services``) and Redis (``devtools.redis_servers``)
launchers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

STOP_TIMEOUT_S = 15.0


class ServiceError(RuntimeError):
    """A local service could not be installed, started or reached."""


class PortTaken(ServiceError):
    """The port chosen for a service was taken before the service bound it."""


# free_port() only finds a port that is free now: another process may bind it before the
# service does. Then the service fails to bind, and start() tries again on new ports.
BIND_ATTEMPTS = 3


def bind_failed(output: str) -> bool:
    return "Address already in use" in output or "BindException" in output


T = TypeVar("T")


def on_free_ports(start_once: Callable[[], T], stop: Callable[[], None]) -> T:
    """``start_once`` on ports chosen now; if another process took one before the service bound
    it (``PortTaken``), stop what started and try again on new ones, ``BIND_ATTEMPTS`` times."""
    for attempt in range(BIND_ATTEMPTS):
        try:
            return start_once()
        except PortTaken:
            stop()
            if attempt == BIND_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, wait, then SIGKILL: a broker gets the chance to close its logs cleanly."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=STOP_TIMEOUT_S)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def read_from(path: Path, offset: int) -> str:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")
