"""The console in a real headless browser (Debian's chromium through chromedriver, driven by
Selenium) against the real API process, Redis and a local chat-completions judge: sign in, the
groups, a group's chart drawn from its ratings history, recent results with the Group score /
Judge scores switch, the playground, an edit refused by the API shown at its field, dataset runs
with their gate - and a group named like an XSS payload rendered as text.

Chromium is kept on loopback: every host name but 127.0.0.1 resolves to nothing, and its
background services (updates, sync, metrics) are off. ``SGW_CONSOLE_SCREENSHOT=<path>`` saves
the group page (the README's picture is made that way)."""

from __future__ import annotations

import asyncio
import os
import re
import time
from typing import Any

import httpx
import pytest

from scorer_groups import Client
from scoring.results import HistoryEntry
from tests.support.console_browser import XSS, Env, a_rating, count_matched, record, sign_in, wait_for

pytestmark = pytest.mark.integration

# The console's browser and API process (``tests.support.console_browser``), for this module.

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install '.[test]')")
from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException,
    StaleElementReferenceException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


def test_the_console_is_served_with_a_policy_that_forbids_inline_script(console: Env) -> None:
    page = httpx.get(console.api.url + "/console")
    policy = page.headers["content-security-policy"]
    assert page.status_code == 200 and "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert "frame-ancestors 'none'" in policy and page.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in page.text, "no inline script in the page"
    assert httpx.get(console.api.url + "/console/static/../openapi.json").status_code == 404


def test_the_console_and_the_api_docs_name_an_icon_the_api_serves(console: Env) -> None:
    # Without one, a browser asks for /favicon.ico and logs the 404 on every page.
    for page in ("/console", "/docs"):
        icon = re.search(r'<link rel="icon" href="([^"]+)" type="image/svg\+xml">', httpx.get(console.api.url + page).text)
        assert icon, f"{page} names no icon"
        answer = httpx.get(console.api.url + icon.group(1))
        assert answer.status_code == 200 and answer.headers["content-type"] == "image/svg+xml"
        assert answer.text.startswith("<svg ") and "<script" not in answer.text


def test_the_console_from_sign_in_to_an_edit(console: Env, browser: Any) -> None:
    # Sign in: the key goes to this tab's sessionStorage, nowhere else.
    sign_in(browser, console)
    assert browser.execute_script("return sessionStorage.getItem('sgw-api-key')") == console.key
    assert console.key not in browser.current_url and browser.get_cookies() == []

    # The groups: this project's only; the XSS name is text, not an element, and nothing ran.
    names = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#groups .group-name")]
    assert sorted(names) == sorted(["Release bar", XSS])
    assert browser.find_elements(By.CSS_SELECTOR, "main img") == [], "the group name became markup"
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018
    row = browser.find_element(By.CSS_SELECTOR, f"#groups tr[data-group='{console.group.id}']")
    assert "live, trace scope, sample 50%, alert below 6 (high)" in row.text

    # A group's page: the chart draws one point per bucket with ratings, the band, the counts.
    row.find_element(By.CSS_SELECTOR, "a").click()
    points = wait_for(browser, "#chart circle.point", len(console.hours))
    assert len(points) == len(console.hours) and browser.find_elements(By.CSS_SELECTOR, "#chart polygon.band")
    summary = browser.find_element(By.ID, "chart-summary").text
    assert f"{console.results} results" in summary and f"{len(console.hours)} below the threshold" in summary
    spend = browser.find_element(By.ID, "chart-spend").text  # 11 calls at 0.0025 USD, one of unknown cost
    assert "Spend: 0.0275 USD over" in spend and "and 1 call(s) of unknown cost" in spend, spend
    assert f"({0.0275 / console.results:.6f}".rstrip("0") + " USD a result)" in spend, spend
    assert "0.0275 USD over the last day" in spend, spend

    # Recent results, newest first, with the switch between the blend and the members' verdicts.
    results = wait_for(browser, "#results .result", 12)
    assert len(results) == console.results
    first = results[0]
    assert f"trace-{console.results - 1}" in first.text, "the newest result first"
    assert first.find_element(By.CSS_SELECTOR, ".justification").text.startswith("Weighted blend:")
    first.find_element(By.CSS_SELECTOR, "button[data-view='Judge scores']").click()
    verdicts = first.find_elements(By.CSS_SELECTOR, ".members tbody tr")
    assert [v.get_attribute("data-member") for v in verdicts] == ["Helpful", "PII"]
    assert "Judge says" in verdicts[0].text and "scored" in verdicts[0].text
    if os.environ.get("SGW_CONSOLE_SCREENSHOT"):
        browser.execute_script("window.scrollTo(0, 0)")
        browser.save_screenshot(os.environ["SGW_CONSOLE_SCREENSHOT"])

    wait_for(browser, "#chart button[data-window='7d']")[0].click()
    WebDriverWait(browser, 10, ignored_exceptions=[StaleElementReferenceException]).until(
        lambda d: d.find_element(By.CSS_SELECTOR, "#chart button[aria-pressed='true']").get_attribute("data-window") == "7d")
    assert len(wait_for(browser, "#chart circle.point", len(console.hours))) == len(console.hours), "hourly buckets at 7d"

    # The playground grades an example with every member, now.
    browser.find_element(By.ID, "play-input").send_keys("Where is my parcel?")
    browser.find_element(By.ID, "play-output").send_keys("It arrives tomorrow. [[rating=9]]")
    browser.find_element(By.CSS_SELECTOR, "#playground button[type=submit]").click()
    graded = wait_for(browser, "#play-answer .members tbody tr", 2)
    assert [g.get_attribute("data-member") for g in graded] == ["Helpful", "PII"]
    assert browser.find_element(By.CSS_SELECTOR, "#play-answer .score").text == "9.50"

    # An edit the API refuses: its message at the field it names.
    rate = browser.find_element(By.CSS_SELECTOR, "#group-form [data-field='online.sampleRate']")
    rate.clear()
    rate.send_keys("2")
    browser.find_element(By.CSS_SELECTOR, "#group-form button[type=submit]").click()
    error = wait_for(browser, "#group-form .field-error[data-error-for='online.sampleRate']")[0]
    assert "1" in error.text and "invalid" in rate.get_attribute("class")

    # Dataset runs with their gate.
    browser.get(console.api.url + "/console#/runs")
    run = wait_for(browser, "#runs tbody tr")[0]
    assert "Release bar" in run.text and "pass" in run.text
    gate = browser.find_element(By.ID, "fail-under")
    gate.clear()
    gate.send_keys("9.9")
    WebDriverWait(browser, 5, ignored_exceptions=[StaleElementReferenceException]).until(
        lambda d: "fail" in d.find_element(By.CSS_SELECTOR, "#runs tbody tr").text)


def test_the_xss_group_page_shows_its_name_as_text(console: Env, browser: Any) -> None:
    sign_in(browser, console)
    browser.get(console.api.url + f"/console#/groups/{console.xss.id}")
    title = wait_for(browser, "#group-title")[0]
    assert title.text == XSS
    assert browser.find_elements(By.CSS_SELECTOR, "main img") == []
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018


def test_two_groups_at_one_rate_are_compared_trace_by_trace(console: Env, browser: Any) -> None:
    # Consistent sampling: a new rubric at the old one's rate grades the same traces, so the
    # console sets their results side by side with the mean difference over the shared ones.
    with Client(console.api.url, console.key) as client:
        online = {"enabled": True, "sampleRate": 0.5, "alertThreshold": 6, "severity": "high"}
        members = [m.wire() for m in console.group.members]
        rubric = client.monitor.scorer_groups.create("New rubric", members=members, online=online)
        try:
            now = time.time()
            # The new rubric scored six of the release bar's traces, each one point higher.
            shared = [HistoryEntry(rubric.id, score + 1, False, now - 60, a_rating(rubric, n, score + 1, now - 60)
                                   .to_json()) for n, score in enumerate((4.0, 7.0, 9.0, 4.0, 7.0, 9.0))]
            asyncio.run(record(console.url, shared))
            sign_in(browser, console)
            browser.get(console.api.url + f"/console#/groups/{console.group.id}")
            choice = wait_for(browser, "#compare-with option[value='" + rubric.id + "']")[0]
            offered = [o.text for o in browser.find_elements(By.CSS_SELECTOR, "#compare-with option")][1:]
            assert sorted(offered) == sorted(["New rubric", XSS]), "this project's other groups, no one else's"
            choice.click()
            summary = wait_for(browser, "#compare-summary")[0]
            assert summary.text.startswith("6 shared, mean difference -1.00"), summary.text
            rows = browser.find_elements(By.CSS_SELECTOR, "#comparison tbody tr")
            assert sorted(r.get_attribute("data-subject") for r in rows) == sorted(f"trace trace-{n}" for n in range(6))
        finally:
            client.monitor.scorer_groups.delete(rubric.id)



def test_the_filter_builder_saves_a_filter_shows_refusals_at_their_row_and_the_playground_says_if_it_matches(
        console: Env, browser: Any) -> None:
    with Client(console.api.url, console.key) as client:
        online = {"enabled": True, "sampleRate": 0.2, "alertThreshold": 6, "severity": "high"}
        group = client.monitor.scorer_groups.create("Aimed", members=[m.wire() for m in console.group.members],
                                                    online=online)
        try:
            asyncio.run(count_matched(console.url, group.id, 37))  # as the worker counts them, on its tick
            sign_in(browser, console)
            browser.get(console.api.url + f"/console#/groups/{group.id}")
            wait_for(browser, "#filter-rows")
            assert wait_for(browser, "#chart-matched")[0].text == "37 traces of the project seen", "no filter yet"

            def add_row(field: str, op: str, value: str) -> Any:
                browser.find_element(By.ID, "filter-add").click()
                row = browser.find_elements(By.CSS_SELECTOR, "#filter-rows .filter-row")[-1]
                row.find_element(By.NAME, "field").send_keys(field)
                row.find_element(By.CSS_SELECTOR, f"[name=op] option[value='{op}']").click()
                row.find_element(By.NAME, "value").send_keys(value)
                return row

            # Two rows, "all of": saved as the API's filter, typed values as JSON reads them.
            add_row("agentId", "in", "support, sales")
            row = add_row("metadata.retries", "lt", "3")
            row.find_element(By.NAME, "not").click()
            browser.find_element(By.CSS_SELECTOR, "#group-form button[type=submit]").click()
            wanted = {"all": [{"field": "agentId", "op": "in", "value": ["support", "sales"]},
                              {"not": {"field": "metadata.retries", "op": "lt", "value": 3}}]}
            WebDriverWait(browser, 10).until(lambda _: client.monitor.scorer_groups.get(group.id).online.filter
                                             is not None)
            saved = client.monitor.scorer_groups.get(group.id).online
            assert saved is not None and saved.filter is not None
            assert saved.filter.model_dump(by_alias=True) == wanted
            assert saved.sample_rate == 0.2, "the rest of the profile kept"

            # A refused row: the API's message at the row's own input (online.filter.all[2].field).
            wait_for(browser, "#filter-rows .filter-row", 2)
            add_row("user.email", "eq", "x")
            browser.find_element(By.CSS_SELECTOR, "#group-form button[type=submit]").click()
            error = wait_for(browser, "#group-form .field-error[data-error-for='online.filter.all[2].field']")[0]
            assert "not a field of a trace" in error.text
            bad_input = browser.find_element(By.CSS_SELECTOR, "[data-field='online.filter.all[2].field']")
            assert "invalid" in bad_input.get_attribute("class")

            # The playground says whether live scoring would see the example.
            browser.get(console.api.url + f"/console#/groups/{group.id}")
            wait_for(browser, "#play-input")[0].send_keys("q")
            browser.find_element(By.ID, "play-output").send_keys("a [[rating=7]]")
            browser.find_element(By.CSS_SELECTOR, "#playground button[type=submit]").click()
            assert "would not see" in wait_for(browser, "#play-filter")[0].text, "agent 'playground' is not wanted"
            def verdict_after(agent: str, metadata: str) -> str:
                for name, text in (("play-agent", agent), ("play-metadata", metadata)):
                    browser.find_element(By.ID, name).clear()
                    browser.find_element(By.ID, name).send_keys(text)
                browser.find_element(By.CSS_SELECTOR, "#playground button[type=submit]").click()
                WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#play-answer .score"))
                return str(browser.find_element(By.ID, "play-filter").text)

            assert "would see" in verdict_after("support", '{"retries": 5}'), "agent and metadata as typed"
            assert "would not see" in verdict_after("support", '{"retries": 1}')
            assert "would not see" in verdict_after("sales-bot", '{"retries": 5}')
            assert "filtered" in browser.find_element(By.CSS_SELECTOR, "main section p.muted").text
            assert wait_for(browser, "#chart-matched")[0].text == "37 traces matched the filter"

            # Deeper than rows: edited as JSON; an error deep in it is shown there with its path.
            browser.find_element(By.ID, "filter-as-json").click()
            text = browser.find_element(By.ID, "filter-json")
            text.clear()
            text.send_keys('{"any": [{"all": [{"field": "agentId", "op": "eq", "value": "a"},'
                           ' {"field": "durationMs", "op": "gt", "value": "slow"}]}]}')
            browser.find_element(By.CSS_SELECTOR, "#group-form button[type=submit]").click()
            deep = wait_for(browser, "#group-form .field-error[data-error-for='online.filter.any[0].all[1].value']")[0]
            assert deep.text.startswith("online.filter.any[0].all[1].value:") and "compares numbers" in deep.text
            # Removing every row saves no filter: all the project's traffic again.
            browser.refresh()
            wait_for(browser, "#filter-rows .filter-row", 2)
            for button in browser.find_elements(By.CSS_SELECTOR, "#filter-rows .filter-row button"):
                button.click()
            browser.find_element(By.CSS_SELECTOR, "#group-form button[type=submit]").click()
            WebDriverWait(browser, 10).until(lambda _: client.monitor.scorer_groups.get(group.id).online.filter is None)
        finally:
            client.monitor.scorer_groups.delete(group.id)
