"""The base of every wire model: camelCase on the wire, strict, immutable, secrets masked when
shown. ``scorer_groups.models`` (the catalog documents) and ``scorer_groups.filters`` (the
online profile's filter) both build on it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

REVEAL_SECRETS = "reveal_secrets"  # the serialization context key that shows secrets (the store's only)


class WireModel(BaseModel):
    """camelCase on the wire, unknown fields refused, values immutable once validated."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=True,
        allow_inf_nan=False,
    )

    def wire(self) -> dict[str, object]:
        """The JSON-ready document, camelCase, secrets masked: what people and logs may see."""
        return self.model_dump(mode="json", by_alias=True)

    def stored(self) -> dict[str, object]:
        """The JSON-ready document with secrets revealed: only for the catalog store."""
        return self.model_dump(mode="json", by_alias=True, context={REVEAL_SECRETS: True})
