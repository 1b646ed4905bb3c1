"""``reviews``: a project's review queues from the command line - list them with their
counts, list a queue's items, a group's agreement with people, export a queue's labelled items to
a dataset. Acts as the project (``--project``), on the Redis catalog like ``catalog``."""

from __future__ import annotations

import argparse
import json

from adapters.stores.datasets import DatasetStore
from services.groups import Caller, MonitorClient
from services.review_queues import ReviewQueues
from worker.cli.common import with_client
from worker.settings import Settings


def cmd_reviews(settings: Settings, args: argparse.Namespace) -> int:
    async def action(client: MonitorClient) -> int:
        queues = ReviewQueues(client.store, Caller(project_id=args.project, actor="cli"))
        if args.action == "list":
            for queue in await queues.list():
                _, _, counts = await queues.items(queue.id, limit=1)
                print(f"{queue.id}  {queue.name}  groups {','.join(queue.group_ids)}  open {counts['open']}  "
                      f"taken {counts['taken']}  turned away {counts['turnedAway']}")
        elif args.action == "items":
            items, _, counts = await queues.items(args.queue, state="all" if args.all else "open", limit=args.limit)
            for item in items:
                subject = item.subject.trace_id or item.subject.session_id or ""
                print(f"{item.id}  {item.reason:12}  {subject}  rating {item.rating.rating}")
            print(f"({counts['open']} open, {counts['taken']} taken, {counts['turnedAway']} turned away)")
        elif args.action == "agreement":
            print(json.dumps((await queues.agreement(args.group)).wire(), indent=2))
        else:  # export
            rows = await queues.export_rows(args.queue)
            queue = await queues.get(args.queue)
            store = DatasetStore(client.store.redis)
            dataset = (await store.add_version(queue.project_id, args.dataset, rows) if args.dataset else
                       await store.create(queue.project_id, args.name or queue.name, rows,
                                          description=f"Labelled items of review queue {queue.id}"))
            print(f"dataset {dataset.id} version {dataset.version}: {dataset.row_count} labelled items")
        return 0

    return with_client(settings, action)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    reviews = sub.add_parser("reviews", help="a project's review queues: list, items, agreement, export")
    actions = reviews.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="the project's queues with their counts")
    items = actions.add_parser("items", help="a queue's open items, oldest first")
    items.add_argument("queue")
    items.add_argument("--all", action="store_true", help="every item kept, newest first")
    items.add_argument("--limit", type=int, default=50)
    agreement = actions.add_parser("agreement", help="a group's judges against people (JSON)")
    agreement.add_argument("group")
    export = actions.add_parser("export", help="a dataset version of a queue's labelled items")
    export.add_argument("queue")
    export.add_argument("--name", help="a new dataset's name (default: the queue's)")
    export.add_argument("--dataset", help="add a version to this dataset instead")
    for parser in (listing, items, agreement, export):
        parser.add_argument("--project", required=True, help="the project the queues belong to")
        parser.set_defaults(func=cmd_reviews)
