"""``backfill``: grade a group's past traffic again; list or cancel its jobs."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime

from pydantic import ValidationError

from adapters.stores.backfills import BackfillStore
from scorer_groups.api_models import BACKFILL_ENDED, BackfillCreate, BackfillEstimate, BackfillJob
from scorer_groups.backfills import BackfillBar, backfill_body, parse_when
from scoring.errors import CatalogError, InvalidDocument
from scoring.redact import Redactor
from services.groups import Caller, MonitorClient
from worker.backfill_estimates import backfill_estimate
from worker.cli.common import with_client
from worker.settings import Settings

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


def _estimate_line(e: BackfillEstimate) -> str:
    cost = "cost unknown (a judge model has no price)" if e.cost is None else f"{e.cost:.6g} {e.currency}"
    how = "the whole window read" if e.exact else "a sample of the window read"
    error = "error unknown: too little read" if e.pairs_error is None else f"+/- {e.pairs_error}, 95%"
    return (f"estimate: {e.traces} traces, {e.pairs} pairs ({error}), {e.judge_calls} judge calls, "
            f"{e.tokens} tokens, {cost}{', stopped at --max-judge-calls' if e.capped else ''} - {how}; "
            f"spend from the group's {'recent averages' if e.basis == 'history' else 'ceilings (no history yet)'}")


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


def cmd_backfill(settings: Settings, args: argparse.Namespace) -> int:
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
            if args.estimate:  # a dry run: what the job would grade and spend, nothing started
                client = MonitorClient(client.store.redis, Caller(project_id=args.project))
                print(_estimate_line(await backfill_estimate(client, settings, group.id, _backfill_request(args))))
                return 0
            job = await store.start(group, _backfill_request(args))  # the API's checks, the API's words
        except CatalogError as exc:
            return _refused(exc.errors)
        print(_job_line(job), flush=True)
        return await _follow(store, job, Redactor.from_environment(settings.secrets())) if args.follow else 0

    try:
        return with_client(settings, action)
    except KeyboardInterrupt:  # only following stops: the job goes on in the workers
        print("\nstopped following; the job goes on (backfill --cancel JOB stops it)", file=sys.stderr)
        return 130
