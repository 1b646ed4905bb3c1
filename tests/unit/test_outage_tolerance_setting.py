"""An outage may last no longer than a batch's writes are recognised when replayed: past that,
a replay after the outage would add its counts, tokens and money again (``keys.ONCE_TTL_S``)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from adapters.stores import keys
from worker.settings import Settings


def test_an_outage_tolerance_past_the_replay_window_is_refused_naming_the_setting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGW_OUTAGE_TOLERANCE_S", str(keys.ONCE_TTL_S))
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert "outage_tolerance_s" in str(refused.value) or "SGW_OUTAGE_TOLERANCE_S" in str(refused.value)
    monkeypatch.setenv("SGW_OUTAGE_TOLERANCE_S", str(keys.ONCE_TTL_S / 2))
    assert Settings().outage_tolerance_s * 2 <= keys.ONCE_TTL_S
