"""Datasets: a project's rows of ``input``, optional ``expected`` and ``metadata``, versioned.

Each upload of rows is a new version, stored under the project's hash tag. The one rule: a version never
changes once written, so an evaluation run reads exactly the rows it graded. The storage and the CSV
format: docs/design-notes.md.
"""

from __future__ import annotations

import builtins
import csv
import io
import time
import uuid
from typing import Any

import orjson
from pydantic import ValidationError
from redis.exceptions import WatchError

from adapters.stores import keys
from adapters.stores.client import RedisClient
from scorer_groups.runs import Dataset, DatasetItem
from scoring.errors import InvalidDocument, NotFound, field_errors

MAX_ROWS = 10_000
MAX_FILE_BYTES = 32 * 1024 * 1024
csv.field_size_limit(MAX_FILE_BYTES)  # a cell may be as long as the file may be (the module's default: 128 KiB)


def parse_rows(text: str, fmt: str) -> list[DatasetItem]:
    """Rows of a JSONL (``fmt`` "jsonl") or CSV ("csv") upload; every bad row is named at once."""
    if len(text.encode()) > MAX_FILE_BYTES:
        raise InvalidDocument(f"file: larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    if fmt == "jsonl":
        raws: list[tuple[int, Any]] = []
        errors: list[str] = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    raws.append((number, orjson.loads(line)))
                except orjson.JSONDecodeError as exc:
                    errors.append(f"line {number}: not JSON ({exc})")
    elif fmt == "csv":
        raws, errors = _csv_rows(text)
    else:
        raise InvalidDocument(f"format: must be jsonl or csv (got {fmt!r})")
    rows = []
    for number, raw in raws:
        try:
            rows.append(DatasetItem.model_validate(raw))
        except ValidationError as exc:
            errors += [f"line {number}: {e}" for e in field_errors(exc)]
    if not rows and not errors:
        errors.append("file: no rows")
    if len(rows) > MAX_ROWS:
        errors.append(f"file: {len(rows)} rows, at most {MAX_ROWS} in one dataset version")
    if errors:
        raise InvalidDocument("invalid dataset file: " + "; ".join(errors[:20]), errors=errors)
    return rows


def _csv_rows(text: str) -> tuple[list[tuple[int, Any]], list[str]]:
    reader = csv.DictReader(io.StringIO(text))
    raws: list[tuple[int, Any]] = []
    try:
        if reader.fieldnames is None or "input" not in reader.fieldnames:
            return [], ["line 1: a CSV dataset needs a header row with an input column"]
        return _csv_records(reader, raws)
    except csv.Error as exc:  # a malformed file (an unclosed quote, a NUL): named, never a crash
        return raws, [f"line {reader.line_num}: not CSV ({exc})"]


def _csv_records(reader: csv.DictReader[str], raws: list[tuple[int, Any]]) -> tuple[list[tuple[int, Any]], list[str]]:
    errors: list[str] = []
    for number, record in enumerate(reader, 2):
        metadata: dict[str, Any] = {k: v for k, v in record.items() if k not in CSV_COLUMNS and k is not None}
        if record.get("metadata"):
            try:
                extra = orjson.loads(record["metadata"])
            except orjson.JSONDecodeError:
                extra = None
            if not isinstance(extra, dict):
                errors.append(f"line {number}: metadata: must be a JSON object")
                continue
            metadata.update(extra)
        expected = record.get("expected")
        try:
            human = _csv_human(record)
        except ValueError as exc:
            errors.append(f"line {number}: {exc}")
            continue
        raws.append((number, {"input": record["input"], "expected": expected or None, "metadata": metadata, **human}))
    return raws, errors


CSV_COLUMNS = ("input", "expected", "metadata", "humanRating", "humanPass")  # the rest is metadata
CSV_TRUE, CSV_FALSE = ("true", "1", "yes", "pass"), ("false", "0", "no", "fail")


def _csv_human(record: dict[str, Any]) -> dict[str, Any]:
    """A CSV row's human verdict as the JSON fields (a cell is text; empty is none)."""
    human: dict[str, Any] = {}
    rating, passed = (record.get("humanRating") or "").strip(), (record.get("humanPass") or "").strip().lower()
    if rating:
        try:
            human["humanRating"] = float(rating)
        except ValueError:
            raise ValueError(f"humanRating: must be a number from 0 to 10 (got {rating!r})") from None
    if passed:
        if passed not in CSV_TRUE + CSV_FALSE:
            raise ValueError(f"humanPass: must be true or false (got {passed!r})")
        human["humanPass"] = passed in CSV_TRUE
    return human


def format_of(path: str) -> str:
    """The format a file's name says: .csv is CSV, anything else JSON Lines."""
    return "csv" if path.lower().endswith(".csv") else "jsonl"


class DatasetStore:
    def __init__(self, redis: RedisClient) -> None:
        self.redis = redis

    async def create(self, project_id: str, name: str, rows: list[DatasetItem], *,
                     description: str | None = None, dataset_id: str | None = None,
                     reservation: str | None = None) -> Dataset:
        """``reservation``: its place in the project's quotas (``adapters.stores.quotas``), given
        back in the write's own transaction - the dataset then counts for itself, never twice."""
        now = time.time()
        try:
            dataset = Dataset(id=dataset_id or f"ds_{uuid.uuid4().hex[:12]}", project_id=project_id, name=name,
                              description=description, version=1, row_count=len(rows), created_at=now,
                              updated_at=now)
        except ValidationError as exc:
            raise InvalidDocument.from_validation(exc) from None
        document = _rows_json(rows)
        while True:  # WATCHed, so a taken id never has its rows overwritten
            async with self.redis.pipeline(transaction=True) as pipe:
                await pipe.watch(keys.datasets(project_id))
                if await pipe.hexists(keys.datasets(project_id), dataset.id):
                    raise InvalidDocument(f"id: a dataset with id {dataset.id!r} already exists")
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.set(keys.dataset_rows(project_id, dataset.id, 1), document)
                pipe.incrby(keys.dataset_bytes(project_id), len(document))
                pipe.hset(keys.datasets(project_id), dataset.id, orjson.dumps(dataset.stored()))
                if reservation is not None:
                    pipe.hdel(keys.project_storage(project_id), reservation)
                try:
                    await pipe.execute()
                except WatchError:
                    continue
                return dataset

    async def add_version(self, project_id: str, dataset_id: str, rows: builtins.list[DatasetItem], *,
                          reservation: str | None = None) -> Dataset:
        """The rows as the dataset's next version; earlier versions stay as they were.
        ``reservation``: as ``create``'s."""
        document = _rows_json(rows)
        while True:  # optimistic: two uploads at once become two versions, never one
            async with self.redis.pipeline(transaction=True) as pipe:
                await pipe.watch(keys.datasets(project_id))
                raw = await pipe.hget(keys.datasets(project_id), dataset_id)  # the watching connection's
                if raw is None:
                    raise NotFound(f"no dataset with id {dataset_id!r}")
                current = Dataset.model_validate(orjson.loads(raw))
                updated = current.model_copy(update={"version": current.version + 1, "row_count": len(rows),
                                                     "updated_at": time.time()})
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.set(keys.dataset_rows(project_id, dataset_id, updated.version), document)
                pipe.incrby(keys.dataset_bytes(project_id), len(document))
                pipe.hset(keys.datasets(project_id), dataset_id, orjson.dumps(updated.stored()))
                if reservation is not None:
                    pipe.hdel(keys.project_storage(project_id), reservation)
                try:
                    await pipe.execute()
                except WatchError:
                    continue
                return updated

    async def get(self, project_id: str, dataset_id: str) -> Dataset:
        raw = await self.redis.hget(keys.datasets(project_id), dataset_id)
        if raw is None:
            raise NotFound(f"no dataset with id {dataset_id!r}")
        return Dataset.model_validate(orjson.loads(raw))

    async def list(self, project_id: str) -> builtins.list[Dataset]:
        raw = await self.redis.hgetall(keys.datasets(project_id))
        return sorted((Dataset.model_validate(orjson.loads(v)) for v in raw.values()), key=lambda d: d.created_at)

    async def usage(self, project_id: str) -> tuple[int, int]:
        """How many datasets the project has, and the bytes of all their versions' rows (what
        the quotas count). Counted from the versions once for datasets kept before the count was."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hlen(keys.datasets(project_id))
            pipe.get(keys.dataset_bytes(project_id))
            count, stored = await pipe.execute()
        if stored is None:
            versions = [(d.id, v) for d in await self.list(project_id) for v in range(1, d.version + 1)]
            async with self.redis.pipeline(transaction=False) as pipe:
                for dataset_id, version in versions:
                    pipe.strlen(keys.dataset_rows(project_id, dataset_id, version))
                lengths = await pipe.execute() if versions else []
            await self.redis.set(keys.dataset_bytes(project_id), sum(lengths), nx=True)
            stored = await self.redis.get(keys.dataset_bytes(project_id))
        return int(count), int(stored or 0)

    async def rows(self, project_id: str, dataset_id: str,
                   version: int | None = None) -> tuple[int, builtins.list[DatasetItem]]:
        """(version, rows) of one version of the dataset, the latest by default."""
        if version is None:
            version = (await self.get(project_id, dataset_id)).version
        raw = await self.redis.get(keys.dataset_rows(project_id, dataset_id, version))
        if raw is None:
            raise NotFound(f"no version {version} of dataset {dataset_id!r}")
        return version, [DatasetItem.model_validate(r) for r in orjson.loads(raw)]


def _rows_json(rows: list[DatasetItem]) -> bytes:
    return orjson.dumps([r.stored() for r in rows])
