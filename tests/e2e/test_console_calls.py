"""The console's judge calls and judge templates in Debian's headless chromium, against the real
API process and Redis of the console tests' fixtures (``tests.support.console_browser``): a
result written with its judge calls, as the worker keeps them, opens a judge member's call from
the Judge scores view - model, latency, attempts, tokens, each message as sent (a hostile one as
text, a long one with its cut said) and the answer; a result without calls says so, and one no
longer kept says that. The group editor offers the judge templates: a member set to one gets a
judge made from it when the group is saved. ``SGW_CONSOLE_CALLS_SCREENSHOT=<path>`` saves the
page with the call open, ``SGW_CONSOLE_TEMPLATE_SCREENSHOT=<path>`` the editor with a template chosen."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from scorer_groups import Client
from scoring.judge_calls import encode_calls, kept
from scoring.ports import JudgeCall, TokenUsage
from scoring.results import HistoryEntry
from tests.support.console_browser import XSS, Env, a_rating, record, sign_in, wait_for

pytestmark = pytest.mark.integration

# The console tests' fixtures, for this module: its own API process with its groups, and chromium.

By = pytest.importorskip("selenium.webdriver.common.by").By
Select = pytest.importorskip("selenium.webdriver.support.select").Select
WebDriverWait = pytest.importorskip("selenium.webdriver.support.ui").WebDriverWait
NoAlertPresentException = pytest.importorskip("selenium.common.exceptions").NoAlertPresentException

SYSTEM = "You grade an agent's answer.\nReply with JSON: {\"rating\": 0-10, \"justification\": \"...\"}"
HOSTILE = f"Request: {XSS}\nResponse: <b>It arrives tomorrow.</b>"
LONG = "".join(f"line {n:05d} of the trace's output\n" for n in range(400))[:9000]  # cut at 4,000
ANSWER = '{"rating": 8, "justification": "Answers the question </pre><script>alert(2)</script>"}'
FAITHFULNESS = "Faithfulness to retrieved context"


def a_call(model: str, messages: tuple[tuple[str, str], ...], answer: str | None, latency_s: float, attempts: int,
           usage: TokenUsage | None = None, error: str | None = None) -> JudgeCall:
    """A call as the panel keeps it: cut at 4,000 characters (nothing here to mask)."""
    return kept(JudgeCall(model=model, messages=messages, answer=answer, started_at=time.time() - 60,
                          latency_s=latency_s, attempts=attempts, usage=usage, error=error), lambda text: text)


def write(env: Env, group: Any, n: int, calls: list[tuple[str, str, tuple[JudgeCall, ...]]] | None,
          indexed: bool = True) -> str:
    """A result of ``group`` as the worker writes it (its document, rating id and judge calls)."""
    rating = a_rating(group, n, 7.0, time.time() - 30 + n)
    asyncio.run(record(env.url, [HistoryEntry(group.id, rating.rating, False, rating.scored_at.timestamp(),
                                              rating.to_json(), rating_id=rating.id if indexed else "",
                                              calls=encode_calls(calls or []))]))
    return rating.id


@pytest.fixture
def group(console: Env) -> Iterator[Any]:
    with Client(console.api.url, console.key) as client:
        made = client.monitor.scorer_groups.create("Called", members=[m.wire() for m in console.group.members])
        yield made
        client.monitor.scorer_groups.delete(made.id)


def open_judge_scores(browser: Any, env: Env, group: Any, rating_id: str) -> Any:
    """The group's page with the result's Judge scores view open: the result."""
    sign_in(browser, env)
    browser.get(env.api.url + f"/console#/groups/{group.id}")
    result = wait_for(browser, f"#results .result[data-rating='{rating_id}']")[0]
    result.find_element(By.CSS_SELECTOR, "button[data-view='Judge scores']").click()
    return result


def test_the_judge_scores_view_opens_a_judge_members_call(console: Env, browser: Any, group: Any) -> None:
    judge = group.members[0].ref_id
    graded = a_call("judge-model-x", (("system", SYSTEM), ("user", HOSTILE), ("user", LONG)), ANSWER,
                    latency_s=1.25, attempts=2, usage=TokenUsage(1200, 35))
    elsewhere = a_call("other-model", (("user", "not this member's"),), "{}", latency_s=0.1, attempts=1)
    rating_id = write(console, group, 100, [(judge, "Helpful", (graded,)), (judge, "Helpful (old label)", (elsewhere,))])
    result = open_judge_scores(browser, console, group, rating_id)

    rows = result.find_elements(By.CSS_SELECTOR, ".members tbody tr")
    assert [r.get_attribute("data-member") for r in rows] == ["Helpful", "PII"]
    assert rows[1].find_elements(By.CSS_SELECTOR, "button[data-call]") == [], "a pattern makes no judge call"
    panel = result.find_element(By.CSS_SELECTOR, "[data-call-panel]")
    assert panel.get_attribute("id") == f"call-{rating_id}" and not panel.is_displayed()
    rows[0].find_element(By.CSS_SELECTOR, "button[data-call='Helpful']").click()
    wait_for(browser, f"#call-{rating_id} .call")

    calls = panel.find_elements(By.CSS_SELECTOR, ".call")
    assert len(calls) == 1, "only the calls of this member (its scorer and its label)"
    fact = {f.get_attribute("data-fact"): f.text for f in calls[0].find_elements(By.CSS_SELECTOR, "dd[data-fact]")}
    assert fact["model"] == "judge-model-x" and fact["attempts"] == "2" and fact["latency"] == "1,250 ms"
    assert fact["tokens"] == "1,200 prompt, 35 completion" and fact["error"] == "none"
    messages = panel.find_elements(By.CSS_SELECTOR, "pre[data-message]")
    assert [m.get_attribute("data-message") for m in messages] == ["0", "1", "2"]
    assert [m.get_property("textContent") for m in messages] == [SYSTEM, HOSTILE, LONG[:4000]], "as sent, as text"
    roles = [m.get_attribute("data-role") for m in panel.find_elements(By.CSS_SELECTOR, ".call-message[data-role]")]
    assert roles == ["system", "user", "user"]
    cuts = panel.find_elements(By.CSS_SELECTOR, ".call-cut")
    assert [c.text for c in cuts] == ["cut: 4,000 of 9,000 characters"], "only the long message was cut"
    assert panel.find_element(By.CSS_SELECTOR, "pre[data-answer]").get_property("textContent") == ANSWER
    assert browser.find_elements(By.CSS_SELECTOR, "main img, main script, main b") == [], "a message became markup"
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018
    if os.environ.get("SGW_CONSOLE_CALLS_SCREENSHOT"):
        browser.execute_script("arguments[0].scrollIntoView()", result)
        browser.save_screenshot(os.environ["SGW_CONSOLE_CALLS_SCREENSHOT"])

    # Switching views keeps the result's calls (read once); the button closes what it opened.
    result.find_element(By.CSS_SELECTOR, "button[data-view='Group score']").click()
    result.find_element(By.CSS_SELECTOR, "button[data-view='Judge scores']").click()
    button = result.find_element(By.CSS_SELECTOR, "button[data-call='Helpful']")
    button.click()
    assert wait_for(browser, f"#call-{rating_id} pre[data-answer]")
    assert button.get_attribute("aria-pressed") == "true"
    button.click()
    assert not result.find_element(By.CSS_SELECTOR, "[data-call-panel]").is_displayed()


def test_a_cached_verdict_says_who_paid_for_it_and_the_page_its_hit_rate(console: Env, browser: Any, group: Any) -> None:
    judge = group.members[0].ref_id
    paid = write(console, group, 300, [(judge, "Helpful", (a_call("m", (("user", "Is it right?"),), ANSWER, 1.0, 1),))])
    rating = a_rating(group, 301, 7.0, time.time())
    cached_member = rating.members[0].model_copy(update={"cached": True, "cached_from": paid})
    rating = rating.model_copy(update={"members": [cached_member, rating.members[1]]})
    not_made = kept(JudgeCall(model="m", messages=(("user", "Is it right?"),), answer=None, started_at=time.time(),
                              latency_s=0.0, attempts=0, usage=None, cached_from=paid), lambda text: text)
    asyncio.run(record(console.url, [HistoryEntry(group.id, 7.0, False, time.time(), rating.to_json(), rating_id=rating.id,
                                              calls=encode_calls([(judge, "Helpful", (not_made,))]))]))
    result = open_judge_scores(browser, console, group, rating.id)
    cached = result.find_element(By.CSS_SELECTOR, ".members [data-cached]")
    assert cached.get_attribute("data-cached") == paid and cached.text == "(cached)"
    result.find_element(By.CSS_SELECTOR, "button[data-call='Helpful']").click()
    fact = wait_for(browser, f"#call-{rating.id} dd[data-fact='cached']")[0]
    assert fact.text == f"not made: paid for already, by rating {paid}"
    rate = browser.find_element(By.CSS_SELECTOR, "#cache-hit-rate").text
    shown = len(browser.find_elements(By.CSS_SELECTOR, "#results .result"))
    assert rate.startswith(f"Verdict cache: 1 of these {shown} judge verdicts were paid for already"), rate


def test_a_result_without_calls_and_one_no_longer_kept_say_so(console: Env, browser: Any, group: Any) -> None:
    quiet = write(console, group, 200, None)  # its judge made no call (a gate failed first, say)
    result = open_judge_scores(browser, console, group, quiet)
    result.find_element(By.CSS_SELECTOR, "button[data-call='Helpful']").click()
    assert wait_for(browser, f"#call-{quiet} [data-no-call]")[0].text == "no call recorded"
    assert result.find_elements(By.CSS_SELECTOR, ".call") == []

    gone = write(console, group, 201, None, indexed=False)  # not found by its id: as once trimmed from the list
    result = open_judge_scores(browser, console, group, gone)
    result.find_element(By.CSS_SELECTOR, "button[data-call='Helpful']").click()
    assert "the calls of this result are no longer kept" in \
        wait_for(browser, f"#call-{gone} [data-calls-gone]")[0].text.lower()


def judges(env: Env) -> list[dict[str, Any]]:
    with env.api.client(env.key) as http:
        answer = http.get("/v1/judges?limit=200")
        assert answer.status_code == 200, answer.text
        return list(answer.json()["items"])


def test_the_editor_makes_a_judge_from_a_template(console: Env, browser: Any) -> None:
    before = {j["id"] for j in judges(console)}
    sign_in(browser, console)
    browser.get(console.api.url + "/console#/new")
    row = wait_for(browser, "#group-form .member")[0]
    Select(row.find_element(By.CSS_SELECTOR, "[name=kind]")).select_by_value("judge")
    scorer = row.find_element(By.CSS_SELECTOR, "[name=refId]")
    offered = scorer.find_elements(By.CSS_SELECTOR, "optgroup[label='From a template'] option")
    assert f"{FAITHFULNESS} (new judge)" in [o.text for o in offered]
    assert all(o.get_attribute("value").startswith("template:") for o in offered)
    note = row.find_element(By.CSS_SELECTOR, "[data-template-reads]")
    assert not note.is_displayed(), "an existing judge is chosen first"

    Select(scorer).select_by_visible_text(f"{FAITHFULNESS} (new judge)")
    option = scorer.find_element(By.CSS_SELECTOR, "option[value='template:faithfulness']")
    reads = "The request, the outputs of the trace's retriever spans, and the response."
    assert option.get_attribute("title") == reads
    assert note.is_displayed() and reads in note.text
    if os.environ.get("SGW_CONSOLE_TEMPLATE_SCREENSHOT"):
        browser.save_screenshot(os.environ["SGW_CONSOLE_TEMPLATE_SCREENSHOT"])
    browser.find_element(By.CSS_SELECTOR, "#group-form [data-field='name']").send_keys("Grounded answers")
    browser.find_element(By.CSS_SELECTOR, "#group-form button[type=submit]").click()
    WebDriverWait(browser, 15).until(lambda d: "#/groups/" in d.current_url)

    made = [j for j in judges(console) if j["id"] not in before]
    assert len(made) == 1, made
    assert made[0]["context"] == "retrieval" and made[0]["name"] == FAITHFULNESS
    group_id = browser.current_url.split("#/groups/")[1]
    with console.api.client(console.key) as http:
        saved = http.get(f"/v1/scorer-groups/{group_id}").json()
        assert saved["name"] == "Grounded answers"
        assert [(m["kind"], m["refId"]) for m in saved["members"]] == [("judge", made[0]["id"])]
        assert http.delete(f"/v1/scorer-groups/{group_id}").status_code in (200, 204)
