"""Pattern members: RE2 regexes in linear time, keywords, templates, targets."""

from __future__ import annotations

import pytest

from scoring.members.patterns import compiled, luhn_valid
from scoring.models import Pattern


def pattern(**over: object) -> Pattern:
    return Pattern.model_validate({"id": "p", "name": "P", "polarity": "failure", **over})


def matched(p: Pattern, output: str, input: str = "") -> bool:
    return compiled(p).check(input, output).matched


@pytest.mark.timeout(60)  # a deadline, not a speed check: backtracking would outlive the universe
def test_catastrophic_regex_on_100000_characters_is_linear() -> None:
    p = pattern(regex=r"(a+)+$")
    text = "a" * 100_000 + "!"
    assert not matched(p, text)


def test_contains_is_case_insensitive_any_keyword() -> None:
    p = pattern(contains=["refund", "Chargeback"])
    assert matched(p, "You can request a REFUND today")
    assert matched(p, "no CHARGEBACK please")
    assert not matched(p, "nothing to see")


@pytest.mark.parametrize(("target", "input", "output", "expected"), [
    ("output", "sorry", "fine", False), ("output", "fine", "sorry", True),
    ("input", "sorry", "fine", True), ("input", "fine", "sorry", False),
    ("both", "sorry", "fine", True), ("both", "fine", "sorry", True), ("both", "a", "b", False)])
def test_target_picks_the_side(target: str, input: str, output: str, expected: bool) -> None:
    assert matched(pattern(contains=["sorry"], target=target), output, input) is expected


@pytest.mark.parametrize(("template", "text", "expected"), [
    ("email", "write to jane.doe+x@example.co.uk now", True),
    ("email", "no at sign here", False),
    ("phone", "call (415) 555-0132 today", True),
    ("phone", "call +1 415-555-0132", True),
    ("phone", "version 1.2.3", False),
    ("credit_card", "card 4111 1111 1111 1111 exp", True),
    ("credit_card", "card 4111-1111-1111-1111", True),
    ("credit_card", "order 4111 1111 1111 1112", False),  # fails the Luhn check
    ("ssn", "ssn 123-45-6789", True),
    ("ssn", "ssn 000-45-6789", False),
    ("ssn", "ssn 666-45-6789", False),
    ("ssn", "ssn 123-00-6789", False),
    ("apology", "I'm sorry for the confusion", True),
    ("apology", "We offer our apologies", True),
    ("apology", "My apologies, that was wrong", True),
    ("apology", "The sorry state of affairs", False),
    ("refusal", "I can't help with that request.", True),
    ("refusal", "I'm unable to assist with this.", True),
    ("refusal", "Here is how to do it", False),
])
def test_templates(template: str, text: str, expected: bool) -> None:
    assert matched(pattern(template=template), text) is expected


def test_luhn() -> None:
    assert luhn_valid("4111111111111111") and luhn_valid("79927398713")
    assert not luhn_valid("4111111111111112")


def test_detail_says_where_never_what() -> None:
    verdict = compiled(pattern(template="email")).check("", "mail me: bob@example.com")
    assert verdict.matched and "bob" not in verdict.detail and "offset 9" in verdict.detail
