"""A catalog change applied as a delta (``CatalogSnapshot.changed``) gives the same snapshot as
the catalog read whole: the same documents and the same hot-path index (live groups by project
and scope, in order; filters; channels by agent; groups by project; document counts; revisions;
the review queues naming each group)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scorer_groups.review_queues import ReviewQueue
from scoring.catalog import KIND_MODELS, CatalogSnapshot, doc_id, kind_of
from scoring.catalog_index import CatalogIndex
from scoring.filters import TraceView
from scoring.models import AlertChannel, Judge, Pattern, ScorerGroup, WireModel
from scoring.subjects import Trace

PROJECTS = ("p1", "p2", "p3")
SCOPES = ("trace", "session", "span")


def judge(i: int, project: str | None, criteria: str) -> Judge:
    return Judge.model_validate({"id": f"j{i}", "name": f"J{i}", "criteria": criteria, "projectId": project})


def pattern(i: int, project: str | None) -> Pattern:
    return Pattern.model_validate({"id": f"k{i}", "name": f"K{i}", "polarity": "failure", "contains": ["x"],
                                   "projectId": project})


def group(i: int, project: str, enabled: bool, scope: str, filtered: bool, judge_ref: int) -> ScorerGroup:
    online: dict[str, Any] = {"enabled": enabled, "sampleRate": 1.0, "scope": scope, "alertThreshold": 6,
                              "severity": "low"}
    if filtered:
        online["filter"] = {"field": "root.output", "op": "matches", "value": "refund"}
    if scope == "span":
        online["spanFilter"] = {"field": "name", "op": "eq", "value": "llm"}
    return ScorerGroup.model_validate({"id": f"g{i}", "name": f"G{i}", "projectId": project, "online": online,
                                       "members": [{"kind": "judge", "refId": f"j{judge_ref}", "weight": 1}]})


def channel(i: int, project: str | None) -> AlertChannel:
    return AlertChannel.model_validate({"agentId": f"agent-{i % 2}", "url": f"http://127.0.0.1:9/{i}",
                                        "projectId": project})


def queue(i: int, project: str, group_refs: list[int]) -> ReviewQueue:
    return ReviewQueue.model_validate({"id": f"q{i}", "name": f"Q{i}", "projectId": project,
                                       "groupIds": [f"g{g}" for g in group_refs], "rule": {"below": True}})


projects = st.sampled_from(PROJECTS)
documents = st.one_of(
    st.builds(group, st.integers(0, 7), projects, st.booleans(), st.sampled_from(SCOPES), st.booleans(),
              st.integers(0, 3)),
    st.builds(judge, st.integers(0, 3), st.one_of(st.none(), projects), st.sampled_from(["A?", "B?"])),
    st.builds(pattern, st.integers(0, 3), st.one_of(st.none(), projects)),
    st.builds(channel, st.integers(0, 3), st.one_of(st.none(), projects)),
    st.builds(queue, st.integers(0, 3), projects, st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True)),
)
deletes = st.tuples(st.sampled_from(["groups", "judges", "patterns", "channels", "queues"]), st.integers(0, 7))
changes = st.lists(st.lists(st.one_of(documents, deletes), min_size=1, max_size=4), min_size=1, max_size=12)


def views() -> list[TraceView]:
    """Two traces a filter of this test tells apart (fresh views: each has its own matching time)."""
    return [TraceView(Trace.model_validate({"traceId": "t", "projectId": "p1", "agentId": "a",
                                            "timestamp": "2026-12-06T00:00:00Z",
                                            "spans": [{"spanId": "r", "output": output}]}))
            for output in ("a refund, please", "thanks")]


def key_of(doc: WireModel) -> tuple[str, str]:
    return kind_of(doc), doc_id(doc)


def comparable(index: CatalogIndex) -> dict[str, Any]:
    return {"live": index.live, "any": index.live_any_scope, "filters": set(index.filters),
            "span_filters": set(index.span_filters), "channels": index.channels_by_agent, "owners": index.channels_by_owner,
            "by_project": index.groups_by_project, "counts": +index.counts, "queues": index.queues_by_group}


@settings(max_examples=150, deadline=None)
@given(changes)
def test_a_delta_gives_the_snapshot_a_whole_read_gives(steps: list[list[Any]]) -> None:
    delta = CatalogSnapshot(version=0)
    for version, step in enumerate(steps, start=1):
        change: dict[tuple[str, str], WireModel | None] = {}
        for item in step:
            if isinstance(item, tuple):
                kind, i = item
                stored = list(getattr(delta, kind))
                if stored:
                    change[(kind, stored[i % len(stored)])] = None
            else:
                change[key_of(item)] = item
        # Revisions asked before the change must not survive it where they change.
        for g in delta.groups.values():
            delta.revision(g)
        delta = delta.changed(change, version)
        maps: dict[str, Any] = {kind: dict(getattr(delta, kind)) for kind in KIND_MODELS}
        whole = CatalogSnapshot(version, **maps)
        assert comparable(delta.index) == comparable(whole.index)
        for group_id, decide in delta.index.filters.items():  # a filter carried over decides as one compiled anew
            assert [decide(v) for v in views()] == [whole.index.filters[group_id](v) for v in views()], group_id
        for g in delta.groups.values():
            assert delta.revision(g) == whole.revision(g), g.id
        for project in PROJECTS:
            assert delta.project_groups(project) == whole.project_groups(project)


def test_a_changed_shared_judge_is_a_new_revision_of_every_group_that_holds_it() -> None:
    """Literal: a judge of no project (the operators') changed; a group of p1 holds it."""
    before = CatalogSnapshot(1, judges={"j0": judge(0, None, "A?")},
                             groups={"g0": group(0, "p1", True, "trace", False, 0)})
    first = before.revision(before.groups["g0"])
    after = before.changed({("judges", "j0"): judge(0, None, "B?")}, 2)
    assert after.revision(after.groups["g0"]) != first
    assert after.changed({("judges", "j0"): judge(0, None, "A?")}, 3).revision(before.groups["g0"]) == first


def test_a_delta_shares_what_it_did_not_change() -> None:
    """The cost of a change is its documents': an untouched group's compiled filter is the same
    object, not compiled again."""
    base = CatalogSnapshot(1, judges={"j0": judge(0, "p1", "A?")},
                           groups={f"g{i}": group(i, "p1", True, "trace", True, 0) for i in range(3)})
    after = base.changed({("groups", "g1"): group(1, "p1", False, "trace", True, 0)}, 2)
    assert after.index.filters["g0"] is base.index.filters["g0"]
    assert after.index.filters["g1"] is not base.index.filters["g1"]
    assert [g.id for g in after.live_groups("p1", "trace")] == ["g0", "g2"]
    assert after.count("groups", "p1") == 3 and base.live_groups("p1", "trace")[1].id == "g1"
