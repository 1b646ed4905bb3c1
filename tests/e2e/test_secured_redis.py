"""Redis as managed services offer it: TLS (a ``rediss://`` URL, the server's certificate checked
against ``SGW_REDIS_CA_FILE``) and an ACL user in place of the default one - Debian's
redis-server with a CA and certificate the test makes (``devtools.redis_servers.RedisTls``). The
CLI applies a catalog and makes a key over it, the API grades in its playground (the claims'
Lua scripts included), the live-scoring scenario runs whole; a wrong password and an untrusted
certificate each end a worker's start with one line naming the setting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from devtools.judge_server import JudgeServer
from devtools.processes import free_port
from devtools.redis_servers import LocalRedis, LocalRedisCluster, RedisTls
from tests.support.api_process import ApiProcess, cli, create_key
from tests.support.harness import worker_env
from tests.support.http_fakes import Reply, ScriptedServer
from tests.support.live_scoring import catalog, check_live_scoring

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def redis_tls() -> Iterator[LocalRedis]:
    server = LocalRedis(tls=RedisTls()).start()
    try:
        yield server
    finally:
        server.stop()


def ca(server: LocalRedis) -> str:
    assert server.tls is not None and server.tls.certificates is not None
    return str(server.tls.certificates.ca)


@pytest.fixture(autouse=True)
def the_ca_for_the_cli(redis_tls: LocalRedis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGW_REDIS_CA_FILE", ca(redis_tls))  # tests.support.api_process passes os.environ on


def grade_over(url: str, project: str, rating: int, tmp_path: Path) -> str:
    """Through the CLI (a key) and the API (a judge, a group, a playground grading - the claims'
    Lua scripts included) on the store at ``url``; the group's id, read back by the CLI."""
    with JudgeServer() as judge:
        key = create_key(url, "--project", project)
        api = ApiProcess(url, tmp_path / "api.log", env={"SGW_JUDGE_BASE_URL": judge.base_url}).start()
        try:
            with api.client(key) as client:
                judge_doc = client.post("/v1/judges", json={"name": "J", "criteria": "Helpful?"})
                assert judge_doc.status_code == 201, judge_doc.text
                group = client.post("/v1/scorer-groups", json={"name": "G", "members": [
                    {"kind": "judge", "refId": judge_doc.json()["id"]}]}).json()
                graded = client.post(f"/v1/scorer-groups/{group['id']}/grade",
                                     json={"input": "q", "output": f"a [[rating={rating}]]"})
                assert graded.status_code == 200 and graded.json()["rating"] == float(rating), graded.text
        finally:
            api.stop()
    listed = cli(url, "catalog", "list")
    assert listed.returncode == 0 and group["id"] in listed.stdout, listed.stderr
    return str(group["id"])


def test_the_cli_and_the_api_over_tls_as_an_acl_user(redis_tls: LocalRedis, tmp_path: Path) -> None:
    grade_over(redis_tls.url, "p-tls", 8, tmp_path)


@pytest.fixture
async def env(redis_tls: LocalRedis, kafka_bootstrap: str, unique: str,
              tmp_path: Path) -> AsyncIterator[dict[str, str]]:
    with JudgeServer() as judge, ScriptedServer(default=Reply(body={"score": 0.5})) as external, \
            ScriptedServer(default=Reply(status=204, body=b"")) as receiver:
        document = tmp_path / "catalog.json"
        document.write_text(json.dumps(catalog(external.url + "/score", receiver.url)))
        applied = cli(redis_tls.url, "catalog", "apply", str(document))
        assert applied.returncode == 0, applied.stderr
        yield {**worker_env(kafka_bootstrap, redis_tls.url, unique, topic_partitions=2, judge_base_url=judge.base_url,
                            judge_timeout_s=5, egress_allow="127.0.0.0/8", max_trace_bytes=4096,
                            commit_interval_s=0.2),
               "SGW_REDIS_CA_FILE": ca(redis_tls)}


async def test_live_scoring_with_redis_over_tls(env: dict[str, str], kafka_bootstrap: str, tmp_path: Path) -> None:
    await check_live_scoring(env, kafka_bootstrap, tmp_path)


def start_with(server: LocalRedis, kafka_bootstrap: str, url: str, **overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SGW_")}, "PYTHONPATH": str(ROOT),
           **worker_env(kafka_bootstrap, url, "refused-redis"), "SGW_REDIS_CA_FILE": ca(server), **overrides,
           "SGW_METRICS_PORT": str(free_port())}  # not the default 9108: another test's worker may hold it
    return subprocess.run([sys.executable, "-m", "worker.cli", "run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def refused(done: subprocess.CompletedProcess[str], names: str) -> str:
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and names in errors[0], done.stderr[-3000:]
    return errors[0]


def test_a_wrong_password_is_one_line_naming_the_setting(redis_tls: LocalRedis, kafka_bootstrap: str) -> None:
    assert redis_tls.tls is not None
    wrong = redis_tls.url.replace(redis_tls.tls.password, "not-the-password-5e")
    done = start_with(redis_tls, kafka_bootstrap, wrong)
    refused(done, "SGW_REDIS_URL")
    assert "not-the-password-5e" not in done.stderr and redis_tls.tls.password not in done.stderr


def test_an_untrusted_certificate_is_one_line_naming_the_setting(redis_tls: LocalRedis, kafka_bootstrap: str) -> None:
    done = start_with(redis_tls, kafka_bootstrap, redis_tls.url, SGW_REDIS_CA_FILE="")
    refused(done, "SGW_REDIS_CA_FILE")


def test_a_redis_cluster_over_tls_as_an_acl_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 kafka_bootstrap: str) -> None:
    # Three primaries and their replicas, every link TLS (clients, the bus, replication).
    cluster = LocalRedisCluster(tls=RedisTls()).start()
    try:
        assert cluster.tls is not None and cluster.tls.certificates is not None
        monkeypatch.setenv("SGW_REDIS_CA_FILE", str(cluster.tls.certificates.ca))
        monkeypatch.setenv("SGW_REDIS_CLUSTER", "true")
        assert cluster.url.startswith("rediss://")
        grade_over(cluster.url, "p-cluster", 6, tmp_path)
        wrong = cluster.url.replace(cluster.tls.password, "not-the-password-c1")
        refused(start_with(cluster.nodes[0], kafka_bootstrap, wrong, SGW_REDIS_CLUSTER="true"), "SGW_REDIS_URL")
    finally:
        cluster.stop()
