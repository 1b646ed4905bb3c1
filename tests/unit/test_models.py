"""Save-time limits of the spec, refused with messages that name the user's field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from scoring.errors import InvalidDocument
from scoring.models import CatalogDocument, CustomEvaluator, Member, OnlineProfile, Pattern, ScorerGroup


def member(i: int = 0, **over: Any) -> dict[str, Any]:
    return {"kind": "judge", "refId": f"j-{i}", "weight": 1, "gate": False, **over}


def group(**over: Any) -> dict[str, Any]:
    return {"id": "g-1", "name": "Release bar", "projectId": "p-1", "members": [member()], **over}


def online(**over: Any) -> dict[str, Any]:
    return {"enabled": True, "sampleRate": 0.2, "alertThreshold": 6, "severity": "high", **over}


def errors_of(model: type, doc: dict[str, Any]) -> list[str]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(doc)
    return InvalidDocument.from_validation(info.value).errors


def test_a_group_round_trips_in_camel_case() -> None:
    g = ScorerGroup.model_validate(group(online=online()))
    assert g.project_id == "p-1" and g.members[0].ref_id == "j-0"
    wire = g.wire()
    assert wire["projectId"] == "p-1"
    assert wire["online"] == {"enabled": True, "sampleRate": 0.2, "alertThreshold": 6,
                              "severity": "high", "scope": "trace", "idleSeconds": 120, "alertOnNoScore": True}
    assert ScorerGroup.model_validate(wire) == g


def test_member_kinds_are_exactly_three() -> None:
    for kind in ("judge", "pattern", "custom"):
        assert Member.model_validate(member(kind=kind)).kind == kind
    msgs = errors_of(Member, member(kind="code"))
    assert msgs == ["kind: Input should be 'judge', 'pattern' or 'custom' (got 'code')"]


@pytest.mark.parametrize("count", [1, 20])
def test_1_to_20_members_are_accepted(count: int) -> None:
    assert len(ScorerGroup.model_validate(group(members=[member(i) for i in range(count)])).members) == count


@pytest.mark.parametrize("count", [0, 21])
def test_0_or_21_members_are_refused(count: int) -> None:
    msgs = errors_of(ScorerGroup, group(members=[member(i) for i in range(count)]))
    assert len(msgs) == 1 and msgs[0].startswith("members: List should have at")


@pytest.mark.parametrize("weight", [0, 0.5, 1000])
def test_weight_0_to_1000_is_accepted(weight: float) -> None:
    assert Member.model_validate(member(weight=weight)).weight == weight


@pytest.mark.parametrize(("weight", "says"), [(-1, "greater than or equal to 0"),
                                               (1000.5, "less than or equal to 1000"),
                                               ("1", "valid number")])
def test_weight_out_of_range_names_the_field(weight: Any, says: str) -> None:
    msgs = errors_of(ScorerGroup, group(members=[member(), member(1, weight=weight)]))
    assert len(msgs) == 1 and msgs[0].startswith("members[1].weight:") and says in msgs[0]


@pytest.mark.parametrize("rate", [0, 1, 1.0, 0.5])
def test_sample_rate_0_to_1_is_accepted(rate: float) -> None:
    assert OnlineProfile.model_validate(online(sampleRate=rate)).sample_rate == rate


@pytest.mark.parametrize("rate", [1.0000001, -0.1])
def test_sample_rate_outside_0_1_is_refused(rate: float) -> None:
    msgs = errors_of(ScorerGroup, group(online=online(sampleRate=rate)))
    assert len(msgs) == 1 and msgs[0].startswith("online.sampleRate:") and repr(rate) in msgs[0]


@pytest.mark.parametrize("threshold", [None, 0, 10, 6.5])
def test_alert_threshold_0_to_10_or_null(threshold: float | None) -> None:
    assert OnlineProfile.model_validate(online(alertThreshold=threshold)).alert_threshold == threshold


@pytest.mark.parametrize("threshold", [10.5, -1])
def test_alert_threshold_outside_0_10_is_refused(threshold: float) -> None:
    msgs = errors_of(OnlineProfile, online(alertThreshold=threshold))
    assert len(msgs) == 1 and msgs[0].startswith("alertThreshold:")


@pytest.mark.parametrize("idle", [0, 86_400])
def test_idle_seconds_0_to_86400(idle: int) -> None:
    assert OnlineProfile.model_validate(online(idleSeconds=idle)).idle_seconds == idle


def test_idle_seconds_over_a_day_is_refused() -> None:
    assert errors_of(OnlineProfile, online(idleSeconds=86_401))[0].startswith("idleSeconds:")


def test_a_sample_salt_is_optional_printable_and_absent_from_the_document_when_unset() -> None:
    assert "sampleSalt" not in OnlineProfile.model_validate(online()).wire()
    assert OnlineProfile.model_validate(online(sampleSalt="v2 rubric")).wire()["sampleSalt"] == "v2 rubric"
    msgs = errors_of(OnlineProfile, online(sampleSalt="v2\u202erubric"))
    assert len(msgs) == 1 and msgs[0].startswith("sampleSalt:") and "printable ASCII" in msgs[0]
    assert errors_of(OnlineProfile, online(sampleSalt="x" * 201))[0].startswith("sampleSalt:")


def test_profile_defaults_scope_trace_and_idle_120() -> None:
    p = OnlineProfile.model_validate(online())
    assert (p.scope, p.idle_seconds) == ("trace", 120)


def test_a_partial_profile_is_refused_naming_each_missing_key() -> None:
    msgs = errors_of(OnlineProfile, {"sampleRate": 0.5})
    assert msgs == ["enabled: Field required", "alertThreshold: Field required", "severity: Field required"]


@pytest.mark.parametrize("severity", ["low", "medium", "high", "critical"])
def test_documented_severities(severity: str) -> None:
    assert OnlineProfile.model_validate(online(severity=severity)).severity == severity


def test_unknown_severity_and_scope_are_refused() -> None:
    msgs = errors_of(OnlineProfile, online(severity="urgent", scope="conversation"))
    assert msgs[0].startswith("severity:") and msgs[1].startswith("scope:")


def test_strict_types_and_unknown_fields() -> None:
    msgs = errors_of(OnlineProfile, online(enabled="yes", sampleRatio=0.3))
    assert "enabled: Input should be a valid boolean (got 'yes')" in msgs
    assert "sampleRatio: Extra inputs are not permitted" in msgs


def test_pattern_backreference_is_refused_at_save_time() -> None:
    msgs = errors_of(Pattern, {"id": "p", "name": "Repeat", "polarity": "failure", "regex": r"(a)\1"})
    assert len(msgs) == 1 and msgs[0].startswith("regex: regex is not supported by the linear-time")


def test_pattern_needs_exactly_one_matcher() -> None:
    base = {"id": "p", "name": "P", "polarity": "failure"}
    assert "exactly one of regex, contains, template" in errors_of(Pattern, base)[0]
    assert "(got regex, template)" in errors_of(Pattern, {**base, "regex": "x", "template": "email"})[0]


def test_custom_evaluator_code_xor_url() -> None:
    assert "needs code" in errors_of(CustomEvaluator, {"id": "c", "name": "C", "type": "code"})[0]
    msgs = errors_of(CustomEvaluator, {"id": "c", "name": "C", "type": "external", "url": "ftp://x"})
    assert msgs[0].startswith("url: url must start with http")


def test_catalog_document_lists_every_error_with_its_path() -> None:
    with pytest.raises(ValidationError) as info:
        CatalogDocument.model_validate({
            "judges": [{"id": "j", "name": "J"}],
            "groups": [group(online=online(sampleRate=2))],
        })
    msgs = InvalidDocument.from_validation(info.value).errors
    assert msgs == ["judges[0].criteria: Field required",
                    "groups[0].online.sampleRate: Input should be less than or equal to 1 (got 2)"]
