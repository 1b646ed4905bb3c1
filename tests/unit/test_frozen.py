"""``frozen``: frozen for the type checker, the same equality and hash as a frozen dataclass."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

from mypy import api as mypy_api

from scoring.frozen import frozen


@frozen
class Claim:
    project: str
    calls: int
    day: int = dataclasses.field(kw_only=True)


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenClaim:
    project: str
    calls: int
    day: int = dataclasses.field(kw_only=True)


def test_a_frozen_class_equals_and_hashes_as_the_frozen_dataclass_it_stands_for() -> None:
    a, b, c = Claim("p", 1, day=3), Claim("p", 1, day=3), Claim("p", 2, day=3)
    assert a == b and a != c and hash(a) == hash(b)
    assert len({a, b, c}) == 2, "usable in sets and as keys, as the claims are"
    twin = FrozenClaim("p", 1, day=3)
    assert hash(a) == hash(twin), "the same fields hash the same"
    assert [f.name for f in dataclasses.fields(Claim)] == [f.name for f in dataclasses.fields(FrozenClaim)]
    assert dataclasses.replace(a, calls=5) == Claim("p", 5, day=3)
    assert not hasattr(a, "__dict__"), "slotted: no attribute can be added"


def test_the_type_checker_refuses_any_assignment_to_a_frozen_objects_field(tmp_path: Path) -> None:
    program = tmp_path / "assigns.py"
    program.write_text(textwrap.dedent("""
        from scoring.frozen import frozen

        @frozen
        class Point:
            x: int

        p = Point(1)
        p.x = 2
    """))
    out, _, status = mypy_api.run([str(program), "--no-incremental", "--follow-imports=silent"])
    assert status == 1 and 'Property "x" defined in "Point" is read-only' in out, out
