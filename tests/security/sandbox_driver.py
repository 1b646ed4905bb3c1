"""Runs attacks in confined sandboxes the way the worker's pool does - the same
``isolation.prepare``, ``sandbox_process.spawn`` and ``exchange`` - and measures, from outside,
what each attack left behind once its call had returned.

Standard library only, so that Debian's python3 can run it as root or as an unprivileged user
(``tests/security/test_sandbox_bounds.py`` runs it both ways, from a copy of the files it needs).

Reads a JSON list of attacks on standard input, each ``{"name", "code", "timeout", "processes"}``
(``processes``: what a call may run, its own process included; the pool's is 1). Starts a fresh
sandbox per attack, asks the probe below, runs the attack, watches the sandbox's processes for
``WATCH_S``, asks the probe again, kills the sandbox, and prints one JSON line per attack:
``{"name", "uid", "bounds", "reply", "seconds", "probe_before", "probe_after", "left"}`` where
``left`` holds what stayed: processes, CPU seconds used after the reply, resident MB, the host's
shared memory (Shmem) in MB, and processes of the sandbox's PID namespace after it was killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from adapters.members import isolation
from adapters.members.sandbox_process import exchange, kill, reap, spawn

ARGS = {"input": "question", "output": "answer", "expected": None, "spans": [], "metadata": {}}
WATCH_S = 1.0
# What a later call finds: entries of /dev, /dev/shm and /tmp, and processes other than the
# sandbox's init, its supervisor and the probe's own.
PROBE = '''
import os
def score(input, output, expected, spans, metadata):
    entries = sum(len(os.listdir(path)) for path in ("/dev", "/dev/shm", "/tmp"))
    others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getppid(), os.getpid())]
    return entries * 1000 + len(others)
'''
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def tree(root: int) -> dict[int, tuple[float, int]]:
    """``root`` and its descendants: CPU seconds used and resident bytes, by pid."""
    stats: dict[int, tuple[int, float, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = open(f"/proc/{name}/stat").read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        stats[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[21]) * _PAGE)
    found, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, _) in stats.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return {pid: stats[pid][1:] for pid in found if pid in stats}


def shmem_mb() -> float:
    for line in open("/proc/meminfo"):
        if line.startswith("Shmem:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pid_namespace_members(namespace: str) -> int:
    """How many processes on this machine are in the PID namespace ``namespace`` (a link text)."""
    count = 0
    for name in os.listdir("/proc"):
        try:
            count += name.isdigit() and os.readlink(f"/proc/{name}/ns/pid") == namespace
        except OSError:
            pass
    return count


async def ask(proc: asyncio.subprocess.Process, rid: int, key: str, code: str, timeout_s: float) -> dict[str, Any]:
    return await asyncio.wait_for(
        exchange(proc, rid, key, code, timeout_s, field="args", payload_json=json.dumps(ARGS).encode()), timeout_s + 15)


async def attack(confinement: isolation.Confinement, name: str, code: str, timeout_s: float,
                 processes: int) -> dict[str, Any]:
    proc = await spawn(confinement, 256, 8, processes)
    try:
        ours = os.readlink("/proc/self/ns/pid")
        namespace = next(link for pid in tree(proc.pid) if (link := os.readlink(f"/proc/{pid}/ns/pid")) != ours)
        probe_before = (await ask(proc, 1, "probe", PROBE, 5)).get("value")
        before, shmem_before = tree(proc.pid), shmem_mb()
        started = time.monotonic()
        reply = await ask(proc, 2, "attack", code, timeout_s)
        seconds = time.monotonic() - started
        returned = tree(proc.pid)
        await asyncio.sleep(WATCH_S)
        watched = tree(proc.pid)
        left = {
            "processes": len(watched) - len(before),
            "cpu_s": round(sum(cpu - returned.get(pid, (0.0, 0))[0] for pid, (cpu, _) in watched.items()), 3),
            "rss_mb": round((sum(r for _, r in watched.values()) - sum(r for _, r in before.values())) / 2**20, 1),
            "shmem_mb": round(shmem_mb() - shmem_before, 1),
        }
        probe_after = (await ask(proc, 3, "probe", PROBE, 5)).get("value")
    finally:
        kill(proc)
        await reap(proc)
    # The kernel ends a PID namespace's members after its init, each when it next runs: on a
    # loaded machine a member spinning on a CPU may take longer than a moment.
    deadline = time.monotonic() + 5
    while (members := pid_namespace_members(namespace)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    left["after_kill"] = members
    return {"name": name, "uid": os.geteuid(), "bounds": confinement.bounds, "reply": reply,
            "seconds": round(seconds, 2), "probe_before": probe_before, "probe_after": probe_after, "left": left}


async def main() -> None:
    attacks = json.load(sys.stdin)
    confinement = await isolation.prepare("bwrap", "/usr/bin/python3", 65534)
    for a in attacks:
        print(json.dumps(await attack(confinement, a["name"], a["code"], a["timeout"], a.get("processes", 1))),
              flush=True)


if __name__ == "__main__":
    asyncio.run(main())
