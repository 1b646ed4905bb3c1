"""The ``scorer-worker`` command line."""

from __future__ import annotations

import argparse
import asyncio
import sys

from worker.logs import configure_logging
from worker.settings import Settings


def _cmd_settings(settings: Settings, _: argparse.Namespace) -> int:
    for env, value, description in settings.described():
        print(f"{env}={value}\n    {description}")
    return 0


async def _check(settings: Settings) -> list[str]:
    """Reach Kafka and Redis once; return what failed."""
    from aiokafka.admin import AIOKafkaAdminClient
    from redis.asyncio import Redis

    problems = []
    redis = Redis.from_url(settings.redis_url)
    try:
        info = await redis.info("server")
        print(f"redis   {settings.redis_url}  version {info['redis_version']}")
    except Exception as exc:
        problems.append(f"redis at {settings.redis_url}: {exc}")
    finally:
        await redis.aclose()
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        topics = await admin.list_topics()
        print(f"kafka   {settings.kafka_bootstrap}  cluster {cluster['cluster_id']}  "
              f"{len(cluster['brokers'])} broker(s), {len(topics)} topic(s)")
    except Exception as exc:
        problems.append(f"kafka at {settings.kafka_bootstrap}: {exc}")
    finally:
        await admin.close()
    return problems


def _cmd_check(settings: Settings, _: argparse.Namespace) -> int:
    problems = asyncio.run(_check(settings))
    for problem in problems:
        print(f"unreachable: {problem}", file=sys.stderr)
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scorer-worker", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("settings", help="print every SGW_* setting, secrets masked").set_defaults(
        func=_cmd_settings)
    sub.add_parser("check", help="reach Kafka and Redis once").set_defaults(func=_cmd_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings()
    configure_logging(settings.log_format, settings.log_level)
    return int(args.func(settings, args))


if __name__ == "__main__":
    sys.exit(main())
