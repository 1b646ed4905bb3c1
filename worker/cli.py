"""The ``scorer-worker`` command line.

    scorer-worker run                              consume traces and score them (the service)
    scorer-worker grade --group ID --input run.jsonl [--fail-under 7 [--scorer Safety] [--allow-unscored N]]
    scorer-worker datasets create FILE --project P [--name N] [--id ID]   JSONL or CSV rows, version 1
    scorer-worker datasets version ID FILE --project P                   the next version
    scorer-worker datasets list --project P
    scorer-worker catalog apply FILE               apply a catalog file (YAML or JSON), idempotent
    scorer-worker catalog list [KIND]              list documents
    scorer-worker catalog get KIND ID              show one document (secrets masked)
    scorer-worker catalog delete KIND ID           delete one document
    scorer-worker groups ratings ID [--window 7d] [--json]
    scorer-worker backfill --group G --since 24h --project P [--until ISO|DURATION] [--sample-rate R]
                  [--max-judge-calls N] [--alerts] [--follow]     grade a group's past traffic again
    scorer-worker backfill --list --group G --project P            the group's jobs, newest first
    scorer-worker backfill --cancel JOB --project P                cancel a job that has not ended
    scorer-worker sessions scores SESSION_ID
    scorer-worker webhooks new-secret              print a fresh whsec_ channel secret
    scorer-worker webhooks replay [--channel AGENT|URL] [--since 2h|ISO]   resend dead letters
    scorer-worker api                              the HTTP API (SGW_API_PORT)
    scorer-worker keys create (--project P | --operator) [--name N]   prints the key once, last line
    scorer-worker keys list [--project P]          keys (never their secrets)
    scorer-worker keys revoke KEY_ID               refused from the next request on
    scorer-worker settings                         every SGW_* setting, secrets masked
    scorer-worker check                            reach Kafka and Redis once
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from scorer_groups.api_models import BACKFILL_ENDED, BackfillCreate, BackfillJob
from scorer_groups.backfills import BackfillBar, backfill_body, parse_when
from scoring.catalog import KIND_MODELS
from scoring.errors import CatalogError, InvalidDocument
from scoring.groups import Caller, MonitorClient
from scoring.redact import Redactor, mask_url
from scoring.stores.apikeys import ApiKeyStore
from scoring.stores.backfills import BackfillStore
from worker.connections import redis_client
from worker.logs import configure_logging, use_known_secrets
from worker.settings import Settings


def _with_client(settings: Settings, action: Callable[[MonitorClient], Awaitable[int]]) -> int:
    async def go() -> int:
        redis = redis_client(settings)
        try:
            return await action(MonitorClient(redis))
        finally:
            await redis.aclose()

    try:
        return asyncio.run(go())
    except CatalogError as exc:
        print(f"error ({exc.status}):", file=sys.stderr)
        for line in exc.errors:
            print(f"  - {line}", file=sys.stderr)
        return 2


def load_document(path: str) -> Any:
    text = Path(path).read_text()
    return json.loads(text) if path.endswith(".json") else yaml.safe_load(text)


def _cmd_apply(settings: Settings, args: argparse.Namespace) -> int:
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

    return _with_client(settings, action)


def _cmd_list(settings: Settings, args: argparse.Namespace) -> int:
    async def action(client: MonitorClient) -> int:
        snapshot = await client.store.snapshot()
        for kind in [args.kind] if args.kind else list(KIND_MODELS):
            for id_, doc in sorted(getattr(snapshot, kind).items()):
                name = getattr(doc, "name", "")
                print(f"{kind:9}  {id_}  {name}")
        return 0

    return _with_client(settings, action)


def _cmd_get(settings: Settings, args: argparse.Namespace) -> int:
    async def action(client: MonitorClient) -> int:
        doc = getattr(await client.store.snapshot(), args.kind).get(args.id)
        if doc is None:
            print(f"error (404): no {args.kind[:-1]} with id {args.id!r}", file=sys.stderr)
            return 1
        print(json.dumps(doc.wire(), indent=2))
        return 0

    return _with_client(settings, action)


def _cmd_delete(settings: Settings, args: argparse.Namespace) -> int:
    async def action(client: MonitorClient) -> int:
        await client.scorers.delete(args.kind, args.id)
        print(f"deleted {args.kind}/{args.id}")
        return 0

    return _with_client(settings, action)


def _cmd_ratings(settings: Settings, args: argparse.Namespace) -> int:
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

    return _with_client(settings, action)


def _cmd_session_scores(settings: Settings, args: argparse.Namespace) -> int:
    async def action(client: MonitorClient) -> int:
        print(json.dumps(await client.sessions.scores(args.id), indent=2))
        return 0

    return _with_client(settings, action)


def _cmd_grade(settings: Settings, args: argparse.Namespace) -> int:
    from scorer_groups.gates import parse_allowance
    from worker.grading import GradeRequest, grade, write_to

    if args.scorer and args.fail_under is None:
        print("error: --scorer names the judge member a --fail-under gate applies to", file=sys.stderr)
        return 2
    try:
        allow_unscored = parse_allowance(args.allow_unscored)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    request = GradeRequest(
        input_path=args.input, group_id=args.group, scorer_id=args.scorer_id,
        additional_scorer_ids=tuple(args.additional_scorer_id), output_path=args.output,
        fail_under=args.fail_under, gate_scorer=args.scorer, concurrency=args.concurrency,
        publish=args.publish, allow_unscored=allow_unscored)
    out = write_to(args.output)
    try:
        return asyncio.run(grade(settings, request, out, sys.stderr))
    finally:
        if out is not sys.stdout:
            out.close()


def _cmd_templates(_settings: Settings, args: argparse.Namespace) -> int:
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


def _cmd_datasets(settings: Settings, args: argparse.Namespace) -> int:
    """datasets create|version|list: rows from a JSONL or CSV file, one version per upload."""
    from scoring.stores.datasets import DatasetStore, format_of, parse_rows

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

    return _with_client(settings, action)


FOLLOW_POLL_S = 1.0


def _refused(errors: list[str]) -> int:
    """A refusal as the API words it, one line per field: ``error: <field>: <why>``."""
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    return 2


def _backfill_request(args: argparse.Namespace) -> BackfillCreate:
    """The request from the flags, its times read as the SDK reads them (against one ``now``) and
    the whole checked by the API's own model: InvalidDocument naming the flag or field otherwise."""
    now, ends, wrong = datetime.now(UTC), {}, []
    for flag, value in (("--since", args.since), ("--until", args.until)):
        try:
            if value is not None:
                ends[flag] = parse_when(value, now)
        except ValueError as exc:
            wrong.append(f"{flag}: {exc}")
    if wrong:
        raise InvalidDocument.of(wrong)
    body = backfill_body(ends["--since"], ends.get("--until"), args.sample_rate, args.max_judge_calls,
                         args.alerts, now=now)
    try:
        return BackfillCreate.model_validate(body)
    except ValidationError as exc:
        raise InvalidDocument.from_validation(exc) from None


def _job_line(job: BackfillJob) -> str:
    window = f"{job.from_.isoformat(timespec='seconds')} to {job.to.isoformat(timespec='seconds')}"
    extras = "".join([f", at most {job.max_judge_calls} judge calls" if job.max_judge_calls else "",
                      ", with alerts" if job.alerts else ""])
    return f"backfill {job.id} {job.status}: group {job.group_id}, {window}, sample rate {job.sample_rate:g}{extras}"


def _job_summary(job: BackfillJob, redact: Redactor) -> list[str]:
    """How a followed job ended: its counts, its error and notes (redacted: they may quote a
    member's failure)."""
    p = job.progress
    lines = [f"backfill {job.id} {job.status}: {p.traces_read} traces read, {p.pairs_scored} pairs scored, "
             f"{p.pairs_skipped} skipped, {p.judge_calls} judge calls"]
    lines += [f"note: {redact(note)}" for note in job.notes]
    if job.error:
        lines.append(f"error: {redact(job.error)}")
    return lines


async def _follow(store: BackfillStore, job: BackfillJob, redact: Redactor) -> int:
    """Poll the job until it ends, its bar on stderr when that is a terminal: 0 done, else 1."""
    bar = BackfillBar(None)
    while job.status not in BACKFILL_ENDED:
        bar.draw(job)
        await asyncio.sleep(FOLLOW_POLL_S)
        job = await store.get(job.id, job.project_id)
    bar.draw(job)
    print("\n".join(_job_summary(job, redact)), flush=True)
    return 0 if job.status == "done" else 1


def _cmd_backfill(settings: Settings, args: argparse.Namespace) -> int:
    """backfill: start a job on a group's past traffic (--follow: until it ends), --list a group's
    jobs or --cancel one; always within --project (another project's group or job is not found)."""
    if args.cancel is None and args.group is None:
        return _refused(["--group: required (the group whose jobs to start or list)"])
    if args.cancel is None and not args.list and args.since is None:
        return _refused(["--since: required: the window's start, a duration back (24h, 7d, 90m) or an ISO time"])

    async def action(client: MonitorClient) -> int:
        store = BackfillStore(client.store.redis)
        try:
            if args.cancel is not None:
                print(f"backfill {(await store.cancel(args.cancel, args.project)).id} cancelled")
                return 0
            # The group as the project's own key sees it: another project's is not found.
            groups = MonitorClient(client.store.redis, Caller(project_id=args.project)).scorer_groups
            group = await groups.get(args.group)
            if args.list:
                for job in await store.of_group(group.id):
                    print(_job_line(job))
                return 0
            job = await store.start(group, _backfill_request(args))  # the API's checks, the API's words
        except CatalogError as exc:
            return _refused(exc.errors)
        print(_job_line(job), flush=True)
        return await _follow(store, job, Redactor.from_environment(settings.secrets())) if args.follow else 0

    try:
        return _with_client(settings, action)
    except KeyboardInterrupt:  # only following stops: the job goes on in the workers
        print("\nstopped following; the job goes on (backfill --cancel JOB stops it)", file=sys.stderr)
        return 130


def _cmd_run(settings: Settings, _: argparse.Namespace) -> int:
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


def _cmd_new_secret(_settings: Settings, _: argparse.Namespace) -> int:
    from scorer_groups.signing import new_secret

    print(new_secret())
    return 0


def _cmd_api(settings: Settings, _: argparse.Namespace) -> int:
    from worker.api import serve

    return asyncio.run(serve(settings))


def _with_keys(settings: Settings, action: Callable[[ApiKeyStore], Awaitable[int]]) -> int:
    return _with_client(settings, lambda client: action(ApiKeyStore(client.store.redis)))


def _cmd_keys_create(settings: Settings, args: argparse.Namespace) -> int:
    async def action(store: ApiKeyStore) -> int:
        key, token = await store.create(None if args.operator else args.project, args.name or "")
        scope = "operator key (every project)" if key.operator else f"project {key.project}"
        print(f"created key {key.id} ({key.name}) for {scope}; it is shown once, store it now:")
        print(token)  # alone on the last line, for scripts
        return 0

    return _with_keys(settings, action)


def _cmd_keys_list(settings: Settings, args: argparse.Namespace) -> int:
    async def action(store: ApiKeyStore) -> int:
        for key in await store.list(args.project):
            created = datetime.fromtimestamp(key.created_at, UTC).strftime("%Y-%m-%d %H:%M")
            state = "active" if key.active else "revoked"
            print(f"{key.id}  {state:7}  {key.project or '(operator)':20}  {created}  {key.name}")
        return 0

    return _with_keys(settings, action)


def _cmd_keys_revoke(settings: Settings, args: argparse.Namespace) -> int:
    async def action(store: ApiKeyStore) -> int:
        key = await store.revoke(args.id)
        print(f"revoked key {key.id} ({key.name})")
        return 0

    return _with_keys(settings, action)


def _cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    from worker.webhooks import parse_since, replay

    try:
        since = parse_since(args.since) if args.since else None
    except ValueError:
        print(f"error: --since {args.since!r} is neither a duration (2h, 3d) nor an ISO time", file=sys.stderr)
        return 2
    asyncio.run(replay(settings, channel=args.channel, since=since))
    return 0


def _cmd_settings(settings: Settings, _: argparse.Namespace) -> int:
    for env, value, description in settings.described():
        print(f"{env}={value}\n    {description}")
    return 0


async def _check(settings: Settings, skip_judge: bool = False) -> list[str]:
    """Reach Kafka and Redis once, and make one small judge call; return what failed."""

    problems = []
    redact = Redactor.from_environment(settings.secrets())
    redis = redis_client(settings)
    try:
        info = await redis.info("server")
        print(f"redis   {mask_url(settings.redis_url)}  version {info['redis_version']}")
    except Exception as exc:
        problems.append(f"redis at {mask_url(settings.redis_url)}: {redact(str(exc))}")
    finally:
        await redis.aclose()
    from worker.app import StartupError, connected_admin

    admin = None
    try:
        admin = await connected_admin(settings)
        cluster = await admin.describe_cluster()
        print(f"kafka   {settings.kafka_bootstrap}  cluster {cluster['cluster_id']}  "
              f"{len(cluster['brokers'])} broker(s)")
    except StartupError as exc:  # the setting to look at, already said
        problems.append(redact(str(exc)))
    except Exception as exc:
        problems.append(f"kafka at {settings.kafka_bootstrap}: {redact(str(exc))}")
    finally:
        if admin is not None:
            await admin.close()
    if not skip_judge:
        problems += await _check_judge(settings, redact)
    if settings.judge_trace_export == "otlp":
        problems += await _check_judge_spans(settings, redact)
    return problems


async def _check_judge_spans(settings: Settings, redact: Redactor) -> list[str]:
    """An export of no spans to SGW_JUDGE_TRACE_ENDPOINT: reached, and the headers accepted."""
    from consumers.judge_export import JudgeCallExporter

    endpoint = mask_url(settings.judge_trace_endpoint)
    exporter = JudgeCallExporter(settings.judge_trace_endpoint, headers=settings.judge_trace_export_headers())
    try:
        problem = await exporter.probe()
    finally:
        await exporter.close()
    if problem is not None:
        return [f"judge span export at {endpoint}: {redact(problem)}"]
    print(f"spans   {endpoint}  took an export (OTLP/HTTP)")
    return []


async def _check_judge(settings: Settings, redact: Redactor) -> list[str]:
    """One small judge call, as a member would make it: it answers, in which shape, how fast."""
    from scoring.models import Judge
    from scoring.ports import MemberError
    from scoring.subjects import Subject
    from worker.engine import judge_client

    client = judge_client(settings)
    judge = Judge(id="check", name="Check", criteria="Is the answer a friendly greeting?")
    subject = Subject(scope="trace", input="Say hello.", output="Hello! How can I help?", expected=None, spans=[],
                      metadata={}, transcript="", project_id="scorer-worker-check", agent_id="check", trace_id="check")
    started = time.perf_counter()
    try:
        verdict = await client.grade(judge, subject)
    except MemberError as exc:
        return [f"judge at {mask_url(settings.judge_base_url)} (model {settings.judge_model}): {redact(str(exc))}"]
    finally:
        await client.close()
    shape = client.shape_for(settings.judge_model)
    print(f"judge   {mask_url(settings.judge_base_url)}  model {settings.judge_model}  rating {verdict.rating:g} "
          f"in {(time.perf_counter() - started) * 1000:.0f} ms  ({shape.described()})")
    if shape.token_limit != settings.judge_token_limit_param:
        print(f"        the endpoint refused {settings.judge_token_limit_param}: set "
              f"SGW_JUDGE_TOKEN_LIMIT_PARAM={shape.token_limit} to save a call per model")
    if shape.response_format != settings.judge_response_format:
        print("        the endpoint refused response_format: set SGW_JUDGE_RESPONSE_FORMAT=false "
              "to save a call per model")
    return []


def _cmd_check(settings: Settings, args: argparse.Namespace) -> int:
    problems = asyncio.run(_check(settings, skip_judge=args.no_judge))
    for problem in problems:
        print(f"unreachable: {problem}", file=sys.stderr)
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scorer-worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="consume traces and score them").set_defaults(func=_cmd_run)

    grade = sub.add_parser("grade", help="grade a dataset run (JSONL) with a scorer group")
    grade.add_argument("--group", help="the scorer group id (wins over --scorer-id)")
    grade.add_argument("--scorer-id", help="grade with a single scorer instead of a group")
    grade.add_argument("--additional-scorer-id", action="append", default=[],
                       help="extra scorers graded alongside --scorer-id, reported per row, not in the "
                            "rating (nulled, with a warning, when a group grades the run)")
    grade.add_argument("--input", required=True,
                       help="JSONL rows: input, output, expected?, spans?, metadata?")
    grade.add_argument("--output", help="where the per-row JSON lines go (default: stdout)")
    grade.add_argument("--fail-under", type=float, help="exit 1 when the score is under this")
    grade.add_argument("--scorer", help="with --fail-under: gate this judge member's own average "
                       "(its label; a name several members share is refused)")
    grade.add_argument("--allow-unscored", default="0", metavar="N",
                       help="rows without a score the gate lets pass: a count (3) or a fraction "
                            "(0.1); default 0, the gate fails closed")
    grade.add_argument("--concurrency", type=int, default=8, help="rows graded at once")
    grade.add_argument("--publish", action="store_true", help="also send results to the ratings topic")
    grade.set_defaults(func=_cmd_grade)

    templates = sub.add_parser("templates", help="the judge rubric templates; --examples: a template's "
                                                 "labelled rows, as JSONL for grade")
    templates.add_argument("name", nargs="?", help="one template, whole")
    templates.add_argument("--examples", action="store_true", help="its rows people labelled (JSON Lines)")
    templates.set_defaults(func=_cmd_templates)

    datasets = sub.add_parser("datasets", help="a project's datasets").add_subparsers(dest="action", required=True)
    ds_create = datasets.add_parser("create", help="a dataset from a JSONL or CSV file (its version 1)")
    ds_create.add_argument("file", help="JSONL rows {input, expected?, metadata?}, or CSV with an input column")
    ds_create.add_argument("--project", required=True)
    ds_create.add_argument("--name", help="default: the file's name")
    ds_create.add_argument("--id", help="default: a new ds_... id")
    ds_version = datasets.add_parser("version", help="upload a file as the dataset's next version")
    ds_version.add_argument("id")
    ds_version.add_argument("file")
    ds_version.add_argument("--project", required=True)
    ds_list = datasets.add_parser("list", help="the project's datasets")
    ds_list.add_argument("--project", required=True)
    for p in (ds_create, ds_version, ds_list):
        p.set_defaults(func=_cmd_datasets)

    catalog = sub.add_parser("catalog", help="the catalog of scorers and groups").add_subparsers(
        dest="action", required=True)
    apply = catalog.add_parser("apply", help="apply a catalog file (YAML or JSON)")
    apply.add_argument("file")
    apply.set_defaults(func=_cmd_apply)
    listing = catalog.add_parser("list", help="list documents")
    listing.add_argument("kind", nargs="?", choices=list(KIND_MODELS))
    listing.set_defaults(func=_cmd_list)
    for name, func in (("get", _cmd_get), ("delete", _cmd_delete)):
        p = catalog.add_parser(name, help=f"{name} one document")
        p.add_argument("kind", choices=list(KIND_MODELS))
        p.add_argument("id")
        p.set_defaults(func=func)

    groups = sub.add_parser("groups", help="scorer groups").add_subparsers(dest="action", required=True)
    ratings = groups.add_parser("ratings", help="a group's ratings history")
    ratings.add_argument("id")
    ratings.add_argument("--window", default="7d", choices=["1h", "24h", "7d", "30d"])
    ratings.add_argument("--json", action="store_true")
    ratings.set_defaults(func=_cmd_ratings)

    backfill = sub.add_parser("backfill", help="grade a group's past traffic again; list or cancel its jobs")
    backfill.add_argument("--project", required=True, help="the project of the group (or job)")
    backfill.add_argument("--group", help="the scorer group")
    backfill.add_argument("--since", help="the window's start: a duration back (24h, 7d, 90m) or an ISO time "
                                          "with a zone")
    backfill.add_argument("--until", help="the window's end (excluded), the same way; default now")
    backfill.add_argument("--sample-rate", type=float, help="default: the group's online sampleRate")
    backfill.add_argument("--max-judge-calls", type=int, help="the most judge calls the job makes")
    backfill.add_argument("--alerts", action="store_true", help="raise Signals and deliveries for what it grades")
    backfill.add_argument("--follow", action="store_true",
                          help="draw its progress until it ends: exit 0 when done, 1 when failed or cancelled")
    instead = backfill.add_mutually_exclusive_group()
    instead.add_argument("--list", action="store_true", help="list the group's jobs instead, newest first")
    instead.add_argument("--cancel", metavar="JOB", help="cancel this job instead")
    backfill.set_defaults(func=_cmd_backfill)

    sessions = sub.add_parser("sessions", help="sessions").add_subparsers(dest="action", required=True)
    scores = sessions.add_parser("scores", help="the latest group verdicts on a session")
    scores.add_argument("id")
    scores.set_defaults(func=_cmd_session_scores)

    webhooks = sub.add_parser("webhooks", help="alert-channel deliveries").add_subparsers(
        dest="action", required=True)
    webhooks.add_parser("new-secret", help="print a fresh Standard Webhooks (whsec_) channel secret") \
        .set_defaults(func=_cmd_new_secret)
    replay = webhooks.add_parser("replay", help="send dead-lettered deliveries again")
    replay.add_argument("--channel", help="only this agent's channels, this URL, or agent|url")
    replay.add_argument("--since", help="only dead letters since: a duration back (2h, 3d) or an ISO time")
    replay.set_defaults(func=_cmd_replay)

    sub.add_parser("api", help="serve the HTTP API on SGW_API_PORT").set_defaults(func=_cmd_api)
    api_keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="action", required=True)
    create = api_keys.add_parser("create", help="create a key; it is printed once, on the last line")
    owner = create.add_mutually_exclusive_group(required=True)
    owner.add_argument("--project", help="the project the key acts for")
    owner.add_argument("--operator", action="store_true", help="a key that may act on every project")
    create.add_argument("--name", help="who or what uses the key (shown in change logs)")
    create.set_defaults(func=_cmd_keys_create)
    list_keys = api_keys.add_parser("list", help="list keys (never their secrets)")
    list_keys.add_argument("--project")
    list_keys.set_defaults(func=_cmd_keys_list)
    revoke = api_keys.add_parser("revoke", help="revoke a key at once")
    revoke.add_argument("id")
    revoke.set_defaults(func=_cmd_keys_revoke)

    sub.add_parser("settings", help="print every SGW_* setting, secrets masked").set_defaults(
        func=_cmd_settings)
    check = sub.add_parser("check", help="reach Kafka and Redis once, make one small judge call, and try the "
                                         "judge span export when it is on")
    check.add_argument("--no-judge", action="store_true", help="skip the judge call (it is billed like any)")
    check.set_defaults(func=_cmd_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings()
    except ValidationError as exc:
        print("error: invalid settings:", file=sys.stderr)
        for error in exc.errors(include_url=False):
            name = f"SGW_{str(error['loc'][0]).upper()}" if error["loc"] else "(settings)"
            shown = Redactor.from_environment()(repr(error.get("input")))
            print(f"  - {name}: {error['msg']} (got {shown})", file=sys.stderr)
        return 2
    configure_logging(settings.log_format, settings.log_level)
    use_known_secrets(settings.secrets())
    return int(args.func(settings, args))


if __name__ == "__main__":
    sys.exit(main())
