"""A backfill's dry run for the API and the CLI alike: the request checked as a job's would be
(``backfill_sample``), then ``consumers.backfill_estimate`` on a reader of the traces topic of its
own (no consumer group: it moves no offset), the group's history of the last 30 days and the
project's traffic index (what a bounded read is scaled by)."""

from __future__ import annotations

from datetime import UTC, datetime

from adapters.stores.backfills import backfill_sample
from consumers.backfill_estimate import estimate
from scorer_groups.api_models import BackfillCreate, BackfillEstimate
from services.groups import MonitorClient
from worker.connections import kafka_consumer
from worker.settings import Settings

HISTORY_WINDOW = "30d"  # the recent averages a pair's spend is estimated from


async def backfill_estimate(client: MonitorClient, settings: Settings, group_id: str,
                            request: BackfillCreate) -> BackfillEstimate:
    group = await client.scorer_groups.get(group_id)  # NotFound for another project's
    rate = backfill_sample(group, request)
    to = min(request.to, datetime.now(UTC))
    from_ms, to_ms = int(request.from_.timestamp() * 1000), int(to.timestamp() * 1000)
    return await estimate(
        lambda: kafka_consumer(settings, None, max_partition_fetch_bytes=settings.max_trace_bytes * 2),
        settings.traces_topic, group, await client.store.snapshot(),
        from_ms=from_ms, to_ms=to_ms, sample_rate=rate,
        history=await client.ratings_store.history(group.id, HISTORY_WINDOW),
        own_records=await client.ratings_store.traffic(group.project_id, max(0, from_ms), to_ms),
        pricing=settings.pricing(),
        currency=settings.currency, limit=settings.backfill_estimate_records,
        max_trace_bytes=settings.max_trace_bytes, max_spans=settings.max_spans_per_trace,
        max_judge_calls=request.max_judge_calls)
