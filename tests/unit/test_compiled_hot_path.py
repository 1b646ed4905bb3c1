"""The suite tests what ships: the per-trace path's modules (``deploy.compiled.HOT_PATH``) are
the compiled ones, built from the sources beside them - a benchmark of this tree measures the
build users run. ``SGW_INTERPRETED=1`` runs the suite on the sources alone, on purpose."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploy import compiled

pytestmark = pytest.mark.skipif(compiled.interpreted_wanted(), reason="SGW_INTERPRETED=1: the sources run, on purpose")


def module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


@pytest.mark.parametrize("path", compiled.HOT_PATH)
def test_the_hot_path_module_imported_is_the_compiled_one(path: str) -> None:
    module = importlib.import_module(module_name(path))
    assert module.__file__ is not None and Path(module.__file__).suffix == ".so", \
        f"{module_name(path)} runs interpreted from {module.__file__}: build it (python -m deploy.compiled build)"


def test_the_compiled_modules_are_built_from_the_sources_beside_them() -> None:
    assert compiled.stale() == [], "an extension older than its source would run the old code"


def test_an_edited_source_makes_the_build_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    built = compiled.source_hash()
    original = Path.read_bytes
    blend = compiled.ROOT / "scoring" / "blend.py"
    monkeypatch.setattr(Path, "read_bytes", lambda self: original(self) + (b"\n# edited" if self == blend else b""))
    assert compiled.source_hash() != built
    assert compiled.stale() == list(compiled.HOT_PATH)


def test_the_console_script_runs_the_compiled_hot_path_from_any_directory(tmp_path: Path) -> None:
    # A console script's path holds its bin directory, not the checkout: mypyc's shared runtime,
    # which every compiled module imports, must be found all the same (deploy.compiled.RUNTIME).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = Path(sys.executable).parent / "scorer-worker"
    ran = subprocess.run([str(script), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr[-2000:]
    probe = "import scoring.panel, sys; print(scoring.panel.__file__)"
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout.strip().endswith(".so"), ran.stdout + ran.stderr[-2000:]


def test_the_compiled_modules_run_the_runtime_built_with_them() -> None:
    # mypyc names its shared runtime by the compiled modules' names, the same in every checkout:
    # two checkouts built into one environment (a worktree benchmarked against main) would run
    # whichever built last. Named by the sources, each imports its own (deploy.compiled.runtime_name).
    importlib.import_module("scoring.blend")
    expected = f"{compiled.runtime_name(compiled.source_hash())}__mypyc"
    assert expected in sys.modules, [name for name in sys.modules if name.endswith("__mypyc")]  # (mypy's own too)
    loaded = sys.modules[expected].__file__
    assert loaded is not None and Path(loaded).parent == compiled.RUNTIME, loaded


def test_the_path_file_keeps_every_checkout_built_into_the_environment(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    other, gone = tmp_path / "other-checkout", tmp_path / "removed-checkout"
    other.mkdir()
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / compiled.RUNTIME_PTH).write_text(f"{other}\n\n{gone}\n{other}\n")
    monkeypatch.setattr(compiled.sysconfig, "get_paths", lambda: {"purelib": str(site)})
    compiled.runtime_on_path()
    assert (site / compiled.RUNTIME_PTH).read_text().splitlines() == [str(other), str(compiled.RUNTIME)]


PUT_ON_PATH = """
import sys
from pathlib import Path
from deploy import compiled
compiled.sysconfig.get_paths = lambda: {"purelib": sys.argv[1]}
compiled.RUNTIME = Path(sys.argv[2])
for _ in range(20):
    compiled.runtime_on_path()
"""


def test_checkouts_building_at_once_each_keep_their_line(tmp_path: Path) -> None:
    # The path file is shared by every checkout built into the environment: read, changed and
    # written back by two at once, one's line could be lost (its console scripts then fail).
    site = tmp_path / "site-packages"
    site.mkdir()
    runtimes = [tmp_path / f"checkout-{n}" for n in range(6)]
    for runtime in runtimes:
        runtime.mkdir()
    env = {**os.environ, "PYTHONPATH": str(compiled.ROOT)}
    running = [subprocess.Popen([sys.executable, "-c", PUT_ON_PATH, str(site), str(runtime)], env=env)
               for runtime in runtimes]
    assert [p.wait(timeout=60) for p in running] == [0] * len(runtimes)
    assert sorted((site / compiled.RUNTIME_PTH).read_text().splitlines()) == sorted(map(str, runtimes))
