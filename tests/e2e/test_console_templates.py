"""The console's Judge templates page in Debian's headless chromium, against a real API process,
Redis and the local judge (``devtools.judge_server``, kept here to read what the judge was sent):
the six shipped templates are listed with what their judge reads and their labelled examples;
"Check against people" on the faithfulness template grades its examples with a judge made from
it - the local judge receives each example's retrieved context (the rows' spans) - and opens the
run's page with its agreement with people; a second check reuses that judge, and a failed
one says why and lets the button be clicked again.
``SGW_CONSOLE_TEMPLATES_SCREENSHOT=<path>`` saves the templates page."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from devtools.judge_server import JudgeServer
from scoring.judge_templates import BY_NAME, TEMPLATES
from tests.support.api_process import ApiProcess, api_with_judge
from tests.support.console_browser import XSS, sign_in_at, wait_for
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

# The console tests' browser; the API is this module's own, with its judge in reach.

By = pytest.importorskip("selenium.webdriver.common.by").By

FAITHFULNESS = BY_NAME["faithfulness"]


class Api:
    def __init__(self, process: ApiProcess, key: str, judge: JudgeServer) -> None:
        self.process, self.key, self.judge = process, key, judge

    def get(self, path: str) -> Any:
        with self.process.client(self.key) as http:
            answer = http.get(path)
            assert answer.status_code == 200, answer.text
            return answer.json()


@pytest.fixture(scope="module")
def console(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    with api_with_judge(redis_databases, tmp_path_factory.mktemp("api"), "p-console-templates",
                        env={"SGW_JUDGE_TIMEOUT_S": "5"}) as (process, key, judge):
        yield Api(process, key, judge)


def open_templates(browser: Any, api: Api) -> list[Any]:
    """Signs in (the tab's sessionStorage holds the key) and opens the page from the nav: its rows."""
    sign_in_at(browser, api.process.url, api.key)
    browser.find_element(By.CSS_SELECTOR, "#nav a[href='#/templates']").click()
    return wait_for(browser, "#templates tbody tr[data-template]", len(TEMPLATES))


def check_faithfulness(browser: Any, api: Api) -> str:
    """Clicks Check against people on the faithfulness template; the id of the run it opens."""
    row = next(r for r in open_templates(browser, api) if r.get_attribute("data-template") == "faithfulness")
    row.find_element(By.CSS_SELECTOR, "button[data-check='faithfulness']").click()
    header = wait_for(browser, "#run-header[data-run]")[0]
    wait_for(browser, "#agreement")
    run_id = str(header.get_attribute("data-run"))
    assert browser.current_url.endswith(f"#/runs/{run_id}")
    return run_id


def faithfulness_judges(api: Api) -> list[dict[str, Any]]:
    return [j for j in api.get("/v1/judges?limit=200")["items"] if j["name"] == FAITHFULNESS.title]


def test_the_templates_are_listed_with_what_they_read_and_their_examples(browser: Any, console: Api) -> None:
    rows = open_templates(browser, console)
    if os.environ.get("SGW_CONSOLE_TEMPLATES_SCREENSHOT"):
        browser.save_screenshot(os.environ["SGW_CONSOLE_TEMPLATES_SCREENSHOT"])
    assert [r.get_attribute("data-template") for r in rows] == [
        "helpfulness", "faithfulness", "answer-relevance", "instruction-following", "toxicity", "refusal-correctness"]
    for row, template in zip(rows, TEMPLATES, strict=True):
        cells = [td.text for td in row.find_elements(By.CSS_SELECTOR, "td")]
        n = len(template.examples)
        assert cells[:3] == [template.title, template.reads, str(n)]
        assert row.find_element(By.CSS_SELECTOR, "button").text == "Check against people"
        assert f"{n} judge calls" in cells[3]


def test_checking_a_template_against_people_opens_its_run_with_the_agreement(browser: Any, console: Api) -> None:
    run_id = check_faithfulness(browser, console)
    examples = FAITHFULNESS.examples

    # The run: the template's judge over its examples, each graded.
    assert browser.find_element(By.ID, "run-graded-by").text == f"{FAITHFULNESS.title} (scorer)"
    assert browser.find_element(By.ID, "run-subject").text == f"{FAITHFULNESS.title} examples"
    assert browser.find_element(By.ID, "run-status").text == "completed"
    assert browser.find_element(By.ID, "run-scored").text == f"{len(examples)} of {len(examples)}"
    run = console.get(f"/v1/evaluations/{run_id}")
    assert run["agreement"]["labelledRows"] == len(examples) == 6
    group = browser.find_element(By.CSS_SELECTOR, "#agreement tbody tr[data-kind=group]")
    assert group.find_element(By.CSS_SELECTOR, "[data-figure=labelledRows]").text == "6"
    assert browser.find_element(By.ID, "agreement-summary").text.startswith("6 rows carry a human verdict")

    # The judge read each example's retrieved context: the rows' spans reached it - in this check,
    # or in an earlier one of this module whose verdicts it reuses (the verdict cache: a verdict
    # paid for is not paid again, so the judge may have been asked nothing just now).
    asked = [m["content"] for r in console.judge.requests for m in r["messages"] if m["role"] == "user"]
    for example in examples:
        spans: list[dict[str, Any]] = example["spans"]  # type: ignore[assignment]
        retrieved = next(s["output"] for s in spans if s.get("kind") == "retriever")
        assert any(str(retrieved) in text and str(example["output"]) in text for text in asked), retrieved


def test_a_second_check_reuses_the_templates_judge(browser: Any, console: Api) -> None:
    first = check_faithfulness(browser, console)
    judges = faithfulness_judges(console)
    assert len(judges) == 1
    second = check_faithfulness(browser, console)
    assert second != first
    assert faithfulness_judges(console) == judges, "a second judge was made from the template"
    assert console.get(f"/v1/evaluations/{second}")["scorerId"] == judges[0]["id"]
    named = [d for d in console.get("/v1/datasets?limit=200")["items"] if d["name"] == f"Template examples: {FAITHFULNESS.title}"]
    assert len(named) == 1 and named[0]["version"] == 1, "the examples' dataset is reused, not uploaded again"
    assert console.get(f"/v1/evaluations/{second}")["datasetId"] == named[0]["id"]


def test_a_failed_check_says_why_and_can_be_tried_again(browser: Any, console: Api) -> None:
    row = next(r for r in open_templates(browser, console) if r.get_attribute("data-template") == "toxicity")
    # The dataset upload is refused (as a full store would), with a detail written like markup.
    browser.execute_script("""
      const real = window.fetch, detail = arguments[0];
      window.fetch = (path, init) => path === "/v1/datasets" && init.method === "POST"
        ? Promise.resolve(new Response(JSON.stringify({detail}), {status: 503}))
        : real(path, init);""", f"{XSS} no room")
    button = row.find_element(By.CSS_SELECTOR, "button[data-check='toxicity']")
    button.click()
    error = wait_for(browser, "#templates tr[data-template='toxicity'] [data-template-status] .error")[0]
    assert error.text == f"{XSS} no room" and button.is_enabled()
    assert browser.find_elements(By.CSS_SELECTOR, "main img") == [], "the error became markup"
    assert browser.current_url.endswith("#/templates")
