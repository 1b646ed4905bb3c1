"""The spec's SDK snippets, character for character (tests/integration/test_sdk.py checks that
the spec still has them), run by the SDK's tests in the test process and in a virtualenv that
holds the SDK alone."""

from __future__ import annotations

from pathlib import Path

SPEC = Path(__file__).resolve().parents[3] / "shared" / "spec" / "scorer-groups.md"

# The spec's snippets, character for character (test_snippets_are_the_specs checks it).
CREATE_SNIPPET = '''group = client.monitor.scorer_groups.create(
    "Release quality bar",
    members=[
        {"kind": "judge",   "refId": quality.id, "weight": 1, "gate": False},
        {"kind": "judge",   "refId": safety.id,  "weight": 1, "gate": True},   # must pass
        {"kind": "pattern", "refId": pii.id,     "weight": 0, "gate": True},   # gate only
    ],
)
'''
TRACE_SNIPPET = '''client.monitor.scorer_groups.update(group.id, online={
    "enabled": True,
    "sampleRate": 0.2,        # 20% of traffic
    "alertThreshold": 6,      # Signal when the GROUP score lands below 6/10
    "severity": "high",       # omitted keys keep their stored value - send "scope": "trace" to flip a session group back
})

client.monitor.scorer_groups.ratings(group.id, window="7d")  # score history for the chart
'''
SESSION_SNIPPET = '''client.monitor.scorer_groups.update(group.id, online={
    "enabled": True,
    "sampleRate": 1.0,        # of eligible idle sessions
    "scope": "session",
    "idleSeconds": 120,       # judge once quiet for 2 minutes
    "alertThreshold": 6,      # Signal when the conversation's GROUP score lands below 6/10
    "severity": "high",
})
'''
SCORES_SNIPPET = '''client.monitor.sessions.scores(session_id)
# -> [{"kind": "scorer-group:<groupId>", "rating": 4.5, "justification": "Weighted blend: ..."}, ...]
'''
# The spec's "Grading a dataset run with a group" block, character for character.
RUN_SNIPPET = '''group = client.monitor.scorer_groups.create(
    "Release quality bar",
    members=[
        {"kind": "judge",   "refId": quality.id, "weight": 1, "gate": False},
        {"kind": "judge",   "refId": safety.id,  "weight": 1, "gate": True},   # must pass
        {"kind": "pattern", "refId": pii.id,     "weight": 0, "gate": True},   # gate only
    ],
)

run = client.evaluations.run(
    dataset_id=dataset.id,
    subject={"kind": "custom_agent", "displayName": "my-agent"},
    scorer_group_id=group.id,
).execute(my_agent).finalize()

run.gate(fail_under=7)                    # gates on the GROUP score, like any rating
run.gate(fail_under=8, scorer="Safety")   # or gate a named JUDGE member's own average
'''
