"""What a judge call costs in money (issue 58): the operators' price table per judge model
(``SGW_JUDGE_PRICES``, per million tokens, in ``SGW_CURRENCY``) applied to the tokens the judge's
API reported.

A call's cost is unknown (None, shown as null) - never 0 - when its model has no price or its API
did not report both token counts: an unpriced model must not look free. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from scoring.ports import TokenUsage

PER = 1_000_000  # prices are per million tokens, as providers list them


class Price(BaseModel):
    """A model's price per million input (prompt) and output (completion) tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(ge=0, allow_inf_nan=False)
    output: float = Field(ge=0, allow_inf_nan=False)


_TABLE = TypeAdapter(dict[str, Price])


def parse_prices(text: str, setting: str = "SGW_JUDGE_PRICES") -> dict[str, Price]:
    """The table from its JSON (``{"<model>": {"input": .., "output": ..}}``); a ValueError that
    names ``setting`` and the model at fault, never echoing the value."""
    if not text.strip():
        return {}
    try:
        table = _TABLE.validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{setting}: {where or 'the table'}: {first['msg']} (a JSON object of model -> "
                         '{"input": <price per million tokens>, "output": <price per million tokens>})') from None
    for model in table:
        if not model.strip() or len(model) > 200:
            raise ValueError(f"{setting}: a model name must be 1-200 characters")
    return table


def call_cost(prices: Mapping[str, Price], model: str, usage: TokenUsage | None) -> float | None:
    """What one call cost, or None when it is unknown (no price for ``model``, or a token count
    its API did not report)."""
    price = prices.get(model)
    if price is None or usage is None or usage.prompt_tokens is None or usage.completion_tokens is None:
        return None
    cost = (usage.prompt_tokens * price.input + usage.completion_tokens * price.output) / PER
    return cost if math.isfinite(cost) else None


def priced(prices: Mapping[str, Price], model: str, usage: TokenUsage | None) -> TokenUsage | None:
    """``usage`` with its cost (unknown stays None)."""
    if usage is None:
        return None
    return TokenUsage(usage.prompt_tokens, usage.completion_tokens, call_cost(prices, model, usage))
