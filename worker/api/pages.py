"""Pagination of lists: ``?limit=&cursor=``, answered with ``items`` and ``nextCursor`` (null on
the last page). Lists are ordered by id, and the cursor is the last id of the page before, so a
page never repeats or skips a document that existed throughout the walk."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Annotated, TypeVar

from fastapi import Query
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

T = TypeVar("T")



def ascii_digits(value: object) -> object:
    """A number in a path or query is ASCII digits only: Python's int() and str.isdigit() also
    take '²', '١٢' or ' 1_0', which no client of ours sends and no cursor of ours is."""
    if isinstance(value, str) and not DIGITS.fullmatch(value):
        raise ValueError("must be a whole number written in ASCII digits (0-9)")
    return value


DIGITS = re.compile(r"[0-9]{1,20}")
Number = BeforeValidator(ascii_digits)  # put on every int a path or query takes
Limit = Annotated[int, Query(ge=1, le=200, description="Items per page."), Number]
Cursor = Annotated[str | None, Query(max_length=512, description="nextCursor of the page before.")]
# At most 18 digits: an offset Redis takes (a signed 64-bit integer), whatever the digits.
OffsetCursor = Annotated[str | None, Query(max_length=18, pattern="^[0-9]+$", description="nextCursor of the page "
                                                                                      "before."), Number]


class Page(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    next_cursor: str | None = Field(None, description="Pass as cursor for the next page; null on the last.")


def page(items: Sequence[T], key: Callable[[T], str], limit: int, cursor: str | None) -> tuple[list[T], str | None]:
    ordered = sorted(items, key=key)
    if cursor is not None:
        ordered = [item for item in ordered if key(item) > cursor]
    chunk = ordered[:limit]
    return chunk, (key(chunk[-1]) if len(ordered) > limit else None)
