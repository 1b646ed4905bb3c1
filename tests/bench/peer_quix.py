"""The peer: the deterministic scenario written plainly with Quix Streams.

    .venv-bench/bin/python -m tests.bench.peer_quix BOOTSTRAP TOPIC OUT_TOPIC GROUP_ID

Reads the traces topic, scores every trace with the same two groups through the same scoring
functions (``scoring.members.patterns``, ``scoring.blend``, the trace subject) in-process, the code
scorer run plainly in this process, and produces one rating per (trace, group). No sandbox,
dedupe, budget or history: what scoring costs without the worker's guarantees. Runs until
SIGTERM, in its own virtualenv (Quix Streams pins an older pydantic than the project).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from quixstreams import Application

from scoring.blend import MemberOutcome, blend, goodness
from scoring.members.patterns import compiled
from scoring.models import CustomEvaluator, Pattern, ScorerGroup
from scoring.subjects import Trace, trace_subject
from tests.bench.workload import DETERMINISTIC_CATALOG

PATTERNS = {p["id"]: Pattern.model_validate(p) for p in DETERMINISTIC_CATALOG["patterns"]}
CUSTOMS = {c["id"]: CustomEvaluator.model_validate(c) for c in DETERMINISTIC_CATALOG["customs"]}
GROUPS = [ScorerGroup.model_validate(g) for g in DETERMINISTIC_CATALOG["groups"]]


def _code_function(scorer: CustomEvaluator) -> Callable[..., Any]:
    namespace: dict[str, Any] = {}
    exec(compile(scorer.code or "", f"<{scorer.id}>", "exec"), namespace)  # trusted bench code
    return namespace["score"]  # type: ignore[no-any-return]


CODE = {ref: _code_function(c) for ref, c in CUSTOMS.items()}


def ratings(value: dict[str, Any]) -> list[dict[str, Any]]:
    trace = Trace.model_validate(value)
    subject = trace_subject(trace)
    out = []
    for group in GROUPS:
        outcomes = []
        for member in group.members:
            if member.kind == "pattern":
                pattern = PATTERNS[member.ref_id]
                verdict = compiled(pattern).check(subject.input, subject.output)
                g = goodness("pattern", verdict.matched, polarity=pattern.polarity)
                outcomes.append(MemberOutcome(name=pattern.name, kind="pattern", weight=member.weight,
                                              gate=member.gate, goodness=g, ref_id=member.ref_id,
                                              native=verdict.matched, detail=verdict.detail))
            else:
                native = CODE[member.ref_id](subject.input, subject.output, subject.expected, subject.member_payload()["spans"],
                                             subject.metadata)
                outcomes.append(MemberOutcome(name=CUSTOMS[member.ref_id].name, kind="custom", weight=member.weight,
                                              gate=member.gate, goodness=goodness("custom", native),
                                              ref_id=member.ref_id, native=native))
        result = blend(outcomes)
        out.append({"traceId": trace.trace_id, "projectId": trace.project_id, "groupId": group.id,
                    "rating": result.score, "reason": result.reason,
                    "members": [{"refId": o.ref_id, "kind": o.kind, "native": o.native, "goodness": o.goodness,
                                 "detail": o.detail} for o in outcomes]})
    return out


def main(bootstrap: str, topic: str, out: str, group_id: str) -> None:
    app = Application(broker_address=bootstrap, consumer_group=group_id, auto_offset_reset="earliest",
                      auto_create_topics=False, use_changelog_topics=False)
    traces = app.topic(topic, value_deserializer="json")
    ratings_topic = app.topic(out, value_serializer="json")
    sdf = app.dataframe(traces)
    sdf = sdf.apply(ratings, expand=True)
    sdf.to_topic(ratings_topic)
    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:5])
