"""The console's Backfills section in Debian's headless chromium, against the real API
process and Redis of the console tests' fixtures (``tests.support.console_browser``): a job started from a
group's form is listed queued (no worker runs here) and cancelled with its button or through
the API; refused starts show the API's message at the field it names; and a job's progress,
notes, pause and error, written as the runner writes them, appear as the page reads the jobs
again - as text. ``SGW_CONSOLE_BACKFILLS_SCREENSHOT=<path>`` saves the section with a paused job."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from adapters.stores.backfills import JobParts
from scorer_groups import Client
from tests.support import console_browser
from tests.support.console_browser import XSS, Env, sign_in, wait_for
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration

# The console tests' fixtures, for this module: its own API process with its groups, and chromium.

By = pytest.importorskip("selenium.webdriver.common.by").By


def a_group(env: Env, name: str, sample_rate: float) -> Any:
    with Client(env.api.url, env.key) as client:
        return client.monitor.scorer_groups.create(name, members=[m.wire() for m in env.group.members],
                                                   online={"enabled": True, "sampleRate": sample_rate,
                                                           "alertThreshold": 6, "severity": "high"})


def delete(env: Env, group: Any) -> None:
    with Client(env.api.url, env.key) as client:
        client.monitor.scorer_groups.delete(group.id)


def jobs_of(env: Env, group_id: str) -> list[dict[str, Any]]:
    with env.api.client(env.key) as http:
        answer = http.get(f"/v1/scorer-groups/{group_id}/backfills")
        assert answer.status_code == 200, answer.text
        return list(answer.json())


def open_group(browser: Any, env: Env, group_id: str) -> None:
    sign_in(browser, env)
    browser.get(env.api.url + f"/console#/groups/{group_id}")
    wait_for(browser, "#backfill-form")
    wait_for(browser, "#backfill-jobs > *")  # its first read is done


def set_local(browser: Any, field: str, offset_s: int) -> datetime:
    """Types now + offset (to the minute) into a datetime-local input, as the browser's local
    time; the instant it means."""
    iso = browser.execute_script(
        "const d = new Date(Date.now() + arguments[1] * 1000); d.setSeconds(0, 0);"
        "arguments[0].value = localInputValue(d); arguments[0].dispatchEvent(new Event('input'));"
        "return d.toISOString();", browser.find_element(By.CSS_SELECTOR, f"#backfill-form [data-field='{field}']"),
        offset_s)
    return datetime.fromisoformat(iso)


def test_the_estimate_before_the_start_button_says_what_the_job_would_spend_and_starts_nothing(
        console: Env, browser: Any) -> None:
    group = a_group(console, "Estimated", 1.0)
    try:
        open_group(browser, console, group.id)
        browser.find_element(By.ID, "backfill-estimate-button").click()
        said = wait_for(browser, "#backfill-estimate:not(:empty)")[0].text
        traces = console_browser.TRACES  # the topic's, of the last hour: every one in the last day
        assert said.startswith(f"Estimate: {traces} traces, {traces} pairs (+/- 0), {traces} judge calls, "), said
        assert " USD" in said and "the whole window read" in said and "ceilings" in said, said
        assert jobs_of(console, group.id) == [], "an estimate starts nothing"
    finally:
        delete(console, group)


def test_a_backfill_started_from_the_form_is_listed_queued_and_cancelled(console: Env, browser: Any) -> None:
    group = a_group(console, "Backfilled", 0.25)
    try:
        open_group(browser, console, group.id)
        assert browser.find_element(By.ID, "backfill-jobs").text == "No backfills yet."
        form = browser.find_element(By.ID, "backfill-form")
        rate = form.find_element(By.CSS_SELECTOR, "[data-field='sampleRate']")
        assert rate.get_attribute("value") == "0.25", "the group's online rate"
        alerts = form.find_element(By.CSS_SELECTOR, "[data-field='alerts']")
        assert not alerts.is_selected() and "usually noise" in alerts.find_element(By.XPATH, "..").text

        # The last hour, at most 500 judge calls: queued, with a Cancel button, as the API has it.
        form.find_element(By.CSS_SELECTOR, "#bf-window option[value='1h']").click()
        form.find_element(By.CSS_SELECTOR, "[data-field='maxJudgeCalls']").send_keys("500")
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        job = wait_for(browser, "#backfill-jobs .backfill[data-status='queued']")[0]
        assert job.find_element(By.CSS_SELECTOR, ".backfill-status").text == "queued"
        assert "0%: 0 traces read, 0 scored, 0 skipped, 0 of at most 500 judge calls" in job.text
        assert "sample 25%, alerts off" in job.text
        [started] = jobs_of(console, group.id)
        assert job.get_attribute("data-backfill") == started["id"] and started["status"] == "queued"
        window = datetime.fromisoformat(started["from"]), datetime.fromisoformat(started["to"])
        assert window[1] - window[0] == timedelta(hours=1) and window[1].second == 0
        assert window[1] <= datetime.now(UTC) and window[0].utcoffset() is not None
        assert (started["sampleRate"], started["maxJudgeCalls"], started["alerts"]) == (0.25, 500, False)

        # Its Cancel button: cancelled, and no button any more.
        job.find_element(By.CSS_SELECTOR, f"button[data-cancel='{started['id']}']").click()
        done = wait_for(browser, f"#backfill-jobs .backfill[data-backfill='{started['id']}'][data-status='cancelled']")
        assert done[0].find_elements(By.CSS_SELECTOR, "button") == []
        assert jobs_of(console, group.id)[0]["status"] == "cancelled"

        # A custom window with alerts, listed first; cancelled elsewhere, the page reads it again.
        form.find_element(By.CSS_SELECTOR, "[data-field='maxJudgeCalls']").clear()
        begin, end = set_local(browser, "from", -3 * 3600), set_local(browser, "to", -2 * 3600)
        assert form.find_element(By.ID, "bf-window").get_attribute("value") == "custom"
        alerts.click()
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait_for(browser, "#backfill-jobs .backfill", 2)
        second = jobs_of(console, group.id)[0]
        assert (datetime.fromisoformat(second["from"]), datetime.fromisoformat(second["to"])) == (begin, end)
        assert second["alerts"] is True and second["maxJudgeCalls"] is None
        rows = wait_for(browser, "#backfill-jobs .backfill[data-status='queued']")
        assert rows[0].get_attribute("data-backfill") == second["id"], "newest first"
        with console.api.client(console.key) as http:
            assert http.delete(f"/v1/backfills/{second['id']}").status_code == 200
        wait_for(browser, f"#backfill-jobs .backfill[data-backfill='{second['id']}'][data-status='cancelled']")
        assert browser.find_elements(By.CSS_SELECTOR, "#backfill-jobs button") == []
    finally:
        delete(console, group)


def test_refused_starts_show_the_api_message_at_the_field(console: Env, browser: Any) -> None:
    # The XSS-named group has no online profile: the job's sample rate is required.
    open_group(browser, console, console.xss.id)
    form = browser.find_element(By.ID, "backfill-form")
    rate = form.find_element(By.CSS_SELECTOR, "[data-field='sampleRate']")
    assert rate.get_attribute("value") == "" and "required" in form.find_element(By.CSS_SELECTOR, "label[for=f-sampleRate]").text
    submit = form.find_element(By.CSS_SELECTOR, "button[type=submit]")
    submit.click()
    error = wait_for(browser, "#backfill-form .field-error[data-error-for='sampleRate']")[0]
    assert "required" in error.text and "invalid" in rate.get_attribute("class")

    # At most 0 judge calls: refused by the request's own validation, at its field.
    rate.send_keys("0.5")
    calls = form.find_element(By.CSS_SELECTOR, "[data-field='maxJudgeCalls']")
    calls.send_keys("0")
    submit.click()
    error = wait_for(browser, "#backfill-form .field-error[data-error-for='maxJudgeCalls']")[0]
    assert "greater than or equal to 1" in error.text
    assert browser.find_elements(By.CSS_SELECTOR, "#backfill-form .field-error[data-error-for='sampleRate']") == []

    # A window that ends in the future.
    calls.clear()
    set_local(browser, "to", 2 * 3600)
    submit.click()
    error = wait_for(browser, "#backfill-form .field-error[data-error-for='to']")[0]
    assert "must not be in the future" in error.text
    assert "invalid" in form.find_element(By.CSS_SELECTOR, "[data-field='to']").get_attribute("class")
    assert browser.find_element(By.ID, "backfill-form-message").text == ""
    assert jobs_of(console, console.xss.id) == [] and browser.find_element(By.ID, "backfill-jobs").text == "No backfills yet."
    assert browser.find_elements(By.CSS_SELECTOR, "main img") == []


async def as_the_runner(url: str, step: str, job_id: str) -> None:
    redis = connect(url)
    parts = JobParts(redis)
    try:
        if step == "read":
            await parts.save_plan(job_id, {0: (0, 100)}, [f"partition 0: {XSS}"])
            await parts.advance(job_id, 0, 40, tracesRead=40, pairsScored=30, pairsSkipped=2, judgeCalls=25)
        elif step == "pause":
            assert await parts.pause(job_id, datetime.now(UTC) + timedelta(minutes=30))
        else:
            await parts.finish(job_id, "failed", error="<b>the traces topic is gone</b>")
    finally:
        await redis.aclose()


def test_a_jobs_progress_pause_notes_and_error_are_shown_as_text_as_they_change(console: Env, browser: Any) -> None:
    group = a_group(console, "Watched", 0.5)
    try:
        with console.api.client(console.key) as http:
            now = datetime.now(UTC)
            started = http.post(f"/v1/scorer-groups/{group.id}/backfills", json={
                "from": (now - timedelta(days=1)).isoformat(), "to": now.isoformat()})
            assert started.status_code == 202, started.text
            job_id = started.json()["id"]
        open_group(browser, console, group.id)
        at = f"#backfill-jobs .backfill[data-backfill='{job_id}']"
        wait_for(browser, at + "[data-status='queued']")

        asyncio.run(as_the_runner(console.url, "read", job_id))
        job = wait_for(browser, at + "[data-status='running']")[0]
        assert job.find_element(By.CSS_SELECTOR, ".backfill-counts").text == \
            "40%: 40 traces read, 30 scored, 2 skipped, 25 judge calls"
        assert job.find_element(By.TAG_NAME, "progress").get_attribute("value") == "0.4"
        assert [n.text for n in job.find_elements(By.CSS_SELECTOR, ".backfill-notes li")] == [f"partition 0: {XSS}"]
        assert browser.find_elements(By.CSS_SELECTOR, "main img") == [], "a note became markup"

        asyncio.run(as_the_runner(console.url, "pause", job_id))
        job = wait_for(browser, at + "[data-status='paused']")[0]
        assert job.find_element(By.CSS_SELECTOR, ".backfill-paused").text.startswith("paused until ")
        assert job.find_elements(By.CSS_SELECTOR, f"button[data-cancel='{job_id}']"), "a paused job can be cancelled"
        if os.environ.get("SGW_CONSOLE_BACKFILLS_SCREENSHOT"):
            browser.execute_script("document.getElementById('backfills').scrollIntoView()")
            browser.save_screenshot(os.environ["SGW_CONSOLE_BACKFILLS_SCREENSHOT"])

        asyncio.run(as_the_runner(console.url, "fail", job_id))
        job = wait_for(browser, at + "[data-status='failed']")[0]
        assert job.find_element(By.CSS_SELECTOR, ".backfill-error").text == "<b>the traces topic is gone</b>"
        assert job.find_elements(By.CSS_SELECTOR, "button") == [] and browser.find_elements(By.CSS_SELECTOR, "main b") == []
        assert job.find_elements(By.CSS_SELECTOR, ".backfill-paused") == []
    finally:
        delete(console, group)
