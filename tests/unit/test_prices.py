"""Money (first step): the price table is refused by name when it is wrong (never
echoing it), a call's cost is exact from its tokens, and a model without a price - or a call
whose API left out a count - costs an unknown amount, never 0."""

from __future__ import annotations

import pytest

from scoring.ports import TokenUsage
from scoring.prices import Price, call_cost, parse_prices, priced
from worker.settings import Settings

TABLE = '{"gpt-4o-mini": {"input": 0.15, "output": 0.6}, "judge-x": {"input": 3, "output": 15}}'


def test_a_calls_cost_is_its_tokens_at_its_models_price() -> None:
    prices = parse_prices(TABLE)
    assert prices["judge-x"] == Price(input=3, output=15)
    assert call_cost(prices, "gpt-4o-mini", TokenUsage(1_000, 200)) == pytest.approx((1_000 * 0.15 + 200 * 0.6) / 1e6)
    assert call_cost(prices, "judge-x", TokenUsage(2_000_000, 1_000_000)) == pytest.approx(21.0)
    assert priced(prices, "judge-x", TokenUsage(10, 0)) == TokenUsage(10, 0, pytest.approx(30 / 1e6))
    assert call_cost(prices, "judge-x", TokenUsage(0, 0)) == 0.0, "a call of no tokens costs nothing, known"


def test_an_unpriced_model_or_an_unreported_count_is_unknown_never_free() -> None:
    prices = parse_prices(TABLE)
    assert call_cost(prices, "gpt-5", TokenUsage(1_000, 200)) is None
    assert call_cost(prices, "judge-x", TokenUsage(1_000, None)) is None
    assert call_cost(prices, "judge-x", None) is None
    assert priced(prices, "gpt-5", TokenUsage(5, 6)) == TokenUsage(5, 6, None)
    assert priced(prices, "judge-x", None) is None
    assert call_cost({}, "judge-x", TokenUsage(1, 1)) is None, "no table: every cost unknown"


@pytest.mark.parametrize(("text", "says"), [
    ('{"m": {"input": -1, "output": 1}}', "m.input"),
    ('{"m": {"input": 1}}', "m.output"),
    ('{"m": {"input": 1, "output": 1, "cached": 2}}', "m.cached"),
    ('{"m": {"input": "NaN", "output": 1}}', "m.input"),
    ('["sk-secret-1234"]', "the table"),
    ('not json sk-secret-1234', "the table"),
    ('{"": {"input": 1, "output": 1}}', "model name"),
])
def test_a_wrong_table_is_refused_naming_the_setting_and_the_model_never_the_value(text: str, says: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_prices(text)
    assert str(refused.value).startswith("SGW_JUDGE_PRICES: ") and says in str(refused.value)
    assert "sk-secret" not in str(refused.value)
    with pytest.raises(ValueError) as at_start:
        Settings(judge_prices=text)
    assert "SGW_JUDGE_PRICES" in str(at_start.value) and "sk-secret" not in str(at_start.value)


def test_the_settings_carry_the_table_and_a_currency_code() -> None:
    settings = Settings(judge_prices=TABLE, currency="EUR")
    assert settings.prices()["gpt-4o-mini"] == Price(input=0.15, output=0.6) and settings.currency == "EUR"
    assert Settings().prices() == {} and Settings().currency == "USD"
    with pytest.raises(ValueError, match="currency"):
        Settings(currency="euro")


async def test_a_judge_members_usage_and_call_record_carry_the_exact_cost_and_null_when_unpriced() -> None:
    from adapters.members.http import RetryPolicy
    from adapters.members.judge import JudgeClient
    from devtools.judge_server import JudgeServer
    from scoring.judge_calls import call_document
    from scoring.models import Judge
    from scoring.panel import Panel
    from scoring.results import build_rating
    from tests.support.panel_catalog import catalog, group, subject

    with JudgeServer() as server:
        judges = JudgeClient(server.base_url, model="judge-x", policy=RetryPolicy(attempts=1),
                             prices=parse_prices(TABLE))
        try:
            snapshot = catalog("http://127.0.0.1:9")
            result = await Panel(judges=judges).score(group(("judge", "quality", 1, False)),
                                                      subject("Fine. [[rating=7]]"), snapshot)
            (member,) = [m.outcome for m in result.blend.members]
            usage = member.usage
            assert usage is not None and usage.prompt_tokens and usage.completion_tokens  # word counts
            assert usage.cost == pytest.approx((usage.prompt_tokens * 3 + usage.completion_tokens * 15) / 1e6)
            rating = build_rating(result, "trace")
            assert rating.members[0].usage is not None and rating.members[0].usage.cost == pytest.approx(usage.cost)
            (call,) = member.calls
            assert call_document(call, "quality", "Quality")["usage"]["cost"] == pytest.approx(usage.cost)

            unpriced = snapshot.with_docs([Judge(id="quality", name="Quality", criteria="Helpful?", model="gpt-5")])
            result = await Panel(judges=judges).score(group(("judge", "quality", 1, False)),
                                                      subject("Fine. [[rating=7]]"), unpriced)
            document = build_rating(result, "trace").model_dump(by_alias=True)
            assert document["members"][0]["usage"]["cost"] is None, "an unpriced model: unknown, not 0"
            assert document["members"][0]["usage"]["promptTokens"], "its tokens still counted"
        finally:
            await judges.close()
