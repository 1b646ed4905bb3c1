"""Run by a virtualenv that holds the SDK alone (tests/e2e/test_sdk_alone.py): the spec's snippets
against the API at $SGW_API_URL with the key $SGW_API_KEY, then one JSON line saying what they
returned and which top-level packages the process loaded. Standard library and the SDK only."""

from __future__ import annotations

import json
import os
import sys

import scorer_groups

snippets = json.loads(sys.stdin.read())
client = scorer_groups.Client(os.environ["SGW_API_URL"], os.environ["SGW_API_KEY"])
quality = client.monitor.judges.create(name="Quality", criteria="Helpful?")
safety = client.monitor.judges.create(name="Safety", criteria="Safe?")
pii = client.monitor.patterns.create(name="PII", polarity="failure", template="email")
names = {"client": client, "quality": quality, "safety": safety, "pii": pii, "session_id": "s-none"}

exec(snippets["create"], names)
group = names["group"]
exec(snippets["trace"], names)
trace_profile = client.monitor.scorer_groups.get(group.id).online
chart = eval('client.monitor.scorer_groups.ratings(group.id, window="7d")', names)
exec(snippets["session"], names)
session_profile = client.monitor.scorer_groups.get(group.id).online
scores = eval(snippets["scores"].splitlines()[0], names)

# The RE2 rule is the server's: the SDK builds the document, the server refuses it by field.
local = scorer_groups.Pattern(id="p", name="Backref", polarity="failure", regex=r"(a)\1")
try:
    client.monitor.patterns.create(name=local.name, polarity="failure", regex=local.regex)
    refused: dict[str, object] = {}
except scorer_groups.BadRequest as exc:
    refused = {"status": exc.status, "fields": exc.fields}

print(json.dumps({
    "group": {"name": group.name, "members": [[m.ref_id, m.weight, m.gate] for m in group.members],
              "ids": [quality.id, safety.id, pii.id]},
    "trace": trace_profile.model_dump(by_alias=True) if trace_profile else None,
    "chart": {"window": chart.window, "buckets": len(chart.buckets)},
    "session": session_profile.model_dump(by_alias=True) if session_profile else None,
    "scores": scores,
    "refused": refused,
    "modules": sorted({name.partition(".")[0] for name in sys.modules}),
}))
