"""Every Redis and Kafka client of the service is built by ``worker.connections``, so that they
all share its options (Redis timeouts; idempotent producers with acks=all; consumers that never
commit by themselves). A client built anywhere else would silently miss them."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.source_trees import parse

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient", "Redis", "RedisCluster"}


def built_clients(path: Path) -> list[str]:
    """Where ``path`` constructs a client: ``Name(...)``, ``Name.from_url(...)`` or ``Name.from_pool(...)``."""
    found = []
    for node in ast.walk(parse(path)):
        if not isinstance(node, ast.Call):
            continue
        target = node.func
        if isinstance(target, ast.Attribute) and target.attr in ("from_url", "from_pool"):
            target = target.value
        if isinstance(target, ast.Name) and target.id in CLIENTS:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {target.id}")
    return found


def test_only_the_connections_module_builds_redis_and_kafka_clients() -> None:
    modules = [p for package in ("scoring", "adapters", "services", "consumers", "worker") for p in (ROOT / package).rglob("*.py")]
    elsewhere = [hit for p in modules if p.name != "connections.py" for hit in built_clients(p)]
    assert elsewhere == []
    assert len(built_clients(ROOT / "worker" / "connections.py")) == 5  # Redis, RedisCluster, producer, consumer, admin
