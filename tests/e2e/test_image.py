"""The image builds and runs. No container engine is on these machines, so the test does what
``deploy/Dockerfile`` does: its ``COPY`` lines into a clean directory, its ``pip install`` into a
clean virtualenv - offline, from the wheels bootstrap collected (``.wheels``) - and then starts
``scorer-worker --help`` and ``scorer-worker api`` from there, away from the repository, and
reads the console and the API reference from the installed package."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
import venv
from pathlib import Path

import httpx
import pytest

from deploy.processes import free_port
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
WHEELS = ROOT / ".wheels"


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (keyword, arguments), continuation lines joined."""
    joined = text.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def replay_copies(steps: list[tuple[str, str]], app: Path) -> None:
    """Docker's COPY: a directory's contents go into the target; a file into a target ending in
    "/" (a directory), else to the target's path."""
    for keyword, rest in steps:
        if keyword != "COPY":
            continue
        *sources, target = shlex.split(rest)
        for source in sources:
            origin, destination = ROOT / source, app / target
            if origin.is_dir():
                shutil.copytree(origin, destination, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
            elif target.endswith("/"):
                destination.mkdir(parents=True, exist_ok=True)
                shutil.copy(origin, destination / origin.name)
            else:
                shutil.copy(origin, destination)


def pip_install_arguments(steps: list[tuple[str, str]]) -> list[str]:
    """The arguments of the image's ``pip install``, without the ones only a build cache needs."""
    for keyword, rest in steps:
        if keyword == "RUN" and "pip install" in rest:
            command = next(part for part in rest.split("&&") if "pip install" in part)
            arguments = shlex.split(command.split("pip install", 1)[1])
            return [a for a in arguments if a != "--no-cache-dir"]
    raise AssertionError("the Dockerfile installs nothing with pip")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's /app and its Python: the path of ``scorer-worker`` in a clean virtualenv."""
    assert WHEELS.is_dir(), "run deploy/bootstrap.sh (./dev test does): it collects the image's wheels"
    steps = instructions(DOCKERFILE.read_text())
    app = tmp_path_factory.mktemp("app")
    replay_copies(steps, app)
    home = tmp_path_factory.mktemp("image-venv")
    venv.create(home, with_pip=True, clear=True)
    done = subprocess.run([str(home / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           "--no-index", "--find-links", str(WHEELS), *pip_install_arguments(steps)],
                          cwd=app, capture_output=True, text=True, timeout=600, env=_clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return home / "bin" / "scorer-worker"


def _clean_env(**extra: str) -> dict[str, str]:
    """The machine's environment without this checkout on the path: only the image's install."""
    keep = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("SGW_")}
    return {**keep, **extra}


def test_the_dockerfile_copies_what_the_install_needs() -> None:
    copied = {shlex.split(rest)[0] for keyword, rest in instructions(DOCKERFILE.read_text()) if keyword == "COPY"}
    assert {"sdk", "scoring", "consumers", "worker"} <= copied, "the server needs the SDK's distribution too"


def test_the_image_starts_the_cli(image: Path, tmp_path: Path) -> None:
    done = subprocess.run([str(image), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=_clean_env())
    assert done.returncode == 0, done.stderr
    assert "run" in done.stdout and "api" in done.stdout


def test_the_image_serves_the_api_the_console_and_its_reference(image: Path, tmp_path: Path,
                                                                   redis_databases: RedisDatabases) -> None:
    port = free_port()
    with redis_databases.lease() as redis_url:
        env = _clean_env(SGW_REDIS_URL=redis_url, SGW_API_PORT=str(port), SGW_API_HOST="127.0.0.1",
                         SGW_LOG_FORMAT="json")
        log = tmp_path / "api.log"
        proc = subprocess.Popen([str(image), "api"], cwd=tmp_path, env=env, stdout=open(log, "wb"),
                                stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, log.read_text()[-3000:]
                try:
                    if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            for path in ("/console", "/console/static/console.js", "/docs", "/docs/static/swagger-ui-bundle.js",
                         "/openapi.json"):
                assert httpx.get(base + path, timeout=10).status_code == 200, path
            assert httpx.get(base + "/v1/scorer-groups", timeout=10).status_code == 401
        finally:
            proc.terminate()
            proc.wait(timeout=30)
