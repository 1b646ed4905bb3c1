"""0.3's new fields are left out of a document that does not use them, so 0.2 SDKs - whose models
refuse fields they do not know - still read judges, dataset rows and runs; and they are there when
used."""

from __future__ import annotations

from scorer_groups.models import Judge
from scorer_groups.runs import DatasetItem


def test_new_fields_are_absent_unless_used() -> None:
    assert "context" not in Judge(id="j", name="J", criteria="c").wire()
    assert Judge(id="j", name="J", criteria="c", context="retrieval").wire()["context"] == "retrieval"
    plain = DatasetItem(input="q").stored()
    assert "humanRating" not in plain and "humanPass" not in plain
    labelled = DatasetItem(input="q", human_rating=7, human_pass=True).stored()
    assert (labelled["humanRating"], labelled["humanPass"]) == (7, True)
