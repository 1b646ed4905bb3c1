"""The hot path compiled: which modules, built how, and whether the built ones are the sources'.

    .venv/bin/python -m deploy.compiled build    # compile what is stale (bootstrap runs this)
    .venv/bin/python -m deploy.compiled check    # exit 1 and say which, if any is stale or missing
    .venv/bin/python -m deploy.compiled clean    # back to interpreted: remove the built modules
    .venv/bin/python -m deploy.compiled export DIR    # the built extensions, as laid over an install

mypyc compiles ``HOT_PATH`` into C extensions beside their sources. The one rule: an extension shadows
its source, so an edit runs only after a build (the stamp, ``STAMP``, says when one is due) or with
``SGW_INTERPRETED=1``. How: docs/design-notes.md.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The per-trace path's pure steps, in the order a trace meets them: route and sample, score
# (patterns inline, the panel), blend, the result documents and what a publish sends and records.
# Each compiles as it is written.
HOT_PATH = (
    "scoring/routing.py",
    "scoring/re2_search.py",
    "scoring/members/patterns.py",
    "scoring/panel.py",
    "scoring/blend.py",
    "scoring/results.py",
    "scoring/review_rules.py",
    "scoring/outbox.py",
    "consumers/finished_pairs.py",
)
# What the stamp covers: the packages the compiled code was checked against (the SDK's wire models
# included: mypyc checks their types at run time), the type checker's configuration and pins, and
# this recipe.
CHECKED_AGAINST = ("scoring", "adapters", "consumers", "sdk/scorer_groups")
CHECKED_FILES = ("pyproject.toml", "constraints.txt", "deploy/compiled.py")  # and the recipe itself
STAMP = ROOT / "build" / "compiled.stamp"
RUNTIME = ROOT / "build" / "mypyc-runtime"  # mypyc's shared runtime: on the path through RUNTIME_PTH
RUNTIME_PTH = "sgw-compiled-runtime.pth"
INTERPRETED_ENV = "SGW_INTERPRETED"


def interpreted_wanted() -> bool:
    return os.environ.get(INTERPRETED_ENV, "") not in ("", "0", "false")


def source_hash() -> str:
    """What the built extensions were made from: every source they were checked against, and
    the compiler."""
    digest = hashlib.sha256(f"mypy {version('mypy')} python {sys.version} {HOT_PATH}".encode())
    paths = [*(p for package in CHECKED_AGAINST for p in sorted((ROOT / package).rglob("*.py"))),
             *(ROOT / name for name in CHECKED_FILES)]
    for path in paths:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def extensions(module: str) -> list[Path]:
    """The built extension(s) of a hot-path module (``scoring/blend.py`` -> ``scoring/blend.*.so``)."""
    path = ROOT / module
    return sorted(path.parent.glob(f"{path.stem}.*.so"))


def shared_libraries() -> list[Path]:
    """mypyc's runtime shared by the modules of one build (``sgw_<hash>__mypyc.*.so`` in ``RUNTIME``)."""
    return sorted(RUNTIME.glob("*__mypyc.*.so"))


def runtime_on_path() -> None:
    """Put ``RUNTIME`` on the path of this environment's interpreters (a line of a ``.pth`` file in
    its site-packages, beside those of other checkouts built into the same environment that still
    exist) and of this process. The file is changed under a lock and replaced whole: two
    checkouts building at once each keep their line."""
    pth = Path(sysconfig.get_paths()["purelib"]) / RUNTIME_PTH
    try:
        with open(pth.with_name(f"{RUNTIME_PTH}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            known = pth.read_text().splitlines() if pth.exists() else []
            lines = list(dict.fromkeys(line for line in [*known, str(RUNTIME)] if line.strip() and Path(line).is_dir()))
            if lines != known:
                written = pth.with_name(f"{RUNTIME_PTH}.{os.getpid()}.tmp")
                written.write_text("".join(f"{line}\n" for line in lines))
                written.replace(pth)
    except OSError as exc:
        raise SystemExit(f"compiled: cannot put mypyc's runtime on the path ({pth}: {exc.strerror}); "
                         f"run the sources instead: {INTERPRETED_ENV}=1") from None
    if str(RUNTIME) not in sys.path:
        sys.path.append(str(RUNTIME))


def runtime_name(built_from: str) -> str:
    """The shared runtime's module name, of the sources it was built from: a checkout's compiled
    modules import their own runtime, never another checkout's built into the same environment
    (mypyc names it by the modules' names alone, which every checkout shares)."""
    return f"sgw_{built_from[:20]}"


def stale() -> list[str]:
    """The hot-path modules whose extension is missing or built from other sources (all of them
    when mypyc's shared runtime, which each imports, is missing)."""
    built_from = source_hash()
    fresh = (STAMP.exists() and STAMP.read_text().strip() == built_from
             and any(lib.name.startswith(f"{runtime_name(built_from)}__mypyc.") for lib in shared_libraries()))
    return [m for m in HOT_PATH if not fresh or not extensions(m)]


def clean() -> None:
    """Every extension of the packages (the build's are the only ones there: a module dropped from
    ``HOT_PATH`` must not leave one behind, shadowing its source) and mypyc's runtime."""
    built = [*(p for package in CHECKED_AGAINST for p in (ROOT / package).rglob("*.so")), *shared_libraries(),
             *ROOT.glob("*__mypyc.*.so")]  # (where mypyc writes it, before _build moves it)
    for path in built:
        path.unlink(missing_ok=True)
    STAMP.unlink(missing_ok=True)
    # The C, objects and libraries of earlier builds: named by their sources, none is reused.
    for path in [*(ROOT / "build").glob("__native_*"), *(ROOT / "build").glob("temp.*"),
                 *(ROOT / "build").glob("lib.*")]:
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def export(target: Path) -> None:
    """Copy the built extensions into ``target`` as they sit under a site-packages directory
    (``scoring/blend.*.so``, and mypyc's shared runtime at the top): the image lays them over
    the sources ``pip install`` put there (deploy/Dockerfile), where they are imported instead."""
    if missing := stale():
        raise SystemExit(f"compiled: nothing to export, stale or missing: {', '.join(missing)}")
    for path in [*(p for m in HOT_PATH for p in extensions(m)), *shared_libraries()]:
        destination = target / (path.name if path.parent == RUNTIME else path.relative_to(ROOT))
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)


@contextmanager
def _lock() -> Iterator[None]:
    """One build at a time on a checkout (``./dev test`` beside an editor's test run): another
    waits, then finds the build fresh."""
    STAMP.parent.mkdir(exist_ok=True)
    with open(STAMP.parent / "compiled.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build() -> None:
    """Compile the hot path unless its extensions are the sources' already (or remove them,
    with ``SGW_INTERPRETED`` set)."""
    with _lock():
        if interpreted_wanted():
            clean()
            return
        if stale():
            _build()
        else:  # built from these very sources: as new as they are, for whoever compares times
            for extension in (p for m in HOT_PATH for p in extensions(m)):  # (worker/hot_path.py)
                os.utime(extension)
        runtime_on_path()


def _build() -> None:
    clean()  # none of the old build survives a failed new one: interpreted, never stale
    print(f"compiled: building {len(HOT_PATH)} hot-path modules with mypyc (about a minute)",
          file=sys.stderr, flush=True)
    built_from = source_hash()
    # mypyc's own command line (its MYPYC_OPT_LEVEL, MYPYC_DEBUG_LEVEL), with the runtime named by
    # the sources (``runtime_name``).
    setup = ROOT / "build" / "compiled_setup.py"
    arguments = ["--no-warn-unused-configs", *HOT_PATH]
    opt_level, debug_level = os.environ.get("MYPYC_OPT_LEVEL", "3"), os.environ.get("MYPYC_DEBUG_LEVEL", "1")
    setup.write_text("from setuptools import setup\nfrom mypyc.build import mypycify\n\n"
                     f"setup(name='sgw_compiled', ext_modules=mypycify({arguments!r}, opt_level={opt_level!r}, "
                     f"debug_level={debug_level!r}, group_name={runtime_name(built_from)!r}))\n")
    run = subprocess.run([sys.executable, str(setup), "build_ext", "--inplace"], cwd=ROOT,
                         capture_output=True, text=True)
    if run.returncode != 0:
        sys.stderr.write(run.stdout[-4000:] + run.stderr[-4000:])
        clean()
        raise SystemExit(f"compiled: mypyc failed (exit {run.returncode}), above; nothing compiled is left. "
                         f"Fix it, or run the sources: {INTERPRETED_ENV}=1")
    RUNTIME.mkdir(parents=True, exist_ok=True)
    for library in ROOT.glob("*__mypyc.*.so"):
        library.replace(RUNTIME / library.name)
    STAMP.write_text(built_from + "\n")


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "build"
    if command == "build":
        build()
    elif command == "clean":
        clean()
    elif command == "export" and len(argv) == 2:
        export(Path(argv[1]))
    elif command == "check":
        if interpreted_wanted():
            return 0
        if missing := stale():
            print(f"compiled: stale or missing: {', '.join(missing)} (run: python -m deploy.compiled build)",
                  file=sys.stderr)
            return 1
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
