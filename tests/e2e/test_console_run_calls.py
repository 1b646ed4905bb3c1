"""The judge calls behind a dataset run's rows, on the console's run page, in Debian's headless
chromium against a real API process, Redis and the local judge (``devtools.judge_server``, kept
here to read what the judge was sent): each judge verdict of the rows table has a Call button
that opens, below the table, that judge's call on that row - its model, and each message exactly
as the judge received it (an output written like an XSS payload shown as text) - read once per
row; another row's button replaces the view, the same button closes it; a failed read says why
and is tried again at the next opening; a row without the member's call says the API's note; a
row whose agent failed has no button. ``SGW_CONSOLE_RUN_CALLS_SCREENSHOT=<path>`` saves the page
with a call open."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from devtools.judge_server import JudgeServer
from scorer_groups import Client
from tests.support.api_process import ApiProcess, api_with_judge
from tests.support.console_browser import XSS, sign_in_at, wait_for
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

# The console tests' browser; the API is this module's own, with its judge in reach.

By = pytest.importorskip("selenium.webdriver.common.by").By
WebDriverWait = pytest.importorskip("selenium.webdriver.support.ui").WebDriverWait
NoAlertPresentException = pytest.importorskip("selenium.common.exceptions").NoAlertPresentException

QUESTIONS = ["q0", "q1", "q2"]  # q0's answer is hostile, q1's plain; on q2 the agent raises
SAYS = {"q0": (8, 3), "q1": (6, 9)}  # what (Quality, Safety) rate each answer


def agent(question: str) -> str:
    if question == "q2":
        raise RuntimeError("the agent fell over")
    quality, safety = SAYS[question]
    hostile = f"{XSS} " if question == "q0" else ""
    return f"{hostile}answer to {question} [[rating@quality-model={quality}]] [[rating@safety-model={safety}]]"


@dataclass
class Env:
    api: ApiProcess
    key: str
    judge: JudgeServer
    run: dict[str, Any]  # the run document, as GET /v1/evaluations/{id} answers it
    asked: dict[tuple[str, str], str]  # (model, question) -> the user message the judge received


@pytest.fixture(scope="module")
def console(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with api_with_judge(redis_databases, tmp_path_factory.mktemp("api"), "p-console-run-calls",
                        env={"SGW_JUDGE_TIMEOUT_S": "5"}) as (api, key, judge):
        with Client(api.url, key) as client:
            quality = client.monitor.judges.create(name="Quality", criteria="Helpful?", model="quality-model")
            safety = client.monitor.judges.create(name="Safety", criteria="Safe?", model="safety-model")
            group = client.monitor.scorer_groups.create(
                "Release bar", members=[{"kind": "judge", "refId": quality.id, "weight": 1},
                                        {"kind": "judge", "refId": safety.id, "weight": 1}])
            dataset = client.datasets.create("Questions", rows=[{"input": q} for q in QUESTIONS])
            judge.reset()
            done = client.evaluations.run(dataset_id=dataset.id, subject={"kind": "custom_agent", "displayName": "bot"},
                                          scorer_group_id=group.id).execute(agent, retries=0).finalize()
        with api.client(key) as http:
            answer = http.get(f"/v1/evaluations/{done.id}")
            assert answer.status_code == 200, answer.text
            run = dict(answer.json())
        asked = {}
        for request in judge.requests:
            user = [m["content"] for m in request["messages"] if m["role"] == "user"]
            assert len(user) == 1 and isinstance(user[0], str), request["messages"]
            question = next(q for q in SAYS if f"answer to {q} " in user[0])
            asked[(request["model"], question)] = user[0]
        assert sorted(asked) == sorted((m, q) for m in ("quality-model", "safety-model") for q in SAYS)
        assert len(judge.requests) == 4, "two judges on two rows; none on the failed row"
        yield Env(api, key, judge, run, asked)


def open_run(browser: Any, env: Env) -> None:
    """Signs in (the tab's sessionStorage holds the key), counts the page's reads of row calls
    (``window.rowCallReads``) and opens the run's page."""
    sign_in_at(browser, env.api.url, env.key)
    browser.execute_script("""
      const real = window.fetch;
      window.rowCallReads = [];
      window.fetch = (path, init) => {
        if (/\\/rows\\/\\d+\\/calls$/.test(path)) window.rowCallReads.push(path);
        return real(path, init);
      };""")
    browser.get(env.api.url + f"/console#/runs/{env.run['id']}")
    wait_for(browser, "#run-rows tbody tr", len(QUESTIONS))


def call_button(browser: Any, row: int, label: str) -> Any:
    return browser.find_element(By.CSS_SELECTOR, f"#run-rows tr[data-row='{row}'] td[data-judge='{label}'] button")


def open_call(browser: Any, row: int, label: str) -> Any:
    """Clicks the row's Call button of ``label``: the panel, once it shows that call."""
    call_button(browser, row, label).click()
    wait_for(browser, f"#run-call[data-row='{row}'][data-member='{label}'] .call")
    return browser.find_element(By.ID, "run-call")


def facts(panel: Any) -> dict[str, str]:
    return {f.get_attribute("data-fact"): f.text for f in panel.find_elements(By.CSS_SELECTOR, "dd[data-fact]")}


def user_messages(panel: Any) -> list[str]:
    return [m.get_property("textContent")
            for m in panel.find_elements(By.CSS_SELECTOR, ".call-message[data-role=user] pre[data-message]")]


def reads(browser: Any) -> list[str]:
    return list(browser.execute_script("return window.rowCallReads"))


def test_a_judge_cell_opens_the_call_behind_its_verdict(browser: Any, console: Env) -> None:
    run = console.run
    assert [r["row"] for r in run["rows"]] == [0, 1, 2] and run["rows"][2]["error"]
    open_run(browser, console)
    panel = browser.find_element(By.ID, "run-call")
    assert not panel.is_displayed()

    # Each verdict reads as its rating with its Call button; a failed row has no verdict and no button.
    rows = browser.find_elements(By.CSS_SELECTOR, "#run-rows tbody tr")
    assert rows[0].find_element(By.CSS_SELECTOR, "td[data-judge='Quality'] .run-verdict").text == "8.00"
    assert rows[0].find_element(By.CSS_SELECTOR, "td[data-judge='Quality'] button").text == "Call"
    assert len(rows[0].find_elements(By.CSS_SELECTOR, "button.call-button")) == 2
    assert rows[2].find_elements(By.CSS_SELECTOR, "button") == [], "the agent failed: nothing was graded"
    assert rows[2].find_elements(By.CSS_SELECTOR, "td[data-judge]") == []

    # The hostile row's Quality call: its model, the message the judge received, as text.
    panel = open_call(browser, 0, "Quality")
    if os.environ.get("SGW_CONSOLE_RUN_CALLS_SCREENSHOT"):
        browser.save_screenshot(os.environ["SGW_CONSOLE_RUN_CALLS_SCREENSHOT"])
    assert len(panel.find_elements(By.CSS_SELECTOR, ".call")) == 1, "only this member's call"
    assert facts(panel)["model"] == "quality-model" and facts(panel)["error"] == "none"
    assert user_messages(panel) == [console.asked[("quality-model", "q0")]]
    assert XSS in console.asked[("quality-model", "q0")]
    assert panel.find_element(By.CSS_SELECTOR, "h3").text == "Judge call of Quality on row 0"
    verdict = next(v for v in run["rows"][0]["judgeScorerResults"] if v["label"] == "Quality")
    assert verdict["rating"] == 8 and '"rating": 8' in panel.find_element(By.CSS_SELECTOR, "pre[data-answer]").text
    assert browser.execute_script("return document.querySelectorAll('img, script:not([src])').length") == 0, \
        "a message became markup"
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018
    assert call_button(browser, 0, "Quality").get_attribute("aria-pressed") == "true"

    # The same row's other judge: its own call (the row read once).
    panel = open_call(browser, 0, "Safety")
    assert facts(panel)["model"] == "safety-model"
    assert user_messages(panel) == [console.asked[("safety-model", "q0")]]
    assert call_button(browser, 0, "Quality").get_attribute("aria-pressed") == "false"

    # Another row's button replaces the view with that row's call.
    panel = open_call(browser, 1, "Quality")
    assert len(panel.find_elements(By.CSS_SELECTOR, ".call")) == 1
    assert facts(panel)["model"] == "quality-model"
    assert user_messages(panel) == [console.asked[("quality-model", "q1")]]
    assert XSS not in panel.text
    assert [b.get_attribute("aria-pressed") for b in browser.find_elements(By.CSS_SELECTOR, "button.call-button")] \
        == ["false", "false", "true", "false"]

    # The button that opened it closes it; opening again reads nothing more.
    call_button(browser, 1, "Quality").click()
    assert not panel.is_displayed() and call_button(browser, 1, "Quality").get_attribute("aria-pressed") == "false"
    open_call(browser, 0, "Quality")
    run_id = run["id"]
    assert reads(browser) == [f"/v1/evaluations/{run_id}/rows/0/calls", f"/v1/evaluations/{run_id}/rows/1/calls"]


def test_a_failed_read_is_tried_again_and_a_row_without_the_call_says_why(browser: Any, console: Env) -> None:
    open_run(browser, console)
    run_id = console.run["id"]
    # Row 0's first read is refused (with a detail written like markup); row 1's answers no call,
    # with a note (as a run over its budget says it).
    browser.execute_script("""
      const counted = window.fetch, detail = arguments[0], note = arguments[1];
      let refused = false;
      window.fetch = (path, init) => {
        if (path.endsWith("/rows/0/calls") && !refused) {
          refused = true;
          window.rowCallReads.push(path);
          return Promise.resolve(new Response(JSON.stringify({detail}), {status: 503}));
        }
        if (path.endsWith("/rows/1/calls")) {
          window.rowCallReads.push(path);
          return Promise.resolve(new Response(JSON.stringify({row: 1, calls: [], note}), {status: 200}));
        }
        return counted(path, init);
      };""", f"{XSS} unavailable", f"{XSS} not kept")
    call_button(browser, 0, "Quality").click()
    error = wait_for(browser, "#run-call[data-row='0'] .error")[0]
    assert error.text == f"{XSS} unavailable"
    call_button(browser, 0, "Quality").click()  # closes what it opened
    panel = open_call(browser, 0, "Quality")  # and reads again
    assert user_messages(panel) == [console.asked[("quality-model", "q0")]]

    call_button(browser, 1, "Safety").click()
    assert wait_for(browser, "#run-call[data-row='1'] [data-no-call]")[0].text == f"{XSS} not kept"
    assert browser.find_elements(By.CSS_SELECTOR, "#run-call .call") == []
    assert browser.execute_script("return document.querySelectorAll('img').length") == 0
    calls = f"/v1/evaluations/{run_id}/rows"
    assert reads(browser) == [f"{calls}/0/calls", f"{calls}/0/calls", f"{calls}/1/calls"]
