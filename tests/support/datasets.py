"""Grading a dataset run in tests: as the CLI does (a process) and as the engine does (in
process, against the local judge); ``m`` writes a member."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from adapters.members.http import RetryPolicy
from adapters.members.judge import JudgeClient
from adapters.stores.catalog import CatalogStore
from devtools.judge_server import JudgeServer
from scoring.dataset import DatasetRow, grade_rows, plan_grading
from scoring.panel import Panel
from tests.support.harness import ROOT
from tests.support.redis_clients import connect


def m(kind: str, ref: str, weight: float = 1, gate: bool = False) -> dict[str, Any]:
    return {"kind": kind, "refId": ref, "weight": weight, "gate": gate}


def grade_cli(catalog_url: str, judge: JudgeServer, *args: str,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SGW_REDIS_URL": catalog_url, "SGW_JUDGE_BASE_URL": judge.base_url,
           "SGW_LOG_LEVEL": "warning", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "worker.cli", "grade", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


async def grade_api(catalog_url: str, judge: JudgeServer, group: str, rows: list[dict[str, Any]]) -> Any:
    redis = connect(catalog_url)
    catalog = await CatalogStore(redis).snapshot()
    await redis.aclose()
    judges = JudgeClient(judge.base_url, policy=RetryPolicy(attempts=1))
    try:
        plan = plan_grading(catalog, scorer_group_id=group)
        return await grade_rows(Panel(judges=judges), catalog, plan,
                                [DatasetRow.from_json(r, i) for i, r in enumerate(rows)])
    finally:
        await judges.close()
