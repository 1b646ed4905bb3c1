"""Whatever a tenant writes to the OTLP topic, reading a record never raises: it yields spans,
or a dead letter with a reason (and its value as received), or both."""

from __future__ import annotations

from typing import Any, get_args

import orjson
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumers.decode import DeadLetterReason
from consumers.otlp import OtlpConsumer
from scoring.otlp.mapping import MappingRules
from tests.support.otlp_records import Telemetry, records, span

TP = TopicPartition("otlp_spans", 0)
REASONS = set(get_args(DeadLetterReason))


def intake() -> OtlpConsumer:
    # Decoding touches neither Kafka nor Redis: those parts are never called here.
    return OtlpConsumer(consumer=None, producer=None, buffer=None, rules=MappingRules(),  # type: ignore[arg-type]
                        traces_topic="t", dlq_topic="d", max_record_bytes=1 << 16, max_dead_letter_bytes=1 << 12)


def record(value: bytes | None, key: bytes | None = None) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(topic=TP.topic, partition=0, offset=7, timestamp=0, timestamp_type=0, key=key, value=value,
                          checksum=None, serialized_key_size=0, serialized_value_size=0, headers=())


def valid_request() -> bytes:
    t = Telemetry(**{"service.name": "s", "sgw.project.id": "p"})
    with span(t.tracer, "run", **{"input.value": "q", "output.value": "a"}):
        pass
    return records(t.spans())[0][1]


VALID = valid_request()
json_values: Any = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
                                lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                                max_leaves=30)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_any_bytes_become_spans_or_a_dead_letter(value: bytes) -> None:
    spans, letter = intake()._decode(record(value))
    assert spans or letter is not None, "a record of no spans is dead-lettered too"
    if letter is not None:
        assert letter.reason in REASONS and letter.offset == 7 and letter.value_bytes == len(value)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(["resourceSpans", "resource_spans", "x"]), json_values, max_size=2))
def test_any_json_document_becomes_spans_or_a_dead_letter(document: dict[str, Any]) -> None:
    spans, letter = intake()._decode(record(orjson.dumps(document)))
    assert spans or (letter is not None and letter.reason in REASONS)


@settings(max_examples=300)
@given(st.integers(0, len(VALID) - 1), st.integers(0, 255))
def test_a_corrupted_request_never_raises(position: int, byte: int) -> None:
    corrupted = VALID[:position] + bytes([byte]) + VALID[position + 1:]
    spans, letter = intake()._decode(record(corrupted))
    assert spans or letter is not None


def test_a_tombstone_an_oversized_record_and_a_projectless_one_are_dead_lettered_with_their_reason() -> None:
    assert intake()._decode(record(None))[1].reason == "not_otlp"  # type: ignore[union-attr]
    big = intake()._decode(record(b"{" + b" " * (1 << 16)))[1]
    assert big is not None and big.reason == "too_large" and big.value_truncated and big.value_bytes == (1 << 16) + 1
    t = Telemetry(**{"service.name": "s"})
    with span(t.tracer, "run"):
        pass
    spans, letter = intake()._decode(record(records(t.spans())[0][1], key=b"k"))
    assert spans == [] and letter is not None and letter.reason == "no_project" and letter.key == "k"
    assert letter.value_encoding == "base64", "a protobuf record is kept as received, base64"
    spans, letter = intake()._decode(record(VALID))
    assert len(spans) == 1 and letter is None


def test_a_record_whose_project_is_over_its_share_is_dead_lettered_over_quota() -> None:
    reader = intake()
    spans, letter = reader._decode(record(VALID, key=b"k"))
    member = f"{spans[0].project_id}/{spans[0].trace_id}"
    over = reader._over_quota(record(VALID, key=b"k"), spans, letter, frozenset({member}))
    assert over is not None and over.reason == "over_quota" and "'p'" in over.error and over.value_encoding == "base64"
    assert reader._over_quota(record(VALID), spans, None, frozenset({"other/" + "0" * 32})) is None
