"""``check``: reach Kafka and Redis once, make one small judge call, and try the judge span
export when it is on - each said as it works, or what failed."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from adapters.stores.catalog import CatalogStore
from scoring.redact import Redactor, mask_url
from worker.connections import redis_client
from worker.settings import Settings


async def _check(settings: Settings, skip_judge: bool = False) -> list[str]:
    """Reach Kafka and Redis once, and make one small judge call; return what failed."""

    problems = []
    redact = Redactor.from_environment(settings.secrets())
    redis = redis_client(settings)
    try:
        info = await redis.info("server")
        print(f"redis   {mask_url(settings.redis_url)}  version {info['redis_version']}")
        catalog = await CatalogStore(redis).snapshot()
        _say_prices(settings, {settings.judge_model} | {j.model for j in catalog.judges.values() if j.model})
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


def _say_prices(settings: Settings, models: set[str]) -> None:
    """The judge models the catalog and settings name that SGW_JUDGE_PRICES prices, and those it
    does not: their calls' cost is unknown (null), never 0 - said, not failed."""
    prices = settings.prices()
    unpriced = sorted(models - set(prices))
    print(f"prices  {len(models) - len(unpriced)} of {len(models)} judge model(s) priced in {settings.currency}"
          + (f"; unpriced, their cost unknown: {', '.join(unpriced)}" if unpriced else ""))


async def _check_judge_spans(settings: Settings, redact: Redactor) -> list[str]:
    """An export of no spans to SGW_JUDGE_TRACE_ENDPOINT: reached, and the headers accepted."""
    from consumers.judge_export import JudgeCallExporter

    endpoint = mask_url(settings.judge_trace_endpoint)
    try:
        exporter = JudgeCallExporter(settings.judge_trace_endpoint, headers=settings.judge_trace_export_headers())
        try:
            problem = await exporter.probe()
        finally:
            await exporter.close()
    except Exception as exc:  # a diagnosis: whatever went wrong is said, never raised
        problem = f"{type(exc).__name__}: {exc}"
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


def cmd_check(settings: Settings, args: argparse.Namespace) -> int:
    problems = asyncio.run(_check(settings, skip_judge=args.no_judge))
    for problem in problems:
        print(f"unreachable: {problem}", file=sys.stderr)
    return 1 if problems else 0
