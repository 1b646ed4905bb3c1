"""The server's wire models: the SDK's (``scorer_groups.models``, the single source of truth of
every catalog document) with the rule only the server can check - a pattern's ``regex`` runs in
RE2, the linear-time engine the worker matches with, within a program size.

Server code imports the documents from here, so that every ``Pattern`` it validates (API bodies,
catalog files, stored documents) carries that rule.
"""

from __future__ import annotations

import re2
from pydantic import Field, field_validator

from scorer_groups import models as wire
from scorer_groups.models import (
    DEFAULT_IDLE_SECONDS,
    ID_PATTERN,
    MAX_BUDGET_CALLS,
    MAX_BUDGET_TOKENS,
    MAX_IDLE_SECONDS,
    MAX_MEMBERS,
    MAX_WEIGHT,
    REVEAL_SECRETS,
    SECRET_ROTATION_OVERLAP_S,
    SEVERITIES,
    AlertChannel,
    AlertMode,
    Budget,
    CustomEvaluator,
    Id,
    Judge,
    JudgeExample,
    Member,
    MemberKind,
    Name,
    OnlineProfile,
    PatternTarget,
    PatternTemplate,
    Polarity,
    Scope,
    ScorerGroup,
    Severity,
    Text,
    WireModel,
    check_url_shape,
)

__all__ = [
    "DEFAULT_IDLE_SECONDS", "ID_PATTERN", "MAX_BUDGET_CALLS", "MAX_BUDGET_TOKENS", "MAX_IDLE_SECONDS", "MAX_MEMBERS",
    "MAX_REGEX_PROGRAM_SIZE", "MAX_WEIGHT", "REVEAL_SECRETS", "SECRET_ROTATION_OVERLAP_S", "SEVERITIES",
    "AlertChannel", "AlertMode", "Budget", "CatalogDocument", "CustomEvaluator", "Id", "Judge", "JudgeExample",
    "Member", "MemberKind", "Name", "OnlineProfile", "Pattern", "PatternTarget", "PatternTemplate", "Polarity",
    "Scope", "Scorer", "ScorerGroup", "Severity", "Text", "WireModel", "check_url_shape", "compile_user_regex",
]

# RE2 options: refuse rather than print parse errors to stderr; cap the compiled program.
RE2_OPTIONS = re2.Options()
RE2_OPTIONS.log_errors = False
RE2_OPTIONS.max_mem = 8 << 20
# RE2 matches in linear time, but the factor is the program's size: `(\w+\s?){1,1000}zz` compiles
# to 11,005 instructions and scanned a megabyte in ~40 s. 2,000 keeps every accepted regex
# within milliseconds on the text a pattern reads (see scoring.members.patterns.MAX_TEXT_CHARS); the
# built-in templates are under 250.
MAX_REGEX_PROGRAM_SIZE = 2_000


def compile_user_regex(pattern: str) -> re2._Regexp:
    """Compile a user's regex with RE2 (linear-time matching), or raise ValueError saying why.

    RE2 has no backreferences or lookaround; those are refused here, at save time, instead of
    being run by a backtracking engine that a hostile pattern can stall for minutes.
    """
    try:
        compiled = re2.compile(pattern, options=RE2_OPTIONS)
    except re2.error as exc:
        why = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(
            f"regex is not supported by the linear-time engine (RE2): {why}; "
            "backreferences and lookaround are not available"
        ) from None
    if compiled.programsize > MAX_REGEX_PROGRAM_SIZE:
        raise ValueError(
            f"regex is too complex: its RE2 program has {compiled.programsize} instructions, over the "
            f"limit of {MAX_REGEX_PROGRAM_SIZE}; use smaller repetition counts (e.g. {{1,50}} rather "
            "than {1,1000}) or split it into several patterns"
        )
    return compiled


class Pattern(wire.Pattern):
    """The SDK's pattern, whose ``regex`` must also compile in RE2 within the program size."""

    @field_validator("regex")
    @classmethod
    def _regex_runs_in_linear_time(cls, value: str | None) -> str | None:
        if value is not None:
            compile_user_regex(value)
        return value


class CatalogDocument(wire.CatalogDocument):
    """The file ``scorer-worker catalog apply`` takes, with the server's patterns."""

    patterns: list[Pattern] = Field(default_factory=list)  # type: ignore[assignment]


Scorer = Judge | Pattern | CustomEvaluator
