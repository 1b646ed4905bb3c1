"""The SDK's run progress: a bar on a terminal, nothing on a pipe (a CI log stays clean)."""

from __future__ import annotations

import pytest

from scorer_groups.evaluations import _Progress, _upload


def test_a_bar_when_shown_and_nothing_otherwise(capsys: pytest.CaptureFixture[str]) -> None:
    shown = _Progress(4, True)
    for _ in range(4):
        shown.step()
    drawn = capsys.readouterr().err
    assert "\r[##############################] 4/4 rows\n" in drawn and "1/4 rows" in drawn
    hidden = _Progress(4, False)
    for _ in range(4):
        hidden.step()
    assert capsys.readouterr().err == ""


def test_rows_are_uploaded_as_they_are() -> None:
    assert _upload([{"input": "a", "metadata": {"snake_key": 1}}], None, None) == {
        "format": "jsonl", "content": '{"input":"a","metadata":{"snake_key":1}}\n'}, "user keys never renamed"
    with pytest.raises(ValueError, match="give rows or path"):
        _upload(None, None, None)
