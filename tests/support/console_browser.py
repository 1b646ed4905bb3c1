"""The console tests' browser and API: Debian's headless chromium through chromedriver (kept on
loopback: every host name but 127.0.0.1 resolves to nothing, its background services are off),
and a module's API process with its groups, ratings history and a dataset run (``env``) - shared
by the console's test modules (``tests.e2e.test_console*``), which import the fixtures."""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from adapters.stores.ratings import RatingsStore
from devtools.judge_server import JudgeServer
from scorer_groups import Client
from scorer_groups.documents import MemberVerdict, Rating
from scoring.results import HistoryEntry
from tests.support.api_process import ApiProcess, create_key
from tests.support.redis_clients import connect
from tests.support.redis_databases import RedisDatabases

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install '.[test]')")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

XSS = "<img src=x onerror=alert(1)>"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
LOOPBACK_ONLY = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1700", "--no-first-run",
    "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-default-apps", "--disable-domain-reliability", "--disable-breakpad",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no chromium/chromedriver here (Debian: apt-get install chromium chromium-driver; "
                    "devtools/bootstrap.sh installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in LOOPBACK_ONLY:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


class Env:
    def __init__(self, api: ApiProcess, key: str, group: Any, xss: Any, hours: list[int], results: int,
                 url: str) -> None:
        self.api, self.key, self.group, self.xss, self.hours, self.results = api, key, group, xss, hours, results
        self.url = url  # the API's Redis database


def a_rating(group: Any, n: int, score: float, at: float) -> Rating:
    members = [MemberVerdict(kind="judge", ref_id=group.members[0].ref_id, name="Helpful", weight=1, gate=False,
                             status="scored", native=score, goodness=score / 10, detail=f"Judge says {score}"),
               MemberVerdict(kind="pattern", ref_id=group.members[1].ref_id, name="PII", weight=1, gate=True,
                             status="scored", native=False, goodness=1.0, detail=None)]
    return Rating(id=f"r-{n}", kind=f"scorer-group:{group.id}", group_id=group.id, group_name=group.name,
                  project_id=group.project_id, agent_id="support", scope="trace", trace_id=f"trace-{n}",
                  rating=score, reason=None, justification=f"Weighted blend: {score:.2f}/10 (row {n})",
                  scored_at=datetime.fromtimestamp(at, UTC), members=members)


@pytest.fixture(scope="module")
def console(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory, kafka_bootstrap: str) -> Iterator[Env]:
    with JudgeServer() as judge, redis_databases.lease() as url:
        key, other = create_key(url, "--project", "p-console"), create_key(url, "--project", "p-other")
        # A backfill's estimate reads the traces topic: one of its own, with TRACES traces in it.
        topic = f"console-traces-{uuid.uuid4().hex[:8]}"
        asyncio.run(produce_traces(kafka_bootstrap, topic, "p-console"))
        api = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log",
                         env={"SGW_JUDGE_BASE_URL": judge.base_url, "SGW_JUDGE_TIMEOUT_S": "5",
                              "SGW_KAFKA_BOOTSTRAP": kafka_bootstrap, "SGW_TRACES_TOPIC": topic,
                              "SGW_JUDGE_PRICES": '{"gpt-4o-mini": {"input": 2, "output": 10}}'}).start()
        try:
            with Client(api.url, key) as client, Client(api.url, other) as elsewhere:
                helpful = client.monitor.judges.create(name="Helpful", criteria="Helpful?")
                pii = client.monitor.patterns.create(name="PII", polarity="failure", template="email")
                members = [{"kind": "judge", "refId": helpful.id, "weight": 1},
                           {"kind": "pattern", "refId": pii.id, "weight": 1, "gate": True}]
                online = {"enabled": True, "sampleRate": 0.5, "alertThreshold": 6, "severity": "high"}
                group = client.monitor.scorer_groups.create("Release bar", members=members, online=online)
                xss = client.monitor.scorer_groups.create(XSS, members=members)
                e_judge = elsewhere.monitor.judges.create(name="Theirs", criteria="?")
                elsewhere.monitor.scorer_groups.create("Another project's group",
                                                       members=[{"kind": "judge", "refId": e_judge.id}])
                dataset = client.datasets.create("Release questions", rows=[{"input": "q1"}, {"input": "q2"}])
                client.evaluations.run(dataset_id=dataset.id, subject={"kind": "custom_agent", "displayName": "bot"},
                                       scorer_group_id=group.id).execute(lambda q: f"{q} [[rating=9]]").finalize()
            # Ratings as the worker records them: the history buckets and the latest results.
            now, hours = time.time(), [9, 6, 3, 1]  # oldest first, as the worker records them
            events = []
            for n, hour in enumerate(hours):
                for k, score in enumerate((4.0, 7.0, 9.0)):
                    r = a_rating(group, n * 3 + k, score, now - hour * 3600)
                    # its judge call's cost, in nanos (0.0025 USD); the first one's is unknown (unpriced)
                    events.append(HistoryEntry(group.id, score, score < 6, r.scored_at.timestamp(), r.to_json(),
                                               costs=() if not events else ((helpful.id, 2_500_000),),
                                               unpriced=0 if events else 1, judge_calls=1))
            asyncio.run(record(url, events))
            yield Env(api, key, group, xss, hours, len(events), url)
        finally:
            api.stop()


TRACES = 8  # the console's traces topic: of the last hour


async def produce_traces(bootstrap: str, topic: str, project: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        now = datetime.now(UTC)
        for n in range(TRACES):
            trace = {"traceId": f"bf-{n}", "projectId": project, "agentId": "a",
                     "timestamp": (now - timedelta(minutes=30 + n)).isoformat(),
                     "spans": [{"spanId": "r", "input": "q", "output": f"answer {n}"}]}
            # stamped in the past: the console's windows end at the current minute
            await producer.send_and_wait(topic, orjson.dumps(trace), key=trace["traceId"].encode(),
                                         timestamp_ms=int((now - timedelta(minutes=30 + n)).timestamp() * 1000))
    finally:
        await producer.stop()


async def record(url: str, events: list[HistoryEntry]) -> None:
    redis = connect(url)
    await RatingsStore(redis).write(events)
    await redis.aclose()


async def count_matched(url: str, group_id: str, traces: int) -> None:
    redis = connect(url)
    await RatingsStore(redis).write_counts(time.time(), matched={group_id: traces})
    await redis.aclose()


def wait_for(driver: Any, css: str, count: int = 1, timeout_s: float = 15) -> list[Any]:
    try:
        WebDriverWait(driver, timeout_s).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, css)) >= count)
    except TimeoutException:
        raise AssertionError(f"no {count} x {css!r} on the page: {driver.find_element(By.TAG_NAME, 'main').text}") \
            from None
    return driver.find_elements(By.CSS_SELECTOR, css)


def sign_in_at(browser: Any, url: str, key: str) -> None:
    """Signs in to the console at ``url`` with ``key``, afresh: the tab's sessionStorage is the
    only place the key lives. Back on the groups page."""
    browser.get(url + "/console")
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()
    wait_for(browser, "#api-key")[0].send_keys(key)
    browser.find_element(By.CSS_SELECTOR, "#sign-in button").click()
    wait_for(browser, "#groups")


def sign_in(browser: Any, env: Env) -> None:
    """Each test signs in on its own, on this module's environment (its two groups listed)."""
    sign_in_at(browser, env.api.url, env.key)
    wait_for(browser, "#groups tbody tr", 2)
