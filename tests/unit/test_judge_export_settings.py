"""The judge span export is refused at start without an endpoint, naming the setting; its
headers are a secret, each value cut from what the process shows alone too."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from worker.settings import Settings


def test_an_export_without_an_endpoint_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(judge_trace_export="otlp")
    assert "SGW_JUDGE_TRACE_ENDPOINT" in str(refused.value)
    assert Settings(judge_trace_export="otlp", judge_trace_endpoint="http://127.0.0.1:4318/v1/traces")


def test_each_export_header_value_is_a_known_secret() -> None:
    settings = Settings(judge_trace_headers='{"x-honeycomb-team": "hc-key-0123456789"}')
    assert "hc-key-0123456789" in settings.secrets()
    assert "hc-key-0123456789" not in str(settings.described())
