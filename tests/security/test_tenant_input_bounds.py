"""What a tenant saves or sends is bounded and validated before it runs: regex complexity, the
text a pattern reads, matching off the event loop, nesting of traces, URLs whole at save, the
egress guard's transition forms, and secrets masked wherever they are shown."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from adapters.egress import EgressPolicy, EgressRefused
from consumers.decode import MAX_NESTING, DeadLetter, decode_trace, nesting_depth
from scoring.members.patterns import INLINE_TEXT_CHARS, MAX_TEXT_CHARS, compiled
from scoring.models import MAX_REGEX_PROGRAM_SIZE, AlertChannel, CustomEvaluator, Pattern
from scoring.redact import Redactor, mask_url
from worker.settings import Settings


def pattern(**over: object) -> Pattern:
    return Pattern.model_validate({"id": "p", "name": "P", "polarity": "failure", **over})


# --- patterns -------------------------------------------------------------------------------------

def test_a_regex_over_the_program_size_cap_is_refused_at_save_naming_the_field() -> None:
    with pytest.raises(ValidationError) as caught:
        pattern(regex=r"(\w+\s?){1,1000}zz")  # 11,005 RE2 instructions: ~40 s per MB before the cap
    text = str(caught.value)
    assert "regex" in text and "too complex" in text and str(MAX_REGEX_PROGRAM_SIZE) in text
    pattern(regex=r"(\w+\s?){1,150}zz")  # 1,655: accepted


def test_a_pattern_reads_at_most_the_documented_text() -> None:
    p = compiled(pattern(contains=["needle"]))
    assert p.check("", "x" * (MAX_TEXT_CHARS - 10) + "needle").matched
    far = p.check("", "x" * MAX_TEXT_CHARS + "needle")
    assert not far.matched and f"read the first {MAX_TEXT_CHARS} characters of the output" in far.detail


async def test_long_texts_are_matched_off_the_event_loop() -> None:
    p = compiled(pattern(regex=r"(\w+\s?){1,150}zz"))
    text = "ab " * (MAX_TEXT_CHARS // 3)
    assert len(text) > INLINE_TEXT_CHARS
    ticks = 0

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    beating = asyncio.create_task(heartbeat())
    verdict = await p.check_off_loop("", text, "p")
    beating.cancel()
    assert not verdict.matched
    assert ticks > 0, "the event loop ran while the regex matched"


# --- traces ---------------------------------------------------------------------------------------

def trace_bytes(output: str) -> bytes:
    return (b'{"traceId":"t","projectId":"p","agentId":"a","timestamp":"2026-12-02T13:00:00Z",'
            b'"spans":[{"spanId":"r","output":' + output.encode() + b"}]}")


@pytest.mark.parametrize("depth", [10, MAX_NESTING - 3])  # the output sits 3 levels down
def test_nesting_within_the_limit_is_a_trace(depth: int) -> None:
    decoded = decode_trace("t", 0, 1, None, trace_bytes("[" * depth + "]" * depth), 1 << 20)
    assert not isinstance(decoded, DeadLetter)


@pytest.mark.parametrize("depth", [MAX_NESTING, 300, 1000])
def test_deeper_nesting_is_dead_lettered_with_the_reason(depth: int) -> None:
    decoded = decode_trace("t", 0, 7, b"k", trace_bytes("[" * depth + "]" * depth), 1 << 20)
    assert isinstance(decoded, DeadLetter)
    assert decoded.reason in ("too_deep", "not_json") and decoded.offset == 7
    assert nesting_depth([[[]]]) == 3 and nesting_depth({"a": [{"b": 1}]}) == 3


# --- URLs -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("url, says", [
    ("http://[bad/hook", "cannot be parsed"),
    ("http://hooks.example:99999/x", "cannot be parsed"),
    ("http://hooks.example:0/x", "port 0"),
    ("ftp://hooks.example/x", "http:// or https://"),
    ("http:///path-only", "no host"),
    ("http://hooks.example/a b", "spaces"),
    ("http://hooks.example\\@evil/", "backslashes"),
])
def test_urls_are_validated_whole_at_save(url: str, says: str) -> None:
    for model, doc in ((AlertChannel, {"agentId": "a", "url": url}),
                       (CustomEvaluator, {"id": "e", "name": "E", "type": "external", "url": url})):
        with pytest.raises(ValidationError) as caught:
            model.model_validate(doc)
        assert "url" in str(caught.value) and says in str(caught.value)


@pytest.mark.parametrize("url", [
    "http://[bad/hook", "http://x:99999/",                   # parse errors are refusals, never crashes
    "http://[2002:7f00:1::]/",                               # 6to4 of 127.0.0.1
    "http://[2002:a9fe:a9fe::]/",                            # 6to4 of 169.254.169.254 (metadata)
    "http://[64:ff9b::7f00:1]/", "http://[64:ff9b::a9fe:a9fe]/",  # NAT64
    "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/",        # Teredo: client 127.0.0.1
    "http://[::ffff:10.0.0.1]/",                             # IPv4-mapped
])
async def test_the_egress_guard_refuses_every_form_of_a_blocked_address(url: str) -> None:
    with pytest.raises(EgressRefused):
        await EgressPolicy().check(url)


def test_credentials_in_urls_are_masked_when_shown_but_kept_when_stored() -> None:
    url = "https://user:pa55word@hooks.example/h?token=abc123&x=1"
    channel = AlertChannel.model_validate({"agentId": "a", "url": url})
    shown = json.dumps(channel.wire())
    assert "pa55word" not in shown and "abc123" not in shown and "x=1" in shown
    assert channel.stored()["url"] == url  # the sender still needs the real URL
    assert "pa55word" not in mask_url(url) and "abc123" not in mask_url(url)


def test_url_settings_are_masked_in_the_settings_listing() -> None:
    settings = Settings(redis_url="redis://:r3dis-pass@cache:6379/0",
                        judge_base_url="https://gw:judge-pass@llm/v1", judge_api_key="sk-abcdefghijkl")
    shown = json.dumps(settings.described())
    for secret in ("r3dis-pass", "judge-pass", "sk-abcdefghijkl"):
        assert secret not in shown
        assert secret in settings.secrets()


def test_known_secrets_are_cut_whatever_their_shape() -> None:
    redact = Redactor(["plain-looking-value", "x"])  # one-character values would cut every word
    assert redact("got plain-looking-value back") == "got [redacted] back"
    assert redact("x marks") == "x marks"
    assert "abc" not in redact("Authorization: Bearer abc.def and whsec_abcdefghijkl and sk-1234567890")


def test_member_reasons_are_cut_of_secrets_before_publishing() -> None:
    redact = Redactor(["s3cr3t-judge-key"])
    assert "s3cr3t" not in redact("RuntimeError: leaked s3cr3t-judge-key via http://u:p4ss@h/")
    assert "p4ss" not in redact("http://u:p4ss@h/")
