"""A group starved of budget is counted on every skip but logged once a minute at most, the next
line saying how many skips it did not log (a starved group at 1,000 traces/s is not 1,000 lines)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from consumers import traffic_counts
from consumers.outage import OutageGuard
from consumers.outputs import LIVE
from consumers.pair_protocol import PairProtocol
from scoring.claim_request import ClaimRequest
from scoring.routing import Pair
from scoring.subjects import Subject


class Skips:
    def __init__(self) -> None:
        self.skipped: list[tuple[str, str, str]] = []

    def group_skipped(self, project: str, group: str, why: str, count: int = 1) -> None:
        self.skipped.append((project, group, why))


def pair(group_id: str, trace_id: str) -> Any:
    class Group:
        id = group_id

    subject = Subject(scope="trace", input="q", output="a", expected=None, spans=(), metadata={}, transcript="",
                      project_id="p", trace_id=trace_id)
    return Pair(Group, subject, ClaimRequest("p", group_id, f"trace:{trace_id}", 1, 0, day=1))  # type: ignore[arg-type]


def test_a_starved_group_is_counted_every_time_and_logged_once_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(traffic_counts.time, "monotonic", lambda: clock[0])
    events = Skips()
    live = SimpleNamespace(policy=LIVE)  # what the protocol reads of its outputs here
    protocol = PairProtocol(claims=None, outputs=live, ratings=None, panel=None,  # type: ignore[arg-type]
                            outages=OutageGuard(tolerance_s=1), events=events)  # type: ignore[arg-type]
    with capture_logs() as logs:
        for n in range(5):
            protocol.counts.skipped_for_budget(pair("g", f"t-{n}"), used="10")
        protocol.counts.skipped_for_budget(pair("other", "t-9"), used="10")  # another group has its own minute
        clock[0] += traffic_counts.BUDGET_LOG_EVERY_S
        protocol.counts.skipped_for_budget(pair("g", "t-5"), used="10")
    assert len(events.skipped) == 7 and protocol.counts.starved == {"g": 6, "other": 1}, "every skip counted"
    lines = [(e["group"], e["trace"], e.get("skipped_since_last_line")) for e in logs
             if e["event"] == "judge budget exhausted; group skipped"]
    assert lines == [("g", "t-0", None), ("other", "t-9", None), ("g", "t-5", 4)]
