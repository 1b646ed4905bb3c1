"""Redis clients for tests: a single server's, or - when the run is against a Redis Cluster
(``SGW_REDIS_CLUSTER=true``, as ``./dev test --redis-cluster`` sets) - a cluster's, the same way
``worker.connections.redis_client`` decides for the worker."""

from __future__ import annotations

import os
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from adapters.stores.client import RedisClient


def on_cluster() -> bool:
    return os.environ.get("SGW_REDIS_CLUSTER", "").lower() in {"1", "true", "yes"}


def connect(url: str, **options: Any) -> RedisClient:
    if on_cluster():
        return redis.asyncio.cluster.RedisCluster.from_url(url, **options)
    return redis.asyncio.Redis.from_url(url, **options)


def connect_sync(url: str, **options: Any) -> redis.Redis | redis.cluster.RedisCluster:
    if on_cluster():
        return redis.cluster.RedisCluster.from_url(url, **options)
    return redis.Redis.from_url(url, **options)
