"""The ``scorer-worker`` command line (``scorer-worker --help`` prints the usage below).

    scorer-worker run                              consume traces and score them (the service)
    scorer-worker grade --group ID --input run.jsonl [--fail-under 7 [--scorer Safety] [--allow-unscored N]]
                  [--with-calls] [--no-cache] [--outside-budget]
    scorer-worker datasets create FILE --project P [--name N] [--id ID]   JSONL or CSV rows, version 1
    scorer-worker datasets version ID FILE --project P                   the next version
    scorer-worker datasets list --project P
    scorer-worker templates [NAME] [--examples]    the judge rubric templates; one whole; its labelled rows
    scorer-worker catalog apply FILE               apply a catalog file (YAML or JSON), idempotent
    scorer-worker catalog list [KIND]              list documents
    scorer-worker catalog get KIND ID              show one document (secrets masked)
    scorer-worker catalog delete KIND ID           delete one document
    scorer-worker groups ratings ID [--window 7d] [--json]
    scorer-worker backfill --group G --since 24h --project P [--until ISO|DURATION] [--sample-rate R]
                  [--max-judge-calls N] [--alerts] [--follow]     grade a group's past traffic again
    scorer-worker backfill ... --estimate                          what it would grade and spend; starts nothing
    scorer-worker backfill --list --group G --project P            the group's jobs, newest first
    scorer-worker backfill --cancel JOB --project P                cancel a job that has not ended
    scorer-worker sessions scores SESSION_ID
    scorer-worker webhooks new-secret              print a fresh whsec_ channel secret
    scorer-worker webhooks replay [--channel AGENT|URL] [--since 2h|ISO]   resend dead letters
    scorer-worker api                              the HTTP API (SGW_API_PORT)
    scorer-worker reviews (list | items Q | agreement G | export Q) --project P   review queues
    scorer-worker keys create (--project P | --operator) [--name N] [--role admin|reviewer]
                                                   prints the key once, last line
    scorer-worker keys list [--project P]          keys (never their secrets)
    scorer-worker keys revoke KEY_ID               refused from the next request on
    scorer-worker settings                         every SGW_* setting, secrets masked
    scorer-worker check [--no-judge]               reach Kafka and Redis once, one judge call, the span export

Each command group is a module of this package (catalog, datasets, backfill, service, check);
this one is the parser and ``main``.
"""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from scoring.catalog import KIND_MODELS
from worker.cli import reviews
from worker.cli.backfill import cmd_backfill
from worker.cli.catalog import cmd_apply, cmd_delete, cmd_get, cmd_list, cmd_ratings, cmd_session_scores
from worker.cli.check import cmd_check
from worker.cli.datasets import cmd_datasets, cmd_grade, cmd_templates
from worker.cli.service import (
    cmd_api,
    cmd_keys_create,
    cmd_keys_list,
    cmd_keys_revoke,
    cmd_new_secret,
    cmd_replay,
    cmd_run,
    cmd_settings,
)
from worker.logs import configure_logging, use_known_secrets
from worker.settings import Settings

# What --help prints: the usage, without the note to the code's readers at its end.
USAGE = (__doc__ or "").split("\n\n", 1)[1].rsplit("\n\nEach command group", 1)[0] + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scorer-worker", description=USAGE,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="consume traces and score them").set_defaults(func=cmd_run)

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
    grade.add_argument("--with-calls", action="store_true",
                       help="each row's line also carries judgeCalls: what each judge was sent and answered "
                            "(cut and masked as a live result's)")
    grade.add_argument("--no-cache", action="store_true",
                       help="ask every judge afresh: verdicts already paid for (the same judge, model and "
                            "messages) are neither read nor kept")
    grade.add_argument("--outside-budget", action="store_true",
                       help="an operator's run outside the project's judge budget: nothing is reserved (the "
                            "summary says so); without it, a row the budget has no room for is not graded")
    grade.set_defaults(func=cmd_grade)

    templates = sub.add_parser("templates", help="the judge rubric templates; --examples: a template's "
                                                 "labelled rows, as JSONL for grade")
    templates.add_argument("name", nargs="?", help="one template, whole")
    templates.add_argument("--examples", action="store_true", help="its rows people labelled (JSON Lines)")
    templates.set_defaults(func=cmd_templates)

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
        p.set_defaults(func=cmd_datasets)

    catalog = sub.add_parser("catalog", help="the catalog of scorers and groups").add_subparsers(
        dest="action", required=True)
    apply = catalog.add_parser("apply", help="apply a catalog file (YAML or JSON)")
    apply.add_argument("file")
    apply.set_defaults(func=cmd_apply)
    listing = catalog.add_parser("list", help="list documents")
    listing.add_argument("kind", nargs="?", choices=list(KIND_MODELS))
    listing.set_defaults(func=cmd_list)
    for name, func in (("get", cmd_get), ("delete", cmd_delete)):
        p = catalog.add_parser(name, help=f"{name} one document")
        p.add_argument("kind", choices=list(KIND_MODELS))
        p.add_argument("id")
        p.set_defaults(func=func)

    groups = sub.add_parser("groups", help="scorer groups").add_subparsers(dest="action", required=True)
    ratings = groups.add_parser("ratings", help="a group's ratings history")
    ratings.add_argument("id")
    ratings.add_argument("--window", default="7d", choices=["1h", "24h", "7d", "30d"])
    ratings.add_argument("--json", action="store_true")
    ratings.set_defaults(func=cmd_ratings)

    backfill = sub.add_parser("backfill", help="grade a group's past traffic again; list or cancel its jobs")
    backfill.add_argument("--project", required=True, help="the project of the group (or job)")
    backfill.add_argument("--group", help="the scorer group")
    backfill.add_argument("--since", help="the window's start: a duration back (24h, 7d, 90m) or an ISO time "
                                          "with a zone")
    backfill.add_argument("--until", help="the window's end (excluded), the same way; default now")
    backfill.add_argument("--sample-rate", type=float, help="default: the group's online sampleRate")
    backfill.add_argument("--max-judge-calls", type=int, help="the most judge calls the job makes")
    backfill.add_argument("--alerts", action="store_true", help="raise Signals and deliveries for what it grades")
    backfill.add_argument("--estimate", action="store_true",
                          help="start nothing: what the job would grade and spend (a bounded read of the window)")
    backfill.add_argument("--follow", action="store_true",
                          help="draw its progress until it ends: exit 0 when done, 1 when failed or cancelled")
    instead = backfill.add_mutually_exclusive_group()
    instead.add_argument("--list", action="store_true", help="list the group's jobs instead, newest first")
    instead.add_argument("--cancel", metavar="JOB", help="cancel this job instead")
    backfill.set_defaults(func=cmd_backfill)

    sessions = sub.add_parser("sessions", help="sessions").add_subparsers(dest="action", required=True)
    scores = sessions.add_parser("scores", help="the latest group verdicts on a session")
    scores.add_argument("id")
    scores.set_defaults(func=cmd_session_scores)

    webhooks = sub.add_parser("webhooks", help="alert-channel deliveries").add_subparsers(
        dest="action", required=True)
    webhooks.add_parser("new-secret", help="print a fresh Standard Webhooks (whsec_) channel secret") \
        .set_defaults(func=cmd_new_secret)
    replay = webhooks.add_parser("replay", help="send dead-lettered deliveries again")
    replay.add_argument("--channel", help="only this agent's channels, this URL, or agent|url")
    replay.add_argument("--since", help="only dead letters since: a duration back (2h, 3d) or an ISO time")
    replay.set_defaults(func=cmd_replay)

    reviews.add_parser(sub)
    sub.add_parser("api", help="serve the HTTP API on SGW_API_PORT").set_defaults(func=cmd_api)
    api_keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="action", required=True)
    create = api_keys.add_parser("create", help="create a key; it is printed once, on the last line")
    owner = create.add_mutually_exclusive_group(required=True)
    owner.add_argument("--project", help="the project the key acts for")
    owner.add_argument("--operator", action="store_true", help="a key that may act on every project")
    create.add_argument("--name", help="who or what uses the key (shown in change logs and on labels)")
    create.add_argument("--role", choices=("admin", "reviewer"), default="admin",
                        help="admin (the default): everything its project may do; reviewer: the project's "
                             "review queues only (take the next item, label it)")
    create.set_defaults(func=cmd_keys_create)
    list_keys = api_keys.add_parser("list", help="list keys (never their secrets)")
    list_keys.add_argument("--project")
    list_keys.set_defaults(func=cmd_keys_list)
    revoke = api_keys.add_parser("revoke", help="revoke a key at once")
    revoke.add_argument("id")
    revoke.set_defaults(func=cmd_keys_revoke)

    sub.add_parser("settings", help="print every SGW_* setting, secrets masked").set_defaults(
        func=cmd_settings)
    check = sub.add_parser("check", help="reach Kafka and Redis once, make one small judge call, and try the "
                                         "judge span export when it is on")
    check.add_argument("--no-judge", action="store_true", help="skip the judge call (it is billed like any)")
    check.set_defaults(func=cmd_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings()
    except ValidationError as exc:
        print("error: invalid settings:", file=sys.stderr)
        # What was given is not quoted: a secret's value is one the redactor may not know yet.
        for error in exc.errors(include_url=False, include_input=False):
            name = f"SGW_{str(error['loc'][0]).upper()}" if error["loc"] else "(settings)"
            print(f"  - {name}: {error['msg']}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format, settings.log_level)
    use_known_secrets(settings.secrets())
    return int(args.func(settings, args))

