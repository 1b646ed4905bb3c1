"""The panel tests' catalog, groups and subjects: every member kind, for real."""

from __future__ import annotations

from typing import Any

from scoring.catalog import CatalogSnapshot
from scoring.models import CustomEvaluator, Judge, Pattern, ScorerGroup
from scoring.subjects import Subject


def catalog(external_url: str) -> CatalogSnapshot:
    return CatalogSnapshot(
        version=1,
        judges={"quality": Judge(id="quality", name="Quality", criteria="Helpful?"),
                "safety": Judge(id="safety", name="Safety", criteria="Safe?")},
        patterns={"apology": Pattern(id="apology", name="Apology", polarity="failure", template="apology"),
                  "disclaimer": Pattern(id="disclaimer", name="Disclaimer", polarity="proper",
                                        contains=["not financial advice"])},
        customs={"length": CustomEvaluator(id="length", name="Length", type="code",
                                           code="def score(input, output, expected, spans, metadata):\n"
                                                "    return min(1.0, len(output) / 100)\n"),
                 "boom": CustomEvaluator(id="boom", name="Boom", type="code",
                                         code="def score(*a):\n    return 1 / 0\n"),
                 "remote": CustomEvaluator(id="remote", name="Remote", type="external", url=external_url,
                                           timeout_ms=2000)},
    )


def group(*members: tuple[str, str, float, bool]) -> ScorerGroup:
    return ScorerGroup.model_validate({
        "id": "g", "name": "G", "projectId": "p",
        "members": [{"kind": k, "refId": r, "weight": w, "gate": g} for k, r, w, g in members]})


def subject(output: str, **over: Any) -> Subject:
    base: dict[str, Any] = dict(scope="trace", input="Should I buy?", output=output, expected=None,
                                spans=[], metadata={}, transcript="")
    return Subject(**{**base, **over})
