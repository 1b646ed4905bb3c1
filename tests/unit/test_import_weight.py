"""What an import loads at run time, in a fresh interpreter: the scoring core no I/O library
(the SDK's wire models it validates with bring pydantic only), and the SDK none of the server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = ["scoring.models", "scoring.blend", "scoring.panel", "scoring.results", "scoring.routing",
        "scoring.dataset", "scoring.catalog", "scoring.webhooks.payloads", "scoring.otlp.mapping"]
# (subprocess is not here: asyncio itself imports it; the core calls no process - lint-imports.)
IO = {"httpx", "redis", "hiredis", "aiohttp", "aiokafka", "fastapi", "uvicorn"}
SERVER = {"scoring", "adapters", "services", "consumers", "worker", "deploy", "redis", "aiokafka", "fastapi", "re2", "structlog", "orjson"}


def loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nimport json; print(json.dumps(sorted({{m.partition('.')[0] for m in sys.modules}})))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout))


def test_the_scoring_core_loads_no_io_library() -> None:
    loaded = loaded_after("\n".join(f"import {name}" for name in CORE))
    assert "pydantic" in loaded and "scorer_groups" in loaded
    assert not loaded & IO, sorted(loaded & IO)


def test_the_sdk_loads_nothing_of_the_server_even_when_used() -> None:
    loaded = loaded_after("import scorer_groups\nscorer_groups.Client; scorer_groups.AsyncClient; "
                          "scorer_groups.Evaluation; scorer_groups.Pattern; scorer_groups.Ratings")
    assert "httpx" in loaded  # the clients did load
    assert not loaded & SERVER, sorted(loaded & SERVER)


def test_every_public_name_of_the_sdk_resolves() -> None:
    import scorer_groups

    for name in scorer_groups.__all__:
        assert getattr(scorer_groups, name).__name__ == name
