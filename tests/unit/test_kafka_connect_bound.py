"""The worker's first connection to Kafka is bounded: a broker address that accepts the TCP
connection and never answers (a stalled TLS bootstrap looks the same from here) is tried again
with a new client, and then ends the start with one StartupError - not a start that waits for
minutes under aiokafka's own timeouts."""

from __future__ import annotations

import asyncio
import time

import pytest

from worker import app
from worker.app import StartupError, connected_admin
from worker.settings import Settings


async def test_a_broker_that_never_answers_ends_the_start_within_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # held open, never answered

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setattr(app, "CONNECT_ATTEMPT_S", 0.5)
    started = time.monotonic()
    try:
        with pytest.raises(StartupError) as refused:
            await connected_admin(Settings(kafka_bootstrap=f"127.0.0.1:{port}"))
    finally:
        for writer in accepted:
            writer.close()
        server.close()
    assert time.monotonic() - started < 5, "3 attempts of 0.5 s, not aiokafka's 40 s each"
    assert len(accepted) == app.CONNECT_ATTEMPTS, "each attempt with a new client"
    message = str(refused.value)
    assert f"cannot connect to Kafka at 127.0.0.1:{port}" in message and "no answer in 3 attempts" in message
    assert "SGW_KAFKA_BOOTSTRAP" in message
