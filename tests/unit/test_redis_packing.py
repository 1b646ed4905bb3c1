"""Redis commands packed in C (``worker.connections``): hiredis packs them, through redis-py's
own serializer for it, into the same bytes as redis-py's asyncio packer for everything the
service sends - command names, keys, fields, ints, binary and long values, floats, a pipeline of
scripts - and refuses what that packer refuses. The client is built with the packed connection
of the URL's scheme: TLS stays TLS, a Unix socket stays one."""

from __future__ import annotations

import random
from typing import Any

import pytest
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import DataError

from worker.connections import CPackedConnection, redis_client
from worker.settings import Settings

CASES: list[tuple[Any, ...]] = [
    ("PING",),
    ("EVALSHA", "a" * 40, 3, "k:{p}:1", "k:{p}:2", "k:{p}:3", "owner:1", 120_000, -1, 0, "field|é|\u2603"),
    ("HSET", b"bytes-key", b"\x00\xff\r\n", "v" * 70_000),
    (b"GET", "k"),
    ("INCRBY", "online-judge-cost:{p}:3600", -123_456_789_012),
    ("SET", "k", 0.1), ("SET", "k", memoryview(b"abc")), ("CONFIG GET", "maxmemory"),
    *(("SET", "k", x) for x in (1e16, 1e-7, -0.0, float("inf"), float("nan"), 1e300, 2**64, -(2**63))),
]


@pytest.mark.parametrize("args", CASES)
def test_the_same_bytes_as_redis_pys_packer(args: tuple[Any, ...]) -> None:
    assert b"".join(CPackedConnection().pack_command(*args)) == b"".join(Connection().pack_command(*args))


def test_packed_in_c_one_buffer_a_command() -> None:
    """redis-py's Python packer cuts a long value into chunks of its own; hiredis writes the
    command as one buffer - the packer in use is hiredis's."""
    command = ("HSET", "k", "f", "v" * 70_000)
    assert len(Connection().pack_command(*command)) > 1
    assert len(CPackedConnection().pack_command(*command)) == 1


def test_a_pipeline_of_random_script_calls_packs_the_same() -> None:
    rng = random.Random(59)
    commands = [("EVALSHA", "f" * 40, 2, *(rng.choice([rng.randint(-10**15, 10**15), f"f{rng.random()}",
                                                        rng.randbytes(rng.randint(0, 40))]) for _ in range(200)))
                for _ in range(50)]
    assert b"".join(CPackedConnection().pack_commands(commands)) == b"".join(Connection().pack_commands(commands))


def test_a_connection_with_another_encoding_packs_as_redis_py_does() -> None:
    """hiredis writes text as UTF-8, strictly: a connection told otherwise packs in Python."""
    command = ("SET", "k", "caf\u00e9")
    latin = CPackedConnection(encoding="latin-1")
    assert b"".join(latin.pack_command(*command)) == b"".join(Connection(encoding="latin-1").pack_command(*command))
    assert b"".join(latin.pack_command(*command)) != b"".join(CPackedConnection().pack_command(*command))


@pytest.mark.parametrize("value", [True, None, object(), "\ud800"])
def test_what_redis_py_refuses_is_refused(value: object) -> None:
    refused = (DataError, UnicodeEncodeError)  # a lone surrogate is not UTF-8 for either packer
    with pytest.raises(refused):
        Connection().pack_command("SET", "k", value)
    with pytest.raises(refused):
        CPackedConnection().pack_command("SET", "k", value)


@pytest.mark.parametrize(("url", "kind"), [("redis://127.0.0.1:6379/0", Connection),
                                           ("rediss://127.0.0.1:6380/0", SSLConnection),
                                           ("unix:///tmp/redis.sock", UnixDomainSocketConnection)])
def test_the_client_packs_in_c_over_the_connection_its_url_asks_for(url: str, kind: type) -> None:
    client = redis_client(Settings(redis_url=url))
    connection_class = client.connection_pool.connection_class
    assert issubclass(connection_class, kind) and issubclass(connection_class, CPackedConnection.__mro__[1])
