"""``run``, ``api``, ``keys``, ``webhooks`` and ``settings``: the service's processes and what operators do to them."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from adapters.stores.apikeys import ApiKeyStore
from scoring.redact import Redactor
from worker.cli.common import with_client
from worker.settings import Settings


def cmd_run(settings: Settings, _: argparse.Namespace) -> int:
    from worker.app import StartupError, Worker

    async def run_or_refuse() -> int:
        # Either way, exit from inside the loop, not by returning: the event loop's close cancels
        # every task left and waits for it, and one that never ends on cancellation (an abandoned
        # Kafka bootstrap, a client left behind by worker.shutdown.close_all) would hang the
        # process after its work was done. The worker's own shutdown has committed and closed.
        try:
            code = await Worker(settings).run()
        except StartupError as exc:
            print(f"error: cannot start: {Redactor.from_environment(settings.secrets())(str(exc))}",
                  file=sys.stderr, flush=True)
            code = 2  # nothing was consumed: nothing to drain
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    if settings.event_loop == "uvloop":
        import uvloop  # a dependency of the package: an ImportError here is a broken install, said as such

        return uvloop.run(run_or_refuse())
    return asyncio.run(run_or_refuse())


def cmd_new_secret(_settings: Settings, _: argparse.Namespace) -> int:
    from scorer_groups.signing import new_secret

    print(new_secret())
    return 0


def cmd_api(settings: Settings, _: argparse.Namespace) -> int:
    from worker.api import serve

    return asyncio.run(serve(settings))


def _with_keys(settings: Settings, action: Callable[[ApiKeyStore], Awaitable[int]]) -> int:
    return with_client(settings, lambda client: action(ApiKeyStore(client.store.redis)))


def cmd_keys_create(settings: Settings, args: argparse.Namespace) -> int:
    async def action(store: ApiKeyStore) -> int:
        try:
            key, token = await store.create(None if args.operator else args.project, args.name or "",
                                            getattr(args, "role", "admin"))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        scope = "operator key (every project)" if key.operator else f"project {key.project}"
        role = " (reviewer: review queues only)" if key.role == "reviewer" else ""
        print(f"created key {key.id} ({key.name}) for {scope}{role}; it is shown once, store it now:")
        print(token)  # alone on the last line, for scripts
        return 0

    return _with_keys(settings, action)


def cmd_keys_list(settings: Settings, args: argparse.Namespace) -> int:
    async def action(store: ApiKeyStore) -> int:
        for key in await store.list(args.project):
            created = datetime.fromtimestamp(key.created_at, UTC).strftime("%Y-%m-%d %H:%M")
            state = "active" if key.active else "revoked"
            print(f"{key.id}  {state:7}  {key.role:8}  {key.project or '(operator)':20}  {created}  {key.name}")
        return 0

    return _with_keys(settings, action)


def cmd_keys_revoke(settings: Settings, args: argparse.Namespace) -> int:
    async def action(store: ApiKeyStore) -> int:
        key = await store.revoke(args.id)
        print(f"revoked key {key.id} ({key.name})")
        return 0

    return _with_keys(settings, action)


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from worker.webhooks import parse_since, replay

    try:
        since = parse_since(args.since) if args.since else None
    except ValueError:
        print(f"error: --since {args.since!r} is neither a duration (2h, 3d) nor an ISO time", file=sys.stderr)
        return 2
    asyncio.run(replay(settings, channel=args.channel, since=since))
    return 0


def cmd_settings(settings: Settings, _: argparse.Namespace) -> int:
    for env, value, description in settings.described():
        print(f"{env}={value}\n    {description}")
    return 0
