"""Judge call records are kept cut and masked: every text cut at the bound with its full length
said, a secret masked whole even where the cut falls inside it, text UTF-8 cannot carry
replaced; and the encoded records are what the wire model reads."""

from __future__ import annotations

import orjson

from scorer_groups.api_models import JudgeCallRecord
from scoring.judge_calls import CALL_TEXT_MAX_CHARS, encode_calls, kept
from scoring.ports import JudgeCall, TokenUsage
from scoring.redact import Redactor

OPERATOR_SECRET = "operator-judge-key-7f3a9c"


def call(user: str, answer: str | None = '{"rating": 7}', error: str | None = None) -> JudgeCall:
    return JudgeCall("judge-model", (("system", "You grade."), ("user", user)), answer, 1_796_000_000.0, 0.25, 2,
                     TokenUsage(120, 9), error)


def test_long_texts_are_cut_at_the_bound_with_their_full_length() -> None:
    long = "x" * (CALL_TEXT_MAX_CHARS * 3)
    record = kept(call(long, answer="y" * 5000), Redactor())
    assert record.messages == (("system", "You grade."), ("user", "x" * CALL_TEXT_MAX_CHARS))
    assert record.answer == "y" * CALL_TEXT_MAX_CHARS
    assert record.lengths == (10, CALL_TEXT_MAX_CHARS * 3, 5000)


def test_secrets_are_masked_by_shape_in_messages_and_answers_by_value_in_errors_even_across_the_cut() -> None:
    redact = Redactor([OPERATOR_SECRET])
    shaped = "sk-proj-" + "A1b2C3d4" * 6  # an API key's shape, masked wherever it is
    record = kept(call(f"mail me {shaped}", answer=f"echo {shaped}", error=f"HTTP 401 for key {OPERATOR_SECRET}"),
                  redact)
    text = orjson.dumps([record.messages, record.answer, record.error]).decode()
    assert OPERATOR_SECRET not in text and shaped not in text and "[redacted]" in text
    # The tenant's own text is not compared with the known secrets: a masked guess would say it
    # was right (scoring.redact). Its echo in an error neither.
    guessed = kept(call(f"is it {OPERATOR_SECRET}?", answer=f"echo {OPERATOR_SECRET}",
                        error=f"judge answer is not a JSON object: 'echo {OPERATOR_SECRET}'"), redact)
    assert (guessed.messages[1][1], guessed.answer) == (f"is it {OPERATOR_SECRET}?", f"echo {OPERATOR_SECRET}")
    assert guessed.error == f"judge answer is not a JSON object: 'echo {OPERATOR_SECRET}'"
    # The cut falls inside a secret: masked whole before the cut, never a prefix left.
    straddling = "a" * (CALL_TEXT_MAX_CHARS - 10) + shaped + " tail"
    cut = kept(call(straddling), redact).messages[1][1]
    assert len(cut) == CALL_TEXT_MAX_CHARS and shaped[:12] not in cut
    # Keys masked early shorten the text: a secret cut short at the masked slice's end moves left,
    # into what is kept, unless the cut counts back from that end.
    early = " ".join("sk-proj-" + "Z" * 60 for _ in range(6))
    for secret in (shaped, "postgres://admin:Sup3rS3cretDbPassw0rd@db:5432/app"):
        inside = secret.index("@") if "@" in secret else 12  # what of it the slice holds: unrecognisable
        shifted = early + "b" * (CALL_TEXT_MAX_CHARS + 256 - len(early) - inside) + secret + " and more text" * 50
        kept_text = kept(call(shifted), redact).messages[1][1]
        assert "Sup3r" not in kept_text and shaped[:12] not in kept_text, kept_text[-80:]


def test_a_hostile_text_is_bounded_in_bytes_and_a_results_calls_share_one_bound() -> None:
    from scoring.judge_calls import CALL_TEXT_MAX_BYTES, RESULT_CALLS_MAX_BYTES

    control = "\x01" * 10_000  # six bytes each in JSON
    record = kept(call(control, answer=control), Redactor())
    assert len(orjson.dumps(record.messages[1][1])) <= CALL_TEXT_MAX_BYTES
    assert record.lengths[1] == 10_000, "the full length still said"
    twenty = [(f"j{n}", f"Judge {n}", (record,)) for n in range(20)]
    assert len(encode_calls(twenty)) <= RESULT_CALLS_MAX_BYTES + 20 * 1_000, "texts share the result's bound"


def test_text_utf8_cannot_carry_is_replaced_and_the_records_read_as_the_wire_model() -> None:
    record = kept(call("q", answer='{"rating": 7, "justification": "\ud800 odd"}'), Redactor())
    encoded = encode_calls([("quality", "Quality", (record,)), ("pii", "PII", ())])
    (document,) = orjson.loads(encoded)
    wire = JudgeCallRecord.model_validate(document)
    assert (wire.ref_id, wire.member, wire.model, wire.attempts, wire.latency_ms) == ("quality", "Quality",
                                                                                     "judge-model", 2, 250.0)
    assert [(m.role, m.content, m.length) for m in wire.messages] == [("system", "You grade.", 10), ("user", "q", 1)]
    assert wire.answer is not None and "\ufffd" not in wire.answer and "odd" in wire.answer
    assert wire.usage is not None and (wire.usage.prompt_tokens, wire.usage.completion_tokens) == (120, 9)
    assert encode_calls([("pii", "PII", ())]) == b"", "no call, nothing kept"
