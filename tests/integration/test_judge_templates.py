"""Rubric templates: listed with what they read and their labelled rows; a judge created from one
(fields given overriding it) works - the local judge receives the template's rubric, and the
faithfulness judge the trace's retrieved context; an unknown template is refused by name; every
template's examples are dataset rows with a human verdict."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from devtools.judge_server import JudgeServer
from scorer_groups import AgentAnswer, BadRequest, Client
from scorer_groups.runs import DatasetItem
from scoring.dataset import DatasetRow
from scoring.judge_templates import TEMPLATES
from tests.support.api_process import api_with_judge
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def api_address(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, JudgeServer]]:
    with api_with_judge(redis_databases, tmp_path_factory.mktemp("api"), "p-templates") as (process, key, judge):
        yield process.url, key, judge


def test_the_templates_are_listed_with_what_they_read_and_their_labelled_rows(api_address: tuple[str, str, JudgeServer]) -> None:
    with Client(api_address[0], api_address[1]) as client:
        listed = client.monitor.judge_templates()
    assert [t.name for t in listed] == ["helpfulness", "faithfulness", "answer-relevance", "instruction-following",
                                        "toxicity", "refusal-correctness"]
    assert all(t.reads and t.criteria and "Use the whole scale" in t.judge_prompt for t in listed)
    assert {t.name: t.context for t in listed}["faithfulness"] == "retrieval"


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: t.name)
def test_every_templates_examples_are_labelled_dataset_rows(template: object) -> None:
    examples = template.examples  # type: ignore[attr-defined]
    assert len(examples) >= 5
    labels = set()
    for index, example in enumerate(examples):
        row = DatasetRow.from_json(example, index)  # what scorer-worker grade reads
        DatasetItem.model_validate({k: v for k, v in example.items() if k in ("input", "humanRating", "humanPass")})
        assert row.human is not None and row.human.rating is not None
        labels.add(row.human.passes(5))
    assert labels == {True, False}, "people passed some and failed some: the set can separate them"


def test_a_judge_from_a_template_works_with_the_fields_given_overriding_it(api_address: tuple[str, str, JudgeServer]) -> None:
    url, key, judge = api_address
    with Client(url, key) as client:
        faithful = client.monitor.judges.create(template="faithfulness", model="grounding-model")
        assert (faithful.name, faithful.context, faithful.model) == ("Faithfulness to retrieved context",
                                                                     "retrieval", "grounding-model")
        renamed = client.monitor.judges.create(template="helpfulness", name="Support helpfulness",
                                               criteria="Helps a support customer.")
        assert (renamed.name, renamed.criteria) == ("Support helpfulness", "Helps a support customer.")
        assert "Use the whole scale" in (renamed.judge_prompt or ""), "what was not given is the template's"
        group = client.monitor.scorer_groups.create(
            "Grounded", members=[{"kind": "judge", "refId": faithful.id, "weight": 1}])
        spans = [{"spanId": "root", "name": "agent.run"},
                 {"spanId": "s1", "parentSpanId": "root", "name": "kb.search", "kind": "retriever",
                  "output": "Order 1182 shipped 2026-03-03 by DHL."}]
        verdict = client.monitor.scorer_groups.grade(group.id, input="When did it ship?",
                                                     output="March 3, by DHL. [[rating=9]]", spans=spans)
        assert verdict.rating == 9.0
        question = verdict.calls[0].messages[1].content
        assert faithful.criteria in question and "Order 1182 shipped 2026-03-03 by DHL." in question
        assert question.index("Retrieved context") < question.index("Response:"), "the context, then the answer"
        sent = [r for r in judge.requests if r["model"] == "grounding-model"]
        assert sent and sent[-1]["messages"][1]["content"] == question, "what the judge received"
        with pytest.raises(BadRequest) as refused:
            client.monitor.judges.create(template="politeness")
        assert refused.value.fields == ["template"] and "helpfulness" in str(refused.value)
    answer = httpx.post(f"{url}/v1/judges", headers={"Authorization": f"Bearer {key}"}, json={"name": "No rubric"})
    assert answer.status_code == 400 and "criteria" in answer.text


def test_a_templates_examples_graded_in_a_dataset_run_with_the_agents_spans(api_address: tuple[str, str, JudgeServer]) -> None:
    # The loop a team runs before trusting a template: its judge, its labelled rows as a dataset,
    # the agent answering with the spans of its run (AgentAnswer) - the faithfulness judge reads
    # their retrieved context - and the run's agreement with people.
    url, key, judge = api_address
    template = next(t for t in TEMPLATES if t.name == "faithfulness")
    # Two examples may share an input (a faithful and an unfaithful answer to one question): the
    # agent, called on the rows in order (concurrency=1), answers each input's examples in turn.
    answers: dict[str, list[dict[str, Any]]] = {}
    for e in template.examples:
        answers.setdefault(str(e["input"]), []).append(e)
    rows = [{k: v for k, v in e.items() if k in ("input", "humanRating", "humanPass")} for e in template.examples]

    def agent(question: str) -> AgentAnswer:
        example = answers[question].pop(0)
        # The local judge rates as told; here as the people did, so the agreement is exact.
        return AgentAnswer(output=f"{example['output']} [[rating@faithful-run={example['humanRating']}]]",
                           spans=example["spans"])

    with Client(url, key) as client:
        faithful = client.monitor.judges.create(template="faithfulness", model="faithful-run")
        dataset = client.datasets.create("Faithfulness examples", rows=rows)
        run = client.evaluations.run(dataset_id=dataset.id, subject={"kind": "custom_agent", "displayName": "examples"},
                                     scorer_id=faithful.id).execute(agent, concurrency=1).finalize()
    questions = [r["messages"][1]["content"] for r in judge.requests if r["model"] == "faithful-run"]
    assert len(questions) == len(rows)
    for example in template.examples:
        retrieved = str(example["spans"][1]["output"])  # type: ignore[index]
        assert any(retrieved in q and str(example["input"]) in q for q in questions), retrieved
    agreement = run.agreement
    assert agreement is not None and agreement.labelled_rows == len(rows)
    assert agreement.group.mean_absolute_error == 0 and agreement.group.spearman == pytest.approx(1.0)


def test_a_rows_spans_are_bounded_and_refused_by_name(api_address: tuple[str, str, JudgeServer]) -> None:
    url, key, _ = api_address
    headers = {"Authorization": f"Bearer {key}"}
    with Client(url, key) as client:
        judge = client.monitor.judges.create(template="helpfulness")
        dataset = client.datasets.create("One row", rows=[{"input": "Hi"}])
        run = client.evaluations.run(dataset_id=dataset.id, subject={"kind": "custom_agent", "displayName": "big"},
                                     scorer_id=judge.id)
    spans = [{"spanId": f"s{i}", "name": "x", "output": "y" * 4000} for i in range(300)]  # 1.2 MB of JSON
    answer = httpx.post(f"{url}/v1/evaluations/{run.id}/finalize", headers=headers, timeout=30,
                        json={"outputs": [{"row": 0, "output": "Hello", "spans": spans}]})
    assert answer.status_code == 400 and "outputs[0].spans" in answer.text and "at most 1048576" in answer.text, answer.text
