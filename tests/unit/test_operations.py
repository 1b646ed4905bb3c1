"""Operations: secrets never reach a log line; the ops endpoint answers; settings are documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import structlog

from worker.logs import REDACTED, configure_logging, redact_secrets, redact_text
from worker.metrics import OpsServer
from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_secret_keys_are_masked_at_any_depth() -> None:
    event = redact_secrets(None, "info", {
        "event": "calling", "api_key": "sk-live-123456789", "headers": {"Authorization": "Bearer abc.def"},
        "channel": {"url": "https://x", "secret": "s3cret"}, "password": "hunter2", "count": 3})
    assert event["api_key"] == REDACTED and event["password"] == REDACTED
    assert event["headers"]["Authorization"] == REDACTED
    assert event["channel"] == {"url": "https://x", "secret": REDACTED}
    assert event["count"] == 3 and event["event"] == "calling"


def test_secrets_inside_strings_are_cut_out() -> None:
    text = ("connect redis://admin:pa55word@cache:6379/0 with Bearer eyJhbGciOi.payload "
            "and key sk-proj-ABCDEFGHIJKLMNOP")
    cleaned = redact_text(text)
    assert "pa55word" not in cleaned and "eyJhbGciOi" not in cleaned and "ABCDEFGHIJKLMNOP" not in cleaned
    assert "redis://admin:[redacted]@cache:6379/0" in cleaned


def test_json_log_lines_carry_no_secret(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json", "info")
    try:
        structlog.get_logger("t").info("judge call failed", url="https://u:topsecret@judge/v1",
                                       judge_api_key="sk-abcdefghijklmnop")
        line = capsys.readouterr().err.strip().splitlines()[-1]
        record = json.loads(line)
        assert record["event"] == "judge call failed" and record["level"] == "info"
        assert "topsecret" not in line and "sk-abcdefghijklmnop" not in line
    finally:
        structlog.reset_defaults()


async def test_ops_endpoint_serves_metrics_health_and_readiness() -> None:
    ready = {"ok": False}
    server = OpsServer(0, lambda: (ready["ok"], "ready" if ready["ok"] else "waiting for a partition assignment"),
                       host="127.0.0.1")
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            metrics = await client.get("/metrics")
            assert metrics.status_code == 200 and "sgw_traces_consumed_total" in metrics.text
            assert (await client.get("/healthz")).status_code == 200
            not_ready = await client.get("/readyz")
            assert not_ready.status_code == 503 and "partition assignment" in not_ready.text
            ready["ok"] = True
            assert (await client.get("/readyz")).status_code == 200
            assert (await client.get("/nope")).status_code == 404
    finally:
        await server.stop()


def test_every_setting_is_documented_and_secrets_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGW_JUDGE_API_KEY", "sk-do-not-print-me")
    monkeypatch.setenv("SGW_SAMPLE_UNKNOWN", "ignored")
    settings = Settings()
    rows = settings.described()
    assert all(description for _, _, description in rows), [env for env, _, d in rows if not d]
    shown = dict((env, value) for env, value, _ in rows)
    assert shown["SGW_JUDGE_API_KEY"] == "**********"
    with pytest.raises(Exception, match="frozen"):
        settings.max_in_flight = 3  # type: ignore[misc]


def test_invalid_settings_are_refused_naming_the_variable() -> None:
    env = {**os.environ, "SGW_MAX_IN_FLIGHT": "-1", "SGW_LOG_FORMAT": "yaml", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "worker.cli", "settings"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "SGW_MAX_IN_FLIGHT: Input should be greater than or equal to 0\n" in done.stderr
    assert "SGW_LOG_FORMAT: Input should be 'json' or 'console'\n" in done.stderr
    assert "yaml" not in done.stderr, "what was given is never quoted (tests/security/test_redaction_and_echoes.py)"


def test_a_lease_shorter_than_the_member_deadline_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGW_CLAIM_LEASE_S", "60")
    monkeypatch.setenv("SGW_MEMBER_DEADLINE_S", "90")
    with pytest.raises(Exception, match=r"SGW_CLAIM_LEASE_S \(60\) must exceed SGW_MEMBER_DEADLINE_S \(90\)"):
        Settings()
