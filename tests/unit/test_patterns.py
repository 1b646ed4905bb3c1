"""Pattern members: RE2 regexes in linear time, keywords, templates, targets."""

from __future__ import annotations

import random

import pytest
import re2

from scoring.members.patterns import (
    SCREEN,
    SCREENED_TEXTS_KEPT,
    TEMPLATES,
    UNSCREENED_TEMPLATES,
    TemplateScreen,
    compiled,
    luhn_valid,
)
from scoring.models import RE2_OPTIONS, Pattern, compile_user_regex
from scoring.re2_search import matches


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


# --- the template screen: one pass for every template, a check skipped only when surely absent ----

SCREEN_TEXTS = [
    "", " ", "sorry", "I'm sorry", "I’m so sorry", "i apologise", "SORRY ABOUT THE delay",
    "write to a@b.co", "a@b.c", "@example.com", "x" * 300 + "jane@example.org",
    "4111 1111 1111 1111", "4111 1111 1111 111", "card 4111-1111-1111-11112", "41111111111111111111",
    "123-45-6789", "x123-45-6789", "(415) 555-0132", "+1 415.555.0132", "415-555-013",
    "I can't help with that", "as an AI, I won’t", "é" * 50 + " I'm sorry " + "中" * 50,
    "\u2028sorry\u2029", "sorry" + "\x00" + "about that", "4111 1111 1111 1111" + "5" * 3,
]


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_the_screen_skips_a_template_only_where_its_own_search_finds_nothing(template: str) -> None:
    # Its answers against each template's own regex on the same texts: screened out means
    # no match; and a check gives the same verdict with the screen as the search alone.
    regex = compile_user_regex(TEMPLATES[template].regex)
    unscreened = TemplateScreen(RE2_OPTIONS)
    unscreened._set = None  # the screen off: every check searches
    for text in SCREEN_TEXTS + [t[:cut] for t in SCREEN_TEXTS for cut in (3, 11, 17)]:
        found = regex.search(text) is not None
        if template in UNSCREENED_TEMPLATES:  # always searched
            assert SCREEN.absent(template, text) is False
        else:
            assert SCREEN.absent(template, text) is not found, (template, text)
        assert unscreened.absent(template, text) is False
        assert matched(pattern(template=template), text) is (found and matched_without_screen(template, text))


def matched_without_screen(template: str, text: str) -> bool:
    confirm = TEMPLATES[template].confirm
    regex = compile_user_regex(TEMPLATES[template].regex)
    return any(confirm is None or confirm(m.group(0)) for m in regex.finditer(text))


def test_a_screen_whose_pass_gave_up_screens_nothing_out() -> None:
    # RE2::Set reports no match at all when its DFA runs out of memory: the canary (a match at
    # every text's end) is then missing too, and every check searches on its own.
    starved = re2.Options()
    starved.log_errors = False
    starved.max_mem = 1 << 15
    screen = TemplateScreen(starved)
    text = "".join(f"{n} sorry-ish {n * 7919 % 10007}@x{n}.example 4111 {n:04d} 555-{n:04d}; " for n in range(4000))
    if screen._set is None:  # refused to compile at this size: off as well
        assert not screen.absent("apology", text)
        return
    assert screen._set.Match(text) is None, "the starved DFA still answered: the test proves nothing"
    assert not any(screen.absent(t, text) for t in TEMPLATES)


def test_the_screen_never_answers_for_another_text() -> None:
    screen = TemplateScreen(RE2_OPTIONS)
    texts = [f"text {n}" + (" I'm sorry" if n % 2 else "") for n in range(3 * SCREENED_TEXTS_KEPT)]
    for _ in range(2):
        for n, text in enumerate(texts):
            assert screen.absent("apology", text) is (n % 2 == 0)
            assert screen.utf8(text) == text.encode()


# --- one search on the text's UTF-8: the wrapper's answer, at its offset ------------------------

SEARCHED = ["a*", "x*$", r"\b", r"\bsorry\b", "(?i)SORRY", "é+", "中", r"\d{3}", r"(?s).", r"\z", "[^a-z]{2}",
            r"\B", "(?U)a+?", "^", "$"]


@pytest.mark.parametrize("source", SEARCHED + [f"template:{t}" for t in sorted(TEMPLATES)])
def test_a_search_finds_the_first_match_the_re2_wrapper_finds_at_the_same_offset(source: str) -> None:
    # The check searches RE2 on the text's UTF-8 itself (scoring.re2_search, not the wrapper's
    # str API): for texts with multi-byte characters, empty matches and candidates a template
    # refuses, the offset (in characters) must be the wrapper's first accepted match's; and a
    # filter's "does it match" the wrapper's answer.
    template = source.removeprefix("template:") if source.startswith("template:") else None
    regex = compile_user_regex(TEMPLATES[template].regex if template else source)
    confirm = TEMPLATES[template].confirm if template else None
    p = pattern(template=template) if template else pattern(regex=source)
    texts = [*SCREEN_TEXTS, "", "aé中a", "中中 sorry 中", "é4111 1111 1111 1112 é4111 1111 1111 1111",
             "123-45-6789 000-12-3456 中 078-05-1120", "x" * 40 + "é" * 40 + "a"]
    for text in texts:
        first = next((m.start() for m in regex.finditer(text) if confirm is None or confirm(m.group(0))), None)
        assert matches(regex, text) is (regex.search(text) is not None), (source, text)  # a filter's question
        detail = compiled(p).check("", text).detail
        assert detail == (compiled(p).no_match.detail if first is None else
                          f"{compiled(p)._what} matched in output at offset {first}"), (source, text)


def test_the_screen_answers_rightly_on_a_tenants_digits_and_separators() -> None:
    # A hostile trace: long runs of digits and separators (the card template's worst, which is
    # why it is searched alone); every screened answer still agrees with the template's search.
    rng = random.Random(7)
    for size in (4_000, 100_000):
        text = "".join(rng.choice("0123456789 -@.'’()+") for _ in range(size))
        for template in TEMPLATES:
            found = compile_user_regex(TEMPLATES[template].regex).search(text) is not None
            assert not (SCREEN.absent(template, text) and found), template
