"""One root for the service's errors, and the flags callers branch on instead of messages."""

from __future__ import annotations

import pytest

from adapters.egress import EgressRefused
from consumers.outage import OutageTooLong
from consumers.traces import OutputError
from scoring.errors import Conflict, Forbidden, InvalidDocument, NotFound, PreconditionFailed, ScoringError
from scoring.otlp.mapping import OtlpError
from scoring.ports import CodeScorerError, MemberError


@pytest.mark.parametrize(("error", "status"), [
    (InvalidDocument("x"), 400), (Forbidden("x"), 403), (NotFound("x"), 404), (Conflict("x"), 409),
    (PreconditionFailed("x"), 412), (MemberError("x"), 500), (CodeScorerError("x"), 500),
    (OtlpError("not_otlp", "x"), 500), (EgressRefused("x"), 500),
    (OutputError("x"), 500), (OutageTooLong("x"), 500),
])
def test_every_error_the_service_raises_is_a_scoring_error_with_a_status(error: ScoringError, status: int) -> None:
    assert isinstance(error, ScoringError)
    assert error.status == status


def test_the_flags_say_what_to_do() -> None:
    assert MemberError("HTTP 503", retriable=True).retriable and not MemberError("bad answer").retriable
    assert CodeScorerError("pool closed", retriable=True).retriable and not CodeScorerError("ZeroDivisionError").retriable
    assert EgressRefused("no address", retriable=True).retriable and not NotFound("x").retriable
    assert isinstance(OtlpError("not_otlp", "x"), ValueError)  # still a ValueError for its callers
