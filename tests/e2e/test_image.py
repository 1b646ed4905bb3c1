"""The image builds and runs. No container engine is on these machines, so the test does what
``deploy/Dockerfile`` does, stage by stage: the compiled stage's ``COPY`` lines into a clean
directory, its ``pip install`` into a clean virtualenv and its ``python -m`` steps there (the hot
path built with mypyc, exported); then the image's ``COPY`` lines, its ``pip install`` - offline,
from the wheels bootstrap collected (``.wheels``) - and the compiled stage's output laid over
the install. It starts ``scorer-worker --help`` and ``scorer-worker api`` from there, away from
the repository, reads the console and the API reference from the installed package, and checks
that the image's hot path is the compiled one."""

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

from deploy.compiled import HOT_PATH
from devtools.processes import free_port
from tests.support.redis_databases import RedisDatabases

# Building the image (a clean install, the hot path compiled) takes minutes, more on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
WHEELS = ROOT / ".wheels"


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (keyword, arguments), continuation lines joined (every
    stage's, in order: ``stages`` splits them)."""
    joined = text.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def stages(steps: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """Each stage's instructions by its name (``FROM ... AS name``); the last one, the image, as "image"."""
    named: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for keyword, rest in steps:
        if keyword == "FROM":
            current = []
            words = rest.split()
            named[words[2] if len(words) == 3 and words[1].upper() == "AS" else f"stage-{len(named)}"] = current
        else:
            current.append((keyword, rest))
    named["image"] = named.pop(list(named)[-1])
    return named


def replay_copies(steps: list[tuple[str, str]], app: Path) -> None:
    """Docker's COPY from the build context (``--from`` copies are the caller's): a directory's
    contents go into the target; a file into a target ending in "/" (a directory), else to the
    target's path. What .dockerignore leaves out of the context is left out."""
    for keyword, rest in steps:
        if keyword != "COPY" or rest.startswith("--from="):
            continue
        *sources, target = shlex.split(rest)
        for source in sources:
            origin, destination = ROOT / source, app / target
            if origin.is_dir():
                shutil.copytree(origin, destination,
                                ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "*.so"))
            elif target.endswith("/"):
                destination.mkdir(parents=True, exist_ok=True)
                shutil.copy(origin, destination / origin.name)
            else:
                shutil.copy(origin, destination)


def run_commands(steps: list[tuple[str, str]]) -> list[str]:
    """The commands of a stage's RUN lines, split at ``&&``."""
    return [part.strip() for keyword, rest in steps if keyword == "RUN" for part in rest.split("&&")]


def pip_install_arguments(steps: list[tuple[str, str]]) -> list[str]:
    """The arguments of a stage's ``pip install``, without the ones only a build cache needs."""
    for command in run_commands(steps):
        if "pip install" in command:
            arguments = shlex.split(command.split("pip install", 1)[1])
            return [a for a in arguments if a != "--no-cache-dir"]
    raise AssertionError("the stage installs nothing with pip")


def install(steps: list[tuple[str, str]], app: Path, home: Path) -> Path:
    """A stage's COPY lines into ``app`` and its pip install into a clean virtualenv at ``home``,
    offline: the virtualenv's python."""
    replay_copies(steps, app)
    venv.create(home, with_pip=True, clear=True)
    python = home / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           "--no-index", "--find-links", str(WHEELS), *pip_install_arguments(steps)],
                          cwd=app, capture_output=True, text=True, timeout=600, env=_clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def site_packages(python: Path) -> Path:
    found = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True, env=_clean_env())
    return Path(found.stdout.strip())


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's /app and its Python: the path of ``scorer-worker`` in a clean virtualenv."""
    assert WHEELS.is_dir(), "run devtools/bootstrap.sh (./dev test does): it collects the image's wheels"
    named = stages(instructions(DOCKERFILE.read_text()))
    # The compiled stage: its install, then its ``python -m`` steps, the exported tree kept here.
    build_app = tmp_path_factory.mktemp("compiled-app")
    build_python = install(named["compiled"], build_app, tmp_path_factory.mktemp("compiled-venv"))
    exported = tmp_path_factory.mktemp("compiled-out")
    for command in run_commands(named["compiled"]):
        if command.startswith("python -m "):
            argv = [str(exported) if a == "/compiled" else a for a in shlex.split(command)[1:]]
            done = subprocess.run([str(build_python), *argv], cwd=build_app, capture_output=True, text=True,
                                  timeout=600, env=_clean_env())
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    # The image: its install, and the compiled stage's output laid over its site-packages.
    python = install(named["image"], tmp_path_factory.mktemp("app"), tmp_path_factory.mktemp("image-venv"))
    (copied,) = [shlex.split(rest) for keyword, rest in named["image"] if keyword == "COPY" and rest.startswith("--from=")]
    assert copied[1:] == ["/compiled", "/usr/local/lib/python3.11/site-packages/"], copied
    shutil.copytree(exported, site_packages(python), dirs_exist_ok=True)
    return python.parent / "scorer-worker"


def _clean_env(**extra: str) -> dict[str, str]:
    """The machine's environment without this checkout on the path: only the image's install."""
    keep = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("SGW_")}
    return {**keep, **extra}


def test_the_dockerfile_copies_what_the_install_needs() -> None:
    named = stages(instructions(DOCKERFILE.read_text()))
    for stage in ("compiled", "image"):
        copied = {shlex.split(rest)[0] for keyword, rest in named[stage] if keyword == "COPY"}
        assert {"sdk", "scoring", "adapters", "services", "consumers", "worker"} <= copied, "the server needs the SDK's distribution too"


def test_the_images_hot_path_is_the_compiled_one(image: Path, tmp_path: Path) -> None:
    modules = [path.removesuffix(".py").replace("/", ".") for path in HOT_PATH]
    done = subprocess.run([str(image.parent / "python"), "-c",
                           f"import importlib; print(*(importlib.import_module(m).__file__ for m in {modules!r}))"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, env=_clean_env())
    assert done.returncode == 0, done.stderr
    files = done.stdout.split()
    assert len(files) == len(modules) and all(f.endswith(".so") and "site-packages" in f for f in files), files


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
            for path in ("/console", "/console/static/console.js", "/console/static/favicon.svg", "/docs",
                         "/docs/static/swagger-ui-bundle.js", "/openapi.json"):
                assert httpx.get(base + path, timeout=10).status_code == 200, path
            assert httpx.get(base + "/v1/scorer-groups", timeout=10).status_code == 401
        finally:
            proc.terminate()
            proc.wait(timeout=30)
