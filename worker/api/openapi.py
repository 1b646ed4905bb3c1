"""The committed OpenAPI document: ``python -m worker.api.openapi`` prints the one the API serves,
and ``worker/api/openapi.json`` is that output, checked in. A test fails when they drift, so a
change to the API's surface is always a visible change to this file too."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

COMMITTED = Path(__file__).with_name("openapi.json")


def document() -> dict[str, Any]:
    from worker.api import create_app
    from worker.settings import Settings

    # No connection is made, nothing is started: the document is built from the routes alone.
    return create_app(Settings(redis_url="redis://127.0.0.1:6379/0")).openapi()


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(document()))
