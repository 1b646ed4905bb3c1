"""aiokafka's chatter while a cluster settles (leaders being elected, the coordinator starting)
goes to debug; a broker that cannot be reached, or any other error, keeps its level."""

from __future__ import annotations

import logging

import pytest
from aiokafka.errors import GroupCoordinatorNotAvailableError

from worker.logs import SettlingChatter


def shown(record: logging.LogRecord, show_debug: bool = False) -> tuple[bool, str]:
    return SettlingChatter(show_debug).filter(record), record.levelname


def record(name: str, level: int, message: str, exc: BaseException | None = None) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, None, (type(exc), exc, None) if exc else None)


@pytest.mark.parametrize("message", [
    "Failed fetch messages from 1: [Error 6] NotLeaderForPartitionError",
    "Group Coordinator Request failed: [Error 15] GroupCoordinatorNotAvailableError",
    "Topic traces.ingested not found in cluster metadata",
])
def test_settling_chatter_is_debug(message: str) -> None:
    assert shown(record("aiokafka.consumer.fetcher", logging.WARNING, message)) == (False, "DEBUG")
    assert shown(record("aiokafka.consumer.fetcher", logging.ERROR, message), show_debug=True) == (True, "DEBUG")


def test_a_settling_exception_is_debug_too() -> None:
    error = GroupCoordinatorNotAvailableError()
    assert shown(record("aiokafka.consumer.group_coordinator", logging.ERROR, "join failed", error)) == (False, "DEBUG")


@pytest.mark.parametrize("name, message", [
    ("aiokafka.conn", "Unable connect to node with id 1: KafkaConnectionError"),  # the broker is not there
    ("aiokafka.consumer.fetcher", "Unexpected error: TopicAuthorizationFailedError"),
    ("worker.app", "NotLeaderForPartitionError seen while publishing"),  # ours: never touched
])
def test_faults_keep_their_level(name: str, message: str) -> None:
    assert shown(record(name, logging.ERROR, message)) == (True, "ERROR")
