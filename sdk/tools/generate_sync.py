"""Generates the SDK's sync modules from their async sources, the way httpcore keeps its twins:
only the async modules are written by hand, and each sync module is its async source with
``async`` and ``await`` dropped and the names below swapped - by the unasync library, token by
token. Strings and comments stay as written, so the sources word their docstrings for both
clients; and a statement that wraps after ``async def`` or ``await`` wraps with a hanging indent,
which the dropped word cannot put out of line.

    .venv/bin/python sdk/tools/generate_sync.py          # ./dev sdk: rewrite the sync modules
    .venv/bin/python sdk/tools/generate_sync.py --check  # ./dev sdk --check: fail if one is stale

A development tool: the SDK's distribution ships ``scorer_groups`` only (sdk/pyproject.toml), so
unasync is one of the repository's test dependencies, never the SDK's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import unasync

PACKAGE = Path(__file__).resolve().parents[1] / "scorer_groups"

# Each async source, written by hand, and the sync module generated from it.
MODULES = {
    "_transport_async.py": "_transport.py",
    "_async.py": "_sync.py",
    "evaluations_async.py": "evaluations.py",
}

# The names swapped, on top of unasync's own (__aenter__ -> __enter__, __aexit__ -> __exit__, ...).
# unasync would turn any other AsyncX into SyncX: every Async name of the sources is listed here.
REPLACEMENTS = {
    # The SDK's async classes and their sync twins.
    "AsyncClient": "Client",  # also httpx's own: httpx.AsyncClient -> httpx.Client
    "AsyncTransport": "Transport",
    "AsyncDatasets": "Datasets",
    "AsyncEvaluations": "Evaluations",
    "AsyncPendingRun": "PendingRun",
    "AsyncBackfill": "Backfill",
    # The modules the sources import from each other: each one's generated twin.
    "_transport_async": "_transport",
    "evaluations_async": "evaluations",
    # httpx.AsyncClient closes with aclose(), httpx.Client with close().
    "aclose": "close",
    # The wait between retries: asyncio.sleep -> time.sleep (the sources use asyncio for nothing
    # else; what differs more than this lives by hand in _evaluations_shared).
    "asyncio": "time",
    # The hand-written pair in _evaluations_shared that calls the user's agent on a run's rows.
    "call_agent_async": "call_agent",
}

HEADER = "# Generated from {source} by sdk/tools/generate_sync.py - do not edit; run `./dev sdk` to regenerate.\n"


def generate(out_dir: Path) -> list[Path]:
    """Writes every sync module into ``out_dir`` and returns their paths."""
    rule = unasync.Rule("/async_sources/", "/sync_modules/", additional_replacements=REPLACEMENTS)
    written = []
    with tempfile.TemporaryDirectory() as scratch:
        # unasync writes each file of one folder to the same name in another: so each source is
        # first copied under the name its sync module will have.
        for source, target in MODULES.items():
            staged = Path(scratch, "async_sources", target)
            staged.parent.mkdir(exist_ok=True)
            staged.write_bytes((PACKAGE / source).read_bytes())
            unasync.unasync_files([str(staged)], [rule])
            code = Path(scratch, "sync_modules", target).read_text(encoding="utf-8")
            out = out_dir / target
            out.write_text(HEADER.format(source=source) + code, encoding="utf-8")
            written.append(out)
    return written


def stale(package: Path = PACKAGE) -> list[str]:
    """The sync modules of ``package`` that differ from what their async sources generate."""
    with tempfile.TemporaryDirectory() as fresh:
        return [path.name for path in generate(Path(fresh))
                if not (package / path.name).is_file() or (package / path.name).read_bytes() != path.read_bytes()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if a sync module is stale")
    args = parser.parse_args()
    if args.check:
        names = stale()
        for name in names:
            print(f"sdk/scorer_groups/{name} is not what its async source generates: run ./dev sdk", file=sys.stderr)
        return 1 if names else 0
    for path in generate(PACKAGE):
        print(f"generated sdk/scorer_groups/{path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
