"""The console's Incidents in Debian's headless chromium, against the real API process
and Redis of the console tests' fixtures (``tests.support.console_browser``): a group's incidents,
written as the watcher records them, are listed open first and as text, and the page reads them
again; a group paging per result is told how to switch; a learned level is drawn on the chart
with its band; the editor saves the alert settings and shows a refused one at its field.
``SGW_CONSOLE_INCIDENTS_SCREENSHOT=<path>`` saves the page with an open incident."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from adapters.stores import keys
from adapters.stores.incidents import IncidentStore
from scorer_groups import Client
from scoring.incidents import Baseline, Watch
from tests.support.console_browser import XSS, Env, sign_in, wait_for
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration

# The console tests' fixtures, for this module: its own API process with its groups, and chromium.

By = pytest.importorskip("selenium.webdriver.common.by").By
WebDriverWait = pytest.importorskip("selenium.webdriver.support.ui").WebDriverWait


def a_group(env: Env, name: str, **alerts: Any) -> Any:
    with Client(env.api.url, env.key) as client:
        return client.monitor.scorer_groups.create(name, members=[m.wire() for m in env.group.members],
                                                   online={"enabled": True, "sampleRate": 1, "alertThreshold": 6,
                                                           "severity": "high", **alerts})


def delete(env: Env, group: Any) -> None:
    with Client(env.api.url, env.key) as client:
        client.monitor.scorer_groups.delete(group.id)


def online_of(env: Env, group_id: str) -> dict[str, Any]:
    with env.api.client(env.key) as http:
        answer = http.get(f"/v1/scorer-groups/{group_id}")
        assert answer.status_code == 200, answer.text
        return dict(answer.json()["online"])


async def recorded(url: str, group: Any, incident: str, reason: str, state: str, opened: float, said: str,
                   version: int = 0) -> None:
    """An incident as the watcher's move records it (its watch moved from ``version``)."""
    redis = connect(url)
    try:
        record = {"id": incident, "groupId": group.id, "projectId": group.project_id, "reason": reason,
                  "state": state, "openedAt": datetime.fromtimestamp(opened, UTC).isoformat(),
                  "resolvedAt": None if state == "open" else datetime.fromtimestamp(opened + 1800, UTC).isoformat(),
                  "lastSaid": said, "windowMean": 3.25 if state == "open" else 6.5, "windowResults": 12}
        moved = Watch(incident, opened, version + 1) if state == "open" else Watch(version=version + 1)
        store = IncidentStore(redis)
        assert await store.move(group.id, reason, Watch(version=version), moved, {"signal": {}}, record)
        await store.published(group.id, reason, version + 1)  # as the watcher does once it published
    finally:
        await redis.aclose()


async def learned(url: str, group_id: str, mean: float, variance: float, windows: int) -> None:
    redis = connect(url)
    try:
        await IncidentStore(redis).learn(group_id, Baseline(mean, variance, windows, int(time.time()) // 900))
    finally:
        await redis.aclose()


def y(score: float) -> float:
    """The chart's own scale: 200 high, 28 of padding, 0-10."""
    return 200 - 28 - score * (200 - 2 * 28) / 10


def open_group(browser: Any, env: Env, group_id: str) -> None:
    sign_in(browser, env)
    browser.get(env.api.url + f"/console#/groups/{group_id}")
    wait_for(browser, "#group-form")
    wait_for(browser, "#incidents > :not(.muted), #incidents > p.muted[id]")  # its first read is done


def test_incidents_are_listed_open_first_as_text_and_read_again(console: Env, browser: Any) -> None:
    group = a_group(console, "Paged by window", alertMode="window")
    try:
        now = time.time()
        asyncio.run(recorded(console.url, group, "inc-old", "window_below", "resolved", now - 7200,
                             "Resolved: a whole window at 6.50/10."))
        asyncio.run(recorded(console.url, group, "inc-new", "window_below", "open", now - 600, XSS, version=1))
        open_group(browser, console, group.id)
        rows = wait_for(browser, "#incidents .incident", 2)
        assert [(r.get_attribute("data-incident"), r.get_attribute("data-state")) for r in rows] == \
            [("inc-new", "open"), ("inc-old", "resolved")], "open first"
        first = browser.find_element(By.CSS_SELECTOR, "#incidents-open .incident[data-incident='inc-new']")
        assert first.find_element(By.CSS_SELECTOR, ".incident-state").text == "Open"
        assert first.find_element(By.CSS_SELECTOR, ".incident-reason").text == "the window's mean fell below the threshold"
        assert first.find_element(By.CSS_SELECTOR, ".incident-times").text.startswith("since ")
        assert "(10 min)" in first.find_element(By.CSS_SELECTOR, ".incident-times").text
        assert first.find_element(By.CSS_SELECTOR, ".incident-said").text == XSS
        assert first.find_element(By.CSS_SELECTOR, ".incident-window").text == "window mean 3.25 over 12 results"
        assert browser.find_elements(By.CSS_SELECTOR, "main img") == [], "lastSaid became markup"
        old = browser.find_element(By.CSS_SELECTOR, "#incidents-resolved .incident[data-incident='inc-old']")
        times = old.find_element(By.CSS_SELECTOR, ".incident-times").text
        assert times.startswith("opened ") and " \u2192 resolved " in times and times.endswith("(30 min)")
        assert old.find_element(By.CSS_SELECTOR, ".incident-said").text == "Resolved: a whole window at 6.50/10."
        assert browser.find_elements(By.ID, "incidents-hint") == [], "the group pages by incidents"
        if os.environ.get("SGW_CONSOLE_INCIDENTS_SCREENSHOT"):
            browser.save_screenshot(os.environ["SGW_CONSOLE_INCIDENTS_SCREENSHOT"])

        # A coverage incident opens meanwhile: the page reads the incidents again (every 10 s).
        asyncio.run(recorded(console.url, group, "inc-cov", "coverage", "open", now - 30, "<b>no scores</b>"))
        wait_for(browser, "#incidents-open .incident[data-incident='inc-cov']", timeout_s=25)
        cov = browser.find_element(By.CSS_SELECTOR, "#incidents-open .incident[data-incident='inc-cov']")
        assert cov.find_element(By.CSS_SELECTOR, ".incident-reason").text == "too many results without a score"
        assert cov.find_element(By.CSS_SELECTOR, ".incident-said").text == "<b>no scores</b>"
        assert browser.find_elements(By.CSS_SELECTOR, "main b") == []
        assert len(browser.find_elements(By.CSS_SELECTOR, "#incidents .incident")) == 3
    finally:
        delete(console, group)


def test_a_group_paging_per_result_is_told_how_to_switch(console: Env, browser: Any) -> None:
    open_group(browser, console, console.group.id)  # alertMode each, no alertNoScoreRate, no incidents
    hint = wait_for(browser, "#incidents-hint")[0].text
    assert "Alerts are per result" in hint and "alertMode to window or drift" in hint
    assert browser.find_elements(By.CSS_SELECTOR, "#incidents .incident") == []
    wait_for(browser, "#chart circle.point")
    assert browser.find_elements(By.CSS_SELECTOR, "#chart .level-line") == [], "no level learned"

    # A group not scored live has nothing to switch.
    open_group(browser, console, console.xss.id)
    assert wait_for(browser, "#incidents-none")[0].text == "No incidents: the group is not scored live."
    assert browser.find_elements(By.ID, "incidents-hint") == []


def test_the_learned_level_is_drawn_on_the_chart_with_its_band(console: Env, browser: Any) -> None:
    group = a_group(console, "Drifting", alertMode="drift", alertDriftSigma=2)
    try:
        asyncio.run(learned(console.url, group.id, 7.0, 0.25, 12))  # spread 0.5: the band is 6-8
        open_group(browser, console, group.id)
        line = wait_for(browser, "#chart svg .level-line")[0]
        assert float(line.get_attribute("y1")) == pytest.approx(y(7.0))
        band = browser.find_element(By.CSS_SELECTOR, "#chart svg .level-band")
        assert float(band.get_attribute("y")) == pytest.approx(y(8.0))
        assert float(band.get_attribute("height")) == pytest.approx(y(6.0) - y(8.0))
        assert browser.find_element(By.CSS_SELECTOR, "#chart .level-label").text == "learned level"
        assert wait_for(browser, "#incident-level")[0].text == \
            "Learned level 7.00, spread 0.50, from 12 windows: drift opens below 6.00"
        assert browser.find_element(By.ID, "incidents-none").text == "No incidents."

        # Another window of the chart keeps the level.
        wait_for(browser, "#chart button[data-window='7d']")[0].click()
        wait_for(browser, "#chart button[data-window='7d'][aria-pressed='true']")  # drawn again
        assert browser.find_elements(By.CSS_SELECTOR, "#chart svg .level-line")
    finally:
        delete(console, group)


def test_the_editor_saves_the_alert_settings_and_shows_a_refused_one_at_its_field(console: Env, browser: Any) -> None:
    group = a_group(console, "Edited alerts")
    try:
        open_group(browser, console, group.id)
        form = browser.find_element(By.ID, "group-form")
        mode = form.find_element(By.CSS_SELECTOR, "[data-field='online.alertMode']")
        assert mode.get_attribute("value") == "each"
        form.find_element(By.CSS_SELECTOR, "[data-field='online.alertMode'] option[value='window']").click()
        form.find_element(By.CSS_SELECTOR, "[data-field='online.alertResolveAbove']").send_keys("7.5")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        WebDriverWait(browser, 10).until(lambda _: online_of(console, group.id).get("alertMode") == "window")
        online = online_of(console, group.id)
        assert online["alertResolveAbove"] == 7.5 and online["alertThreshold"] == 6
        assert "alertWindowSeconds" not in online and "alertNoScoreRate" not in online, "empty inputs are not sent"

        # The page shows the saved settings; a resolve mean below the threshold is refused at its field.
        wait_for(browser, "#group-form [data-field='online.alertResolveAbove'][value='7.5']")  # the page drawn again
        assert "pages by incidents (window)" in browser.find_element(By.CSS_SELECTOR, "main section p.muted").text
        assert wait_for(browser, "#incidents-none")
        form = browser.find_element(By.ID, "group-form")
        assert form.find_element(By.CSS_SELECTOR, "[data-field='online.alertMode']").get_attribute("value") == "window"
        resolve = form.find_element(By.CSS_SELECTOR, "[data-field='online.alertResolveAbove']")
        resolve.clear()
        resolve.send_keys("5")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        error = wait_for(browser, "#group-form .field-error[data-error-for='online.alertResolveAbove']")[0]
        assert "must not be below alertThreshold (6)" in error.text and "invalid" in resolve.get_attribute("class")
        assert browser.find_element(By.ID, "form-message").text == ""
        assert online_of(console, group.id)["alertResolveAbove"] == 7.5, "nothing saved"

        # Emptied, a stored resolve mean is removed (null: back to the threshold); the others stay.
        resolve.clear()
        form.find_element(By.CSS_SELECTOR, "[data-field='online.alertMinResults']").send_keys("25")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        WebDriverWait(browser, 10).until(lambda _: "alertResolveAbove" not in online_of(console, group.id))
        assert online_of(console, group.id)["alertMinResults"] == 25
        assert online_of(console, group.id)["alertMode"] == "window"
    finally:
        delete(console, group)


def test_more_incidents_than_a_page_are_counted_as_a_floor(console: Env, browser: Any) -> None:
    group = a_group(console, "Flapping", alertMode="window")

    async def many() -> None:  # 205 resolved incidents, as their moves left them
        redis = connect(console.url)
        try:
            now = time.time()
            await redis.hset(keys.group_incidents(group.id), mapping={f"inc-{n}": orjson.dumps({
                "id": f"inc-{n}", "groupId": group.id, "projectId": group.project_id, "reason": "window_below",
                "state": "resolved", "openedAt": datetime.fromtimestamp(now - 600 * n, UTC).isoformat(),
                "resolvedAt": datetime.fromtimestamp(now - 600 * n + 300, UTC).isoformat(), "lastSaid": "x",
                "windowMean": 3.0, "windowResults": 10}) for n in range(1, 206)})
        finally:
            await redis.aclose()

    try:
        asyncio.run(many())
        open_group(browser, console, group.id)
        assert len(wait_for(browser, "#incidents-resolved .incident", 20)) == 20
        assert browser.find_element(By.ID, "incidents-earlier").text == "and over 180 earlier", \
            "a page of 200 read: at least 180 more than the 20 shown"
    finally:
        delete(console, group)
