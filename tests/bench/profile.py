"""Where a scenario's CPU went: a py-spy sampling profile of the measured process over the
measured window, summed by step (``--profile DIR`` of the suite).

py-spy samples from outside the process (``--nonblocking``: it never pauses the worker, so the
CPU figure it runs beside is the worker's own) and writes collapsed stacks - one line a distinct
stack, ``frame;frame;...;leaf count``. ``steps()`` attributes each sample to the innermost
frame of the project (``consumers/pair_protocol.py``...) and to the leaf's library (aiokafka,
redis, asyncio, the interpreter's own C calls show as their caller), which is what the issue
asks: where the CPU went, by step.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

PROJECT_DIRS = ("scoring/", "consumers/", "worker/")
RATE_HZ = 250


# SGW_SPY_NATIVE=1: C frames too, so the compiled modules' functions are named (``CPyDef_...``,
# which py-spy otherwise counts to their Python caller). py-spy then stops the process for each
# sample: it runs slower, and only the shares of the profile are worth reading.
NATIVE_ENV = "SGW_SPY_NATIVE"


@dataclass
class Profile:
    """A running ``py-spy record`` of one process (not its children: a sandbox runs tenant code
    compiled from strings, which py-spy cannot name; their CPU is in the scenario's figure)."""

    proc: subprocess.Popen[bytes] | None
    path: Path | None

    @classmethod
    def start(cls, out_dir: Path | None, name: str, pid: int) -> Profile:
        if out_dir is None:
            return cls(None, None)
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{name}.collapsed"
        with open(out_dir / f"{name}.py-spy.log", "wb") as log:  # the child keeps its own copy
            how = ["--native"] if os.environ.get(NATIVE_ENV) else ["--nonblocking"]
            proc = subprocess.Popen([spy, "record", "--pid", str(pid), *how,
                                     "--rate", str(RATE_HZ), "--format", "raw", "--output", str(path)],
                                    stdout=subprocess.DEVNULL, stderr=log)
        return cls(proc, path)

    def stop(self) -> None:
        """Ends the recording (py-spy writes its file on SIGINT) and writes the steps beside it."""
        if self.proc is None or self.path is None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if self.path.exists():
            self.path.with_suffix(".steps.txt").write_text(render(steps(self.path.read_text())))


def _module(frame: str) -> str:
    """``name (path/to/file.py:12)`` -> ``path/to/file.py`` relative to the project or site-packages."""
    start, end = frame.rfind("("), frame.rfind(":")
    path = frame[start + 1:end] if start >= 0 and end > start else frame
    for marker in ("site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            return path.split("/", 1)[1] if marker == "/lib/python3" and "/" in path else path
    for project in PROJECT_DIRS:
        if project in path:
            return project + path.split(project, 1)[1]
    return path


def _library(module: str) -> str:
    if module.startswith(PROJECT_DIRS):
        return module.split("/", 1)[0]
    return module.split("/", 1)[0].removesuffix(".py")


def steps(collapsed: str) -> dict[str, Counter[str]]:
    """Samples by the innermost project module, by leaf library, by the leaf frame, and by each
    function anywhere on the stack (inclusive: a step's whole cost, its callees' included)."""
    by_step: Counter[str] = Counter()
    by_library: Counter[str] = Counter()
    by_leaf: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        modules = [_module(f) for f in frames]
        project = next((m for m in reversed(modules) if m.startswith(PROJECT_DIRS)), "(outside the project)")
        by_step[project] += n
        by_library[_library(modules[-1])] += n
        by_leaf[frames[-1].split(" (", 1)[0] + " " + modules[-1]] += n
        for name in {f.split(" (", 1)[0] + " " + m for f, m in zip(frames, modules, strict=True)}:
            inclusive[name] += n
    return {"innermost project module": by_step, "leaf library": by_library, "leaf function": by_leaf,
            "function, inclusive": inclusive}


def render(tables: dict[str, Counter[str]], top: int = 40) -> str:
    lines: list[str] = []
    total = sum(next(iter(tables.values())).values()) or 1  # every sample once (not the inclusive table)
    for title, counts in tables.items():
        lines.append(f"## by {title} ({total} samples)")
        lines += [f"{100 * n / total:5.1f}%  {name}" for name, n in counts.most_common(top)]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(steps(Path(sys.argv[1]).read_text())))
