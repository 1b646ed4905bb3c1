"""MkDocs hooks (mkdocs.yml): pages that are made from the code, so they cannot go stale -
``<!-- settings -->`` becomes the table of every setting (``worker/settings.py``), and
``<!-- trace-schema -->`` the JSON schema of a trace on the traces topic (``scoring.subjects.Trace``)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import SecretStr

from scoring.subjects import Trace
from worker.settings import Settings


def settings_table() -> str:
    rows = ["| Variable | Default | What it does |", "| --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        default = field.default
        shown = "(secret)" if isinstance(default, SecretStr) else f"`{default!r}`" if default not in ("", None) else ""
        description = " ".join((field.description or "").split()).replace("|", "\\|")
        rows.append(f"| `SGW_{name.upper()}` | {shown} | {description} |")
    return "\n".join(rows)


def trace_schema() -> str:
    schema = Trace.model_json_schema(by_alias=True)
    return "```json\n" + json.dumps(schema, indent=2) + "\n```"


def on_page_markdown(markdown: str, **_: Any) -> str:
    return markdown.replace("<!-- settings -->", settings_table()).replace("<!-- trace-schema -->", trace_schema())
