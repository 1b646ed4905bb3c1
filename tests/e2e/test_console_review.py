"""The console's review page in Debian's headless chromium, against a real API process
and Redis, signed in with a reviewer key alone: the key sees the review and nothing else; by
keyboard only, a person rates (1 then 0 is ten), chooses members and agrees or disagrees, opens
the judge calls, undoes, saves and takes the next item, and goes back to change the label of the
one before - each label as the API keeps it. An item's tenant text is shown as text. The group's
page shows the judges' agreement with people's labels. ``SGW_CONSOLE_REVIEW_SCREENSHOT=<path>``
saves the review page."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from adapters.stores.ratings import RatingsStore
from adapters.stores.review_items import ReviewItems
from scorer_groups.review_queues import ReviewItem, ReviewQueue
from scoring.results import HistoryEntry
from scoring.review_rules import review_item_id
from tests.support import console_browser
from tests.support.api_process import ApiProcess, create_key
from tests.support.console_browser import XSS, wait_for
from tests.support.redis_clients import connect
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration


By = pytest.importorskip("selenium.webdriver.common.by").By

PROJECT = "p-console-review"


class Env:
    def __init__(self, process: ApiProcess, admin: str, reviewer: str, queue: ReviewQueue, group: dict[str, Any],
                 items: list[ReviewItem]) -> None:
        self.process, self.admin, self.reviewer, self.queue, self.group, self.items = \
            process, admin, reviewer, queue, group, items

    def get(self, path: str) -> Any:
        with self.process.client(self.admin) as http:
            answer = http.get(path)
            assert answer.status_code == 200, answer.text
            return answer.json()


def an_item(queue: ReviewQueue, group: dict[str, Any], n: int, text: str) -> tuple[ReviewItem, HistoryEntry]:
    at = datetime.fromtimestamp(time.time() + n, UTC).isoformat()
    judge, pattern = (m["refId"] for m in group["members"])
    rating = {"id": f"r-{n}", "groupId": group["id"], "groupName": group["name"], "projectId": PROJECT,
              "agentId": "a", "scope": "trace", "traceId": f"t-{n}", "kind": f"scorer-group:{group['id']}",
              "rating": 3.0, "reason": None, "justification": f"Weighted blend {n}", "scoredAt": at,
              "members": [{"kind": "judge", "refId": judge, "name": "Helpful", "weight": 1.0, "gate": False,
                           "status": "scored", "native": 3.0, "goodness": 0.3, "detail": "Vague answer."},
                          {"kind": "pattern", "refId": pattern, "name": "PII", "weight": 1.0, "gate": True,
                           "status": "scored", "native": False, "goodness": 1.0, "detail": None}]}
    item = ReviewItem.model_validate({
        "id": review_item_id(queue.id, f"r-{n}"), "queueId": queue.id, "projectId": PROJECT, "groupId": group["id"],
        "ratingId": f"r-{n}", "reason": "below", "origin": "live", "createdAt": at,
        "subject": {"scope": "trace", "traceId": f"t-{n}", "input": text, "output": f"answer {n}"},
        "rating": rating})
    call = {"refId": judge, "member": "Helpful", "model": "judge-model",
            "messages": [{"role": "user", "content": f"Rate the answer to question {n}", "length": 30}],
            "answer": '{"score": 3, "reason": "vague"}', "answerLength": 32, "startedAt": at, "latencyMs": 9.0,
            "attempts": 1}
    kept = HistoryEntry(group["id"], 3.0, True, time.time(), orjson.dumps(rating), rating_id=f"r-{n}",
                        calls=orjson.dumps([call]))
    return item, kept


async def fill(url: str, made: list[tuple[ReviewItem, HistoryEntry]], queue: ReviewQueue) -> None:
    redis = connect(url)
    try:
        await RatingsStore(redis).write([kept for _, kept in made])
        for n, (item, _) in enumerate(made):  # one at a time: oldest first
            await ReviewItems(redis).take([(item, queue)], time.time() + n * 0.01)
    finally:
        await redis.aclose()


@pytest.fixture(scope="module")
def console(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with redis_databases.lease() as url:
        admin = create_key(url, "--project", PROJECT)
        reviewer = create_key(url, "--project", PROJECT, "--role", "reviewer", "--name", "ann")
        process = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log").start()
        try:
            with process.client(admin) as http:
                judge = http.post("/v1/judges", json={"name": "Helpful", "criteria": "Helpful?"}).json()["id"]
                pattern = http.post("/v1/patterns", json={"name": "PII", "polarity": "failure",
                                                          "template": "email"}).json()["id"]
                group = http.post("/v1/scorer-groups", json={
                    "name": "Release bar", "members": [{"kind": "judge", "refId": judge},
                                                       {"kind": "pattern", "refId": pattern, "gate": True}],
                    "online": {"enabled": True, "sampleRate": 1, "alertThreshold": 6, "severity": "high"}}).json()
                made = http.post("/v1/review-queues", json={"name": "Below the bar", "groupIds": [group["id"]],
                                                            "rule": {"below": True}, "reviewersPerItem": 2})
                assert made.status_code == 201, made.text
            queue = ReviewQueue.model_validate(made.json())
            items = [an_item(queue, group, 0, XSS), an_item(queue, group, 1, "How do I reset my password?")]
            asyncio.run(fill(url, items, queue))
            yield Env(process, admin, reviewer, queue, group, [item for item, _ in items])
        finally:
            process.stop()


def keys(browser: Any, typed: str) -> None:
    browser.find_element(By.TAG_NAME, "body").send_keys(typed)


def text_of(browser: Any, css: str) -> str:
    return str(browser.execute_script("return document.querySelector(arguments[0]).innerText;", css))


def wait_text(browser: Any, css: str, wanted: str, timeout_s: float = 10) -> None:
    """Waits for ``css`` to say ``wanted`` (the page redraws an item whole: an element read may go)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        said = browser.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText : null;",
                                      css)
        if said is not None and wanted in said:
            return
        time.sleep(0.05)
    raise AssertionError(f"{css!r} never said {wanted!r}: {browser.find_element(By.TAG_NAME, 'main').text}")


def marks(browser: Any) -> list[str]:
    return list(browser.execute_script(
        "return [...document.querySelectorAll('#review-members .member-mark')].map((m) => m.dataset.mark);"))


def test_a_reviewer_key_reviews_by_keyboard_alone(browser: Any, console: Env) -> None:
    browser.get(console.process.url + "/console")
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()
    wait_for(browser, "#api-key")[0].send_keys(console.reviewer)
    browser.find_element(By.CSS_SELECTOR, "#sign-in button").click()
    wait_for(browser, f"#queues tr[data-queue='{console.queue.id}']")
    shown = [a.get_attribute("href").rsplit("#", 1)[1] for a in browser.find_elements(By.CSS_SELECTOR, "#nav a")
             if a.is_displayed()]
    assert shown == ["/reviews"], f"a reviewer key is offered the review alone: {shown}"

    browser.find_element(By.CSS_SELECTOR, f"#queues tr[data-queue='{console.queue.id}'] a.review-link").click()
    wait_for(browser, "#review-members li", 2)
    wait_text(browser, "#review-progress", "2 open · 0 yours · 0 done")
    first = console.items[0]
    assert text_of(browser, "#review-input") == XSS, "the tenant's text is shown as text"
    assert not browser.find_elements(By.CSS_SELECTOR, "#review img"), "and never as markup"
    assert "null" not in text_of(browser, "#review"), "nothing the item lacks is written out"

    keys(browser, "10")  # 1 then 0: ten
    wait_text(browser, "#review-rating", "10")
    keys(browser, "7")
    wait_text(browser, "#review-rating", "7")
    keys(browser, "u")  # undo: ten again
    wait_text(browser, "#review-rating", "10")
    keys(browser, "jd")  # the second member (the pattern): disagree
    keys(browser, "ka")  # the first (the judge): agree
    assert marks(browser) == ["agree", "disagree"]
    keys(browser, "c")  # what the judge read, one key away
    wait_text(browser, "#review-calls", "Rate the answer to question 0")
    if path := os.environ.get("SGW_CONSOLE_REVIEW_SCREENSHOT"):
        browser.save_screenshot(path)

    keys(browser, "n")  # save, and the next item
    wait_text(browser, "#review-input", "How do I reset my password?")
    wait_text(browser, "#review-progress", "2 open · 1 yours · 0 done")
    judge, pattern = (m["refId"] for m in console.group["members"])
    (label,) = console.get(f"/v1/review-items/{first.id}")["labels"]
    assert (label["reviewer"], label["rating"], label["version"]) == ("ann", 10.0, 1)
    assert label["members"] == {judge: {"agree": True, "rating": None}, pattern: {"agree": False, "rating": None}}

    keys(browser, "u")  # nothing changed here: back to the item labelled before, its label on it
    wait_text(browser, "#review-input", XSS)
    wait_text(browser, "#review-rating", "10")
    assert marks(browser) == ["agree", "disagree"]
    keys(browser, "3n")  # a changed label while the item is open, then on to the item still held
    wait_text(browser, "#review-input", "How do I reset my password?")
    (label,) = console.get(f"/v1/review-items/{first.id}")["labels"]
    assert (label["rating"], label["version"]) == (3.0, 2)

    keys(browser, "n")  # no rating yet: nothing is saved, and the page says why
    wait_text(browser, "#review-message", "Give a rating first")
    assert console.get(f"/v1/review-items/{console.items[1].id}")["labels"] == []


def test_the_groups_page_shows_the_judges_agreement_with_people(browser: Any, console: Env) -> None:
    with console.process.client(console.admin) as http:  # a queue of its own: the other test's items stay as they are
        made = http.post("/v1/review-queues", json={"name": "Spot checks", "groupIds": [console.group["id"]],
                                                    "rule": {"sampleRate": 0.1}})
        assert made.status_code == 201, made.text
        queue = ReviewQueue.model_validate(made.json())
        asyncio.run(fill(console.process.redis_url, [an_item(queue, console.group, 7, "Spot check")], queue))
        held = http.post(f"/v1/review-queues/{queue.id}/next")  # an admin key may review too
        assert held.status_code == 200, held.text
        assert http.put(f"/v1/review-items/{held.json()['item']['id']}/labels/me",
                        json={"rating": 5}).status_code == 200
    live = console.get(f"/v1/scorer-groups/{console.group['id']}/agreement")
    console_browser.sign_in_at(browser, console.process.url, console.admin)
    browser.get(f"{console.process.url}/console#/groups/{console.group['id']}")
    wait_for(browser, "#live-agreement #agreement-summary")
    assert live["labelledItems"] >= 1
    assert f"{live['agreement']['labelledRows']} rows carry a human verdict" in text_of(browser, "#agreement-summary")


def test_a_result_is_put_in_a_queue_from_the_groups_results(browser: Any, console: Env) -> None:
    with console.process.client(console.admin) as http:
        made = http.post("/v1/review-queues", json={"name": "By hand", "groupIds": [console.group["id"]],
                                                    "rule": {"below": True}})
        assert made.status_code == 201, made.text
    queue = made.json()["id"]
    console_browser.sign_in_at(browser, console.process.url, console.admin)
    browser.get(f"{console.process.url}/console#/groups/{console.group['id']}")
    (result,) = wait_for(browser, "#results .result[data-rating='r-1']")
    Select = pytest.importorskip("selenium.webdriver.support.ui").Select
    Select(result.find_element(By.CSS_SELECTOR, "select.add-to-queue")).select_by_value(queue)
    result.find_element(By.CSS_SELECTOR, "button.add-to-queue-button").click()
    wait_text(browser, "#results .result[data-rating='r-1'] .add-to-queue-said", "added")
    result.find_element(By.CSS_SELECTOR, "button.add-to-queue-button").click()
    wait_text(browser, "#results .result[data-rating='r-1'] .add-to-queue-said", "already there")
    items = console.get(f"/v1/review-queues/{queue}/items")["items"]
    assert [(i["ratingId"], i["reason"]) for i in items] == [("r-1", "added")]
