"""The worker says which build of the per-trace path it runs (worker/hot_path.py): compiled,
interpreted, or compiled but older than an edited checkout's sources."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from deploy import compiled
from worker import hot_path
from worker.hot_path import hot_path_build


def module(name: str, file: Path) -> ModuleType:
    m = ModuleType(name)
    m.__file__ = str(file)
    return m


def package(name: str, root: Path) -> ModuleType:
    p = module(name, root / name / "__init__.py")
    p.__path__ = [str(root / name)]
    return p


def built(root: Path, name: str, *, source_newer: bool) -> ModuleType:
    """``name`` as a compiled module under ``root``: its extension, and its source beside it. Its
    ``__file__`` is where mypyc says a module imported by another compiled one is: under the
    runtime's directory, where no file is."""
    package_name, _, stem = name.rpartition(".")
    directory = root.joinpath(*package_name.split("."))
    directory.mkdir(parents=True, exist_ok=True)
    extension, source = directory / f"{stem}.cpython-311-x86_64-linux-gnu.so", directory / f"{stem}.py"
    extension.write_bytes(b"")
    source.write_text("")
    os.utime(extension, (1_000_000, 1_000_000))
    os.utime(source, (2_000_000, 2_000_000) if source_newer else (500_000, 500_000))
    return module(name, root / "build" / "mypyc-runtime" / package_name / extension.name)


@pytest.mark.skipif(compiled.interpreted_wanted(), reason="SGW_INTERPRETED=1: the sources run, on purpose")
def test_this_process_runs_the_compiled_hot_path_it_was_built_with() -> None:
    names = {m.removesuffix(".py").replace("/", ".") for m in compiled.HOT_PATH}
    for name in names:  # imported, as the worker has them before it says so
        importlib.import_module(name)
    build = hot_path_build()
    assert names <= set(build.compiled)
    assert build.stale == ()
    assert build.describe().startswith("compiled (")


def test_a_checkout_edited_since_its_build_is_said_stale(tmp_path: Path) -> None:
    modules = {"scoring": package("scoring", tmp_path), "aiohttp": package("aiohttp", tmp_path),
               "scoring.panel": built(tmp_path, "scoring.panel", source_newer=True),
               "scoring.blend": built(tmp_path, "scoring.blend", source_newer=False),
               "scoring.models": module("scoring.models", tmp_path / "scoring" / "models.py"),  # interpreted
               "aiohttp.client": built(tmp_path, "aiohttp.client", source_newer=True)}  # not ours
    build = hot_path_build(modules)
    assert build.compiled == ("scoring.blend", "scoring.panel")
    assert build.stale == ("scoring.panel",)
    assert "older than their sources: scoring.panel" in build.describe()


def test_an_install_is_never_said_stale_by_its_sources_install_time(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The image installs the sources, then lays extensions built earlier over them: newer
    # sources there say nothing.
    monkeypatch.setattr(hot_path.sysconfig, "get_paths", lambda: {"purelib": str(tmp_path)})
    build = hot_path_build({"scoring": package("scoring", tmp_path),
                            "scoring.panel": built(tmp_path, "scoring.panel", source_newer=True)})
    assert build.compiled == ("scoring.panel",) and build.stale == ()


def test_no_extension_is_interpreted() -> None:
    assert hot_path_build({"scoring.panel": module("scoring.panel", Path(sys.prefix) / "panel.py")}).describe() \
        == "interpreted"
