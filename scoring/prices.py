"""What a judge call costs in money: the operators' price table per judge model
(``SGW_JUDGE_PRICES``, per million tokens, in ``SGW_CURRENCY``) applied to the tokens the judge's
API reported.

A call's cost is unknown (None, shown as null) - never 0 - when its model has no price or its API
did not report both token counts: an unpriced model must not look free. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from scoring.models import Judge
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


# --- Money budgets -------------------------------------------------------------------------------
# Redis counts money as whole nanos of the currency (integers: INCRBY, exact in Lua's doubles up
# to 2**53), and a reservation's cost is integer arithmetic on its calls and token ceiling, so the
# claim's script and Python compute the same figure (``ClaimRequest.cost``).
NANOS = 1_000_000_000
NANOS_PER_TOKEN_PER_PRICE = NANOS // PER  # a price per million tokens, as nanos per token
# What a token of an unpriced model costs under a money cap: more than any cap (MAX_BUDGET_COST,
# 10**15 nanos), so its calls are refused - a cap cannot bound what it cannot price (fail closed).
UNPRICEABLE_NANOS = 10**16


def nanos(cost: float) -> int:
    """An amount of the currency as whole nanos (rounded up: never less than it cost)."""
    return math.ceil(cost * NANOS - 1e-6)


@dataclass(frozen=True, slots=True)
class Rates:
    """What a reservation of judge calls costs, as a ceiling: ``per_token`` nanos for each token of
    the calls' token ceiling (``judge_prompt.token_ceiling``: its prompt part and its answer's
    max tokens) at the input price, plus ``per_call`` for the answer's tokens at the output
    price's excess. Of several judge models, the dearest of each."""

    per_token: int = 0
    per_call: int = 0

    def cost(self, calls: int, tokens: int) -> int:
        return tokens * self.per_token + calls * self.per_call


UNPRICED_RATES = Rates(UNPRICEABLE_NANOS, UNPRICEABLE_NANOS)  # refused by calls or tokens alike
NO_RATES = Rates()  # without a money cap: nothing to count (one instance, not one per pair)


@dataclass(frozen=True)
class Pricing:
    """The price table and the model a judge without one calls (``SGW_JUDGE_MODEL``)."""

    prices: Mapping[str, Price] = field(default_factory=dict)
    default_model: str = ""

    def model_of(self, judge: Judge) -> str:
        return judge.model or self.default_model

    def rates(self, judges: Iterable[Judge], answer_tokens: int) -> Rates:
        """The dearest rates of ``judges``' models; ``UNPRICED_RATES`` if one has no price."""
        per_token = per_call = 0
        for judge in judges:
            price = self.prices.get(self.model_of(judge))
            if price is None:
                return UNPRICED_RATES
            token = math.ceil(price.input * NANOS_PER_TOKEN_PER_PRICE)
            # The answer's tokens are in the ceiling at the input price already: the rest of
            # the output price, per call.
            extra = math.ceil(max(0.0, price.output - price.input) * NANOS_PER_TOKEN_PER_PRICE) * answer_tokens
            per_token, per_call = max(per_token, token), max(per_call, extra)
        return Rates(per_token, per_call)


NO_PRICING = Pricing()
