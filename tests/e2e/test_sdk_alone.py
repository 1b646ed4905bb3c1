"""The SDK is a distribution of its own: ``pip install ./sdk`` into an empty virtualenv brings
only httpx, pydantic and what they need, and the spec's snippets run from there against the
real ``scorer-worker api`` - without a line of the server on the path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

from tests.support.api_process import ApiProcess, create_key
from tests.support.spec_snippets import CREATE_SNIPPET, SCORES_SNIPPET, SESSION_SNIPPET, TRACE_SNIPPET

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "support" / "sdk_alone_script.py"
# What the SDK's two dependencies bring, and nothing of the server's.
ALLOWED = {"scorer-groups", "httpx", "httpcore", "h11", "anyio", "idna", "sniffio", "certifi", "pydantic",
           "pydantic-core", "annotated-types", "typing-extensions", "typing-inspection", "pip", "setuptools"}
SERVER_ONLY = {"redis", "hiredis", "aiokafka", "fastapi", "uvicorn", "google-re2", "structlog", "orjson",
               "aiohttp", "pyyaml", "prometheus-client", "pydantic-settings", "scorer-group-worker"}
SERVER_MODULES = {"redis", "aiokafka", "fastapi", "re2", "structlog", "orjson", "aiohttp", "yaml", "scoring",
                  "adapters", "services", "consumers", "worker", "deploy", "tests"}
NETWORK_TROUBLE = ("Could not find a version", "No matching distribution", "Failed to establish a new connection",
                   "Temporary failure in name resolution", "Network is unreachable")


@pytest.fixture(scope="module")
def sdk_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv (no system site-packages) with ``pip install ./sdk``, not editable."""
    home = tmp_path_factory.mktemp("sdk-venv")
    venv.create(home, with_pip=True, clear=True)
    python = home / "bin" / "python"
    # From a copy: building the wheel writes build/ beside the sources.
    source = shutil.copytree(ROOT / "sdk", home / "sdk-source", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           "-c", str(ROOT / "constraints.txt"), str(source)],
                          capture_output=True, text=True, timeout=300, cwd=home)
    if done.returncode != 0 and any(why in done.stderr for why in NETWORK_TROUBLE):
        pytest.skip(f"pip cannot reach the package index here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    return python


def test_the_sdk_installs_alone(sdk_python: Path) -> None:
    listed = subprocess.run([str(sdk_python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
                            capture_output=True, text=True, check=True).stdout
    installed = {d["name"].lower().replace("_", "-") for d in json.loads(listed)}
    assert "scorer-groups" in installed
    assert installed <= ALLOWED, f"the SDK brought more than httpx and pydantic: {sorted(installed - ALLOWED)}"
    assert not installed & SERVER_ONLY


def test_the_specs_snippets_run_from_the_sdk_alone(sdk_python: Path, redis_databases, tmp_path: Path) -> None:
    with redis_databases.lease() as url:
        key = create_key(url, "--project", "p-alone")
        api = ApiProcess(url, tmp_path / "api.log").start()
        try:
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
            done = subprocess.run(
                [str(sdk_python), str(SCRIPT)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                env={**env, "SGW_API_URL": api.url, "SGW_API_KEY": key},
                input=json.dumps({"create": CREATE_SNIPPET, "trace": TRACE_SNIPPET, "session": SESSION_SNIPPET,
                                  "scores": SCORES_SNIPPET}))
        finally:
            api.stop()
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    quality, safety, pii = seen["group"]["ids"]
    assert seen["group"]["name"] == "Release quality bar"
    assert seen["group"]["members"] == [[quality, 1, False], [safety, 1, True], [pii, 0, True]]
    trace = seen["trace"]
    assert (trace["enabled"], trace["sampleRate"], trace["alertThreshold"], trace["severity"], trace["scope"]) == (
        True, 0.2, 6, "high", "trace")
    assert seen["chart"] == {"window": "7d", "buckets": 168}
    session = seen["session"]
    assert (session["scope"], session["sampleRate"], session["idleSeconds"]) == ("session", 1.0, 120)
    assert seen["scores"] == []
    # The SDK let the backreference through; the server refused it, naming the field.
    assert seen["refused"] == {"status": 400, "fields": ["regex"]}
    loaded = set(seen["modules"])
    assert "scorer_groups" in loaded and "httpx" in loaded and "pydantic" in loaded
    assert not loaded & SERVER_MODULES, f"the SDK process loaded server packages: {sorted(loaded & SERVER_MODULES)}"
