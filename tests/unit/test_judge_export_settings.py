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


@pytest.mark.parametrize("endpoint", ["http://[::1/v1/traces", "ftp://collector/v1/traces", "http:///v1/traces"])
def test_an_endpoint_httpx_cannot_send_to_is_refused_at_start(endpoint: str) -> None:
    with pytest.raises(ValidationError, match="SGW_JUDGE_TRACE_ENDPOINT"):
        Settings(judge_trace_export="otlp", judge_trace_endpoint=endpoint)


def test_a_header_http_cannot_carry_is_refused_at_start_without_its_value() -> None:
    with pytest.raises(ValidationError, match="printable ASCII") as refused:
        Settings(judge_trace_headers='{"x-key": "caf\u00e9-secret-42"}')
    assert "caf\u00e9-secret-42" not in str(refused.value.errors(include_input=False))
