"""The Redis client every store takes: one server's, or a Redis Cluster's.

The stores are written for both. Every key that one script, pipeline or transaction touches
together shares a hash tag (``keys.py``), so on a cluster each of them goes to one node whole;
redis-py's cluster client finds the node by the keys and follows it through a failover.
"""

from __future__ import annotations

from typing import TypeAlias

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

RedisClient: TypeAlias = Redis | RedisCluster
