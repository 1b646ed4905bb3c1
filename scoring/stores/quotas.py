"""A project's quotas on what it keeps: datasets, evaluation runs, and their stored bytes.

Checked when something is created (a dataset, a dataset version, a run), against what the
project keeps now (``DatasetStore.usage``, ``EvaluationStore.sizes``): a refusal names the quota
and its setting. A run grows when it is finalized (its rows and judge calls): its bytes count
from then on, so the stored-bytes quota refuses the next dataset or run, never a finalize whose
judges were already paid for. Two creates at the same moment may both pass: the quotas bound
what a project keeps, not to the unit.
"""

from __future__ import annotations

from scoring.errors import QuotaExceeded
from scoring.frozen import frozen
from scoring.stores import keys
from scoring.stores.client import RedisClient
from scoring.stores.datasets import DatasetStore
from scoring.stores.evaluations import EvaluationStore


@frozen
class Quotas:
    datasets: int  # SGW_MAX_DATASETS_PER_PROJECT
    runs: int  # SGW_MAX_EVALUATION_RUNS_PER_PROJECT: runs kept (not expired)
    stored_bytes: int  # SGW_MAX_PROJECT_STORED_BYTES: datasets' rows and runs, together


async def check_quotas(redis: RedisClient, project_id: str, quotas: Quotas, *, dataset: bool = False,
                       run: bool = False, adding_bytes: int = 0) -> None:
    """Refuse (``QuotaExceeded``) a new dataset (``dataset``), run (``run``) or ``adding_bytes``
    more that would take the project past a quota."""
    datasets, dataset_bytes = await DatasetStore(redis).usage(project_id)
    runs = await EvaluationStore(redis).sizes(project_id)
    if dataset and datasets >= quotas.datasets:
        raise QuotaExceeded("SGW_MAX_DATASETS_PER_PROJECT", "datasets", datasets, quotas.datasets)
    if run and len(runs) >= quotas.runs:
        raise QuotaExceeded("SGW_MAX_EVALUATION_RUNS_PER_PROJECT", f"evaluation runs (a run is kept "
                            f"{keys.EVALUATION_TTL_S // 86_400} days after its last change)", len(runs), quotas.runs)
    stored = dataset_bytes + sum(runs.values())
    if stored + adding_bytes > quotas.stored_bytes or (run and stored >= quotas.stored_bytes):
        raise QuotaExceeded("SGW_MAX_PROJECT_STORED_BYTES", f"bytes of datasets and runs (adding {adding_bytes:,})",
                            stored, quotas.stored_bytes)
