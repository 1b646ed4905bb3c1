"""How a code-scorer process is confined by the operating system.

Tenants' code is hostile, so the boundary is the kernel's (bubblewrap: another uid, namespaces of its
own, a read-only file system, seccomp), not hooks inside an interpreter. The one rule: fail closed - if
any of it cannot be set up, ``prepare`` raises ``IsolationUnavailable`` and code scorers do not run
(``unsafe-none`` is the operator's explicit opt-out). The confinement in full: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

IsolationMode = Literal["bwrap", "unsafe-none"]

_POLICY = Path(__file__).with_name("_seccomp_policy.py")
# Where the programs that start sandboxes are looked for: the system's own directories, never
# the worker's PATH (setpriv runs as root).
_SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# The only environment a sandbox process (and bwrap, whose /proc/1/environ it can read) gets.
CHILD_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
_PROBE_TIMEOUT_S = 15.0
# What a call gets and no more (the runner sets them; the pool's memory limit is the address space).
CALL_BOUNDS = ("one process (no fork, no threads), a hard CPU limit of its timeout + 2 s, "
               "the address-space limit, no writable file system, nothing left after it returns")


class IsolationUnavailable(Exception):
    """The confinement cannot be set up here; ``str(exc)`` says what is missing."""


@dataclass(frozen=True)
class Confinement:
    """Everything needed to start one confined process."""

    mode: IsolationMode
    python: str
    prefix: tuple[str, ...] = ()  # the bwrap command line, before the Python command
    seccomp_bpf: bytes = b""
    uid: int | None = None  # switch to this uid (and gid) before starting bwrap (root only)
    identity: tuple[str, ...] = ()  # the command that switches to it: setpriv ... --
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        # A uid to switch to with nothing that switches would start bwrap as root.
        if self.mode == "bwrap" and (self.uid is None) != (not self.identity):
            raise ValueError("a confinement switches to its uid exactly when it has the identity command for it")

    @property
    def bounds(self) -> str:
        """Which bounds are in force, as /readyz and the startup log say it."""
        return f"{self.description}; per call: {CALL_BOUNDS}"

    def command(self, python_args: list[str], seccomp_fd: int | None) -> list[str]:
        if self.mode == "unsafe-none":
            return [self.python, *python_args]
        assert seccomp_fd is not None
        return [*self.identity, *self.prefix, "--seccomp", str(seccomp_fd), self.python, *python_args]

    def seccomp_pipe(self) -> int | None:
        """A pipe holding the seccomp program, read end returned (the caller closes it after
        starting the process). A fresh pipe per process: bwrap reads it to the end."""
        if self.mode == "unsafe-none":
            return None
        read_end, write_end = os.pipe()
        try:
            os.write(write_end, self.seccomp_bpf)  # a few hundred bytes: well within a pipe buffer
        finally:
            os.close(write_end)
        return read_end


def _root_layout() -> list[str]:
    """/usr read-only, and the top-level links or folders of a merged or classic /usr."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def _bwrap_prefix(bwrap: str, python: str) -> list[str]:
    args = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--as-pid-1",
            "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for name, value in CHILD_ENV.items():
        args += ["--setenv", name, value]
    args += _root_layout()
    prefix = Path(os.path.realpath(python)).parent.parent
    if not prefix.is_relative_to("/usr"):
        args += ["--ro-bind", str(prefix), str(prefix)]  # a Python installed outside /usr
    # Nothing writable: /dev (its shm included) and /tmp are read-only too, so no call can leave
    # files, links or folders behind - in bytes or in inodes - for itself or a later call.
    args += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev", "--tmpfs", "/tmp",
             "--remount-ro", "/tmp", "--remount-ro", "/", "--chdir", "/tmp"]
    return args


async def _run(cmd: list[str], *, pass_fds: tuple[int, ...] = ()) -> tuple[int, bytes, bytes]:
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=CHILD_ENV, pass_fds=pass_fds, start_new_session=True)
    except OSError as exc:
        raise IsolationUnavailable(f"cannot start {cmd[0]}: {exc}") from exc
    try:
        out, err = await asyncio.wait_for(proc.communicate(), _PROBE_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, b"", b"timed out"
    return proc.returncode if proc.returncode is not None else -1, out, err


def _last_line(err: bytes, code: int) -> str:
    """Why a probe failed, as a reason can say it: its last line of stderr, or its exit code."""
    lines = err.decode(errors="replace").strip().splitlines()
    return lines[-1][:200] if lines else f"exit code {code}"


async def _identity(uid: int, python: str) -> tuple[str, ...]:
    """The command prefix that starts a process as ``uid`` (and its gid, no other groups),
    checked by starting one; IsolationUnavailable when this process may not switch to it."""
    setpriv = shutil.which("setpriv", path=_SYSTEM_PATH)
    if setpriv is None:
        raise IsolationUnavailable("setpriv is not installed (Debian package 'util-linux'): it starts the "
                                   f"sandboxes as uid {uid}")
    identity = (setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--")
    code, out, err = await _run([*identity, python, "-I", "-S", "-c", "import os; print(os.getresuid(), "
                                 "os.getresgid(), os.getgroups())"])
    if code != 0 or out.decode(errors="replace").split() != f"({uid}, {uid}, {uid}) ({uid}, {uid}, {uid}) []".split():
        raise IsolationUnavailable(
            f"this process may not start a process as uid {uid} ({_last_line(err, code)}): run the worker as "
            "real root, or as a non-root user, or set SGW_SANDBOX_UID to a uid it may switch to")
    return identity


def _not_inherited() -> None:
    """Every descriptor above stderr that this process was started with made not inheritable:
    a sandbox process gets only what is passed to it. (Python opens its own that way; uvloop's
    subprocesses, unlike Python's, do not close the others in the child.)"""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    os.set_inheritable(fd, False)
            except OSError:  # the listing's own descriptor, closed by now
                pass


def _check_executable(python: str) -> None:
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        raise IsolationUnavailable(f"the sandbox Python {python!r} is not an executable file")


async def prepare(mode: IsolationMode, python: str, sandbox_uid: int) -> Confinement:
    """Check that confined processes can be started here and return how; raise
    IsolationUnavailable with the reason otherwise."""
    _check_executable(python)
    _not_inherited()
    if mode == "unsafe-none":
        return Confinement(mode, python, description="UNSAFE: no isolation (SGW_CODE_SANDBOX=unsafe-none)")

    bwrap = shutil.which("bwrap", path=_SYSTEM_PATH)
    if bwrap is None:
        raise IsolationUnavailable("bubblewrap (bwrap) is not installed (Debian package 'bubblewrap')")
    # 1. The seccomp program, made by libseccomp's Python binding of the sandbox's Python.
    code, bpf, err = await _run([python, "-I", str(_POLICY)])
    if code != 0 or not bpf:
        raise IsolationUnavailable(f"cannot build the seccomp filter ({_last_line(err, code)}); "
                                   "install libseccomp's Python binding (Debian package 'python3-seccomp')")
    uid = sandbox_uid if os.geteuid() == 0 else None
    confinement = Confinement(
        mode, python, tuple(_bwrap_prefix(bwrap, python)), bpf, uid,
        identity=await _identity(uid, python) if uid is not None else (),
        description=f"bwrap as uid {uid if uid is not None else os.geteuid()}, own user/pid/net/mount "
                    "namespaces, seccomp")
    # 2. A real confined process, with the filter, must start and see the world it should.
    probe = ("import os, socket\n"
             "assert not os.path.exists('/etc/passwd') and os.environ.keys() <= {'PATH', 'LANG', 'PWD'}\n"
             "try:\n    socket.socket(socket.AF_INET)\nexcept OSError:\n    print('confined')\n")
    fd = confinement.seccomp_pipe()
    assert fd is not None
    try:
        code, out, err = await _run(confinement.command(["-I", "-S", "-c", probe], fd), pass_fds=(fd,))
    finally:
        os.close(fd)
    if code != 0 or out.strip() != b"confined":
        raise IsolationUnavailable(f"bubblewrap cannot start a confined process here: {_last_line(err, code)} "
                                   "(it needs unprivileged user namespaces, or root)")
    return confinement
