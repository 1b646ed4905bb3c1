"""Which build of the per-trace path this process runs, said when the worker starts and as a
metric: the compiled extensions (``deploy/compiled.py`` builds them beside their sources, the
image lays them over its install), or the sources alone. An image that lost its build runs
interpreted at several times the CPU; a checkout edited since its build runs the old code. Either
is seen on the worker's first log line and on ``sgw_hot_path_compiled_modules``, not found later
in a profile or a surprising result.
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

PACKAGES = ("scoring", "consumers")  # where the compiled modules live


@dataclass(frozen=True)
class HotPathBuild:
    compiled: tuple[str, ...]  # modules of PACKAGES imported from an extension
    stale: tuple[str, ...]  # of those, ones whose source beside them is newer (a checkout edited since)

    def describe(self) -> str:
        if not self.compiled:
            return "interpreted"
        if self.stale:
            return (f"compiled ({len(self.compiled)} modules), {len(self.stale)} older than their sources: "
                    f"{', '.join(self.stale)} (run: python -m deploy.compiled build)")
        return f"compiled ({len(self.compiled)} modules)"


def hot_path_build(modules: Mapping[str, ModuleType] | None = None) -> HotPathBuild:
    """The build of the modules imported so far (``sys.modules``). A module is found beside its
    source in its package's directory (a compiled module imported by another compiled one has a
    ``__file__`` under mypyc's runtime, where no file is). A source newer than its extension
    counts only in a checkout: an install's sources carry their install time, whatever the time
    of the extensions laid over them."""
    modules = sys.modules if modules is None else modules
    installed = Path(sysconfig.get_paths()["purelib"]).resolve()
    compiled: list[str] = []
    stale: list[str] = []
    for name, module in sorted(modules.items()):
        file = getattr(module, "__file__", None)
        parent, _, stem = name.rpartition(".")
        if name.split(".")[0] not in PACKAGES or not file or not file.endswith(".so") or parent not in modules:
            continue
        compiled.append(name)
        directory = Path(next(iter(getattr(modules[parent], "__path__", [])), "")).resolve()
        extension = next(iter(sorted(directory.glob(f"{stem}.*.so"))), None)
        source = directory / f"{stem}.py"
        if extension is not None and installed not in extension.parents and source.exists() \
                and source.stat().st_mtime > extension.stat().st_mtime:
            stale.append(name)
    return HotPathBuild(tuple(compiled), tuple(stale))
