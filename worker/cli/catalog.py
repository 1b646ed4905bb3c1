"""``catalog``, ``groups ratings`` and ``sessions scores``: the catalog of scorers and groups,
read and written in Redis."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from scoring.catalog import KIND_MODELS
from services.groups import MonitorClient
from worker.cli.common import with_client
from worker.settings import Settings


def load_document(path: str) -> Any:
    text = Path(path).read_text()
    return json.loads(text) if path.endswith(".json") else yaml.safe_load(text)


def cmd_apply(settings: Settings, args: argparse.Namespace) -> int:
    try:
        document = load_document(args.file)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"error: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2

    async def action(client: MonitorClient) -> int:
        report = await client.apply(document)
        for label, names in (("created", report.created), ("changed", report.changed),
                             ("unchanged", report.unchanged)):
            for name in names:
                print(f"{label:9}  {name}")
        print(f"{len(report.created)} created, {len(report.changed)} changed, "
              f"{len(report.unchanged)} unchanged")
        return 0

    return with_client(settings, action)


def cmd_list(settings: Settings, args: argparse.Namespace) -> int:
    async def action(client: MonitorClient) -> int:
        snapshot = await client.store.snapshot()
        for kind in [args.kind] if args.kind else list(KIND_MODELS):
            for id_, doc in sorted(getattr(snapshot, kind).items()):
                name = getattr(doc, "name", "")
                print(f"{kind:9}  {id_}  {name}")
        return 0

    return with_client(settings, action)


def cmd_get(settings: Settings, args: argparse.Namespace) -> int:
    async def action(client: MonitorClient) -> int:
        doc = getattr(await client.store.snapshot(), args.kind).get(args.id)
        if doc is None:
            print(f"error (404): no {args.kind[:-1]} with id {args.id!r}", file=sys.stderr)
            return 1
        print(json.dumps(doc.wire(), indent=2))
        return 0

    return with_client(settings, action)


def cmd_delete(settings: Settings, args: argparse.Namespace) -> int:
    async def action(client: MonitorClient) -> int:
        await client.scorers.delete(args.kind, args.id)
        print(f"deleted {args.kind}/{args.id}")
        return 0

    return with_client(settings, action)


def cmd_ratings(settings: Settings, args: argparse.Namespace) -> int:
    async def action(client: MonitorClient) -> int:
        history = await client.scorer_groups.ratings(args.id, window=args.window)
        if args.json:
            print(json.dumps(history.wire(), indent=2))
            return 0
        mean = "-" if history.mean is None else f"{history.mean:.2f}"
        print(f"group {args.id}, last {args.window}: {history.count} results, {history.scored} scored, "
              f"mean {mean}, {history.below} below threshold, {history.no_score} without a score, "
              f"{history.skipped} skipped for budget")
        print(f"{'bucket start (UTC)':20} {'count':>6} {'mean':>6} {'min':>6} {'max':>6} "
              f"{'below':>6} {'no score':>8} {'skipped':>7}")
        for b in history.buckets:
            if not b.count and not b.skipped:
                continue
            start = datetime.fromtimestamp(b.start, UTC).strftime("%Y-%m-%d %H:%M")
            mean, low, high = ("-" if v is None else f"{v:.2f}" for v in (b.mean, b.min, b.max))
            print(f"{start:20} {b.count:6} {mean:>6} {low:>6} {high:>6} {b.below:6} {b.no_score:8} {b.skipped:7}")
        return 0

    return with_client(settings, action)


def cmd_session_scores(settings: Settings, args: argparse.Namespace) -> int:
    async def action(client: MonitorClient) -> int:
        print(json.dumps(await client.sessions.scores(args.id), indent=2))
        return 0

    return with_client(settings, action)
