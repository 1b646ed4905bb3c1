"""``grade``, ``templates`` and ``datasets``: dataset runs graded here (CI gates), the judge
rubric templates, and a project's datasets."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from services.groups import MonitorClient
from worker.cli.common import with_client
from worker.settings import Settings


def cmd_grade(settings: Settings, args: argparse.Namespace) -> int:
    from scorer_groups.gates import parse_allowance
    from worker.grading import GradeOptions, grade, write_to

    if args.scorer and args.fail_under is None:
        print("error: --scorer names the judge member a --fail-under gate applies to", file=sys.stderr)
        return 2
    try:
        allow_unscored = parse_allowance(args.allow_unscored)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    request = GradeOptions(
        input_path=args.input, group_id=args.group, scorer_id=args.scorer_id,
        additional_scorer_ids=tuple(args.additional_scorer_id), output_path=args.output,
        fail_under=args.fail_under, gate_scorer=args.scorer, concurrency=args.concurrency,
        publish=args.publish, allow_unscored=allow_unscored, with_calls=args.with_calls, cache=not args.no_cache,
        outside_budget=args.outside_budget)
    out = write_to(args.output)
    try:
        return asyncio.run(grade(settings, request, out, sys.stderr))
    finally:
        if out is not sys.stdout:
            out.close()


def cmd_templates(_settings: Settings, args: argparse.Namespace) -> int:
    """The shipped judge rubrics; one template whole; or its rows people labelled, as the JSONL
    ``grade`` reads - grade them with a judge made from it to see its agreement with people."""
    from scoring.judge_templates import BY_NAME, TEMPLATES

    if args.name is None:
        for t in TEMPLATES:
            print(f"{t.name:22} {t.title}: reads {t.reads[0].lower()}{t.reads[1:]}")
        return 0
    template = BY_NAME.get(args.name)
    if template is None:
        print(f"error: no judge template named {args.name!r} (templates: {', '.join(BY_NAME)})", file=sys.stderr)
        return 2
    if args.examples:
        for row in template.examples:
            print(json.dumps(row))
    else:
        print(json.dumps(template.model_dump(mode="json", by_alias=True), indent=2))
    return 0


def cmd_datasets(settings: Settings, args: argparse.Namespace) -> int:
    """datasets create|version|list: rows from a JSONL or CSV file, one version per upload."""
    from adapters.stores.datasets import DatasetStore, format_of, parse_rows

    text = ""
    if args.action != "list":
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print(f"error: cannot read {args.file}: {exc}", file=sys.stderr)
            return 2

    async def action(client: MonitorClient) -> int:
        store = DatasetStore(client.store.redis)
        if args.action == "list":
            for d in await store.list(args.project):
                print(f"{d.id}  v{d.version}  {d.row_count:6} rows  {d.name}")
            return 0
        rows = parse_rows(text, format_of(args.file))
        if args.action == "create":
            dataset = await store.create(args.project, args.name or Path(args.file).stem, rows,
                                         dataset_id=args.id)
        else:
            dataset = await store.add_version(args.project, args.id, rows)
        print(f"dataset {dataset.id} ({dataset.name}) version {dataset.version}: {dataset.row_count} rows")
        return 0

    return with_client(settings, action)
