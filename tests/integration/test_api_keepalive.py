"""A request on a kept-alive connection answers in about its handling time: the SDK and
the console keep connections alive, and each of their calls paid 40-44 ms - Nagle's algorithm
holding a response's body until the client acknowledged its head, which the client delays. The
API's listening socket sets TCP_NODELAY, and accepted connections inherit it."""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Iterator

import pytest

from scorer_groups import Client
from tests.support.api_process import ApiProcess, api_with_key
from tests.support.redis_databases import RedisDatabases
from worker.api import bind

pytestmark = pytest.mark.integration

DELAYED_ACK_S = 0.040  # what each kept-alive call paid before


@pytest.fixture
def api(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiProcess, str]]:
    with api_with_key(redis_databases, tmp_path_factory.mktemp("api"), "p-alive") as (process, key):
        yield process, key


def test_the_sdks_kept_alive_calls_answer_in_about_their_handling_time(api: tuple[ApiProcess, str]) -> None:
    process, key = api
    with Client(process.url, key) as client:
        client.monitor.scorer_groups.list()  # the connection is open from here on
        took = []
        for _ in range(30):
            started = time.perf_counter()
            client.monitor.scorer_groups.list()
            took.append(time.perf_counter() - started)
    assert statistics.median(took) < DELAYED_ACK_S / 2, sorted(round(t * 1000, 1) for t in took)


def test_the_listening_socket_sends_without_delay() -> None:
    sock = bind("127.0.0.1", 0)
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        sock.close()
