"""Datasets: created from JSONL or CSV through the CLI, versioned, kept per project in Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapters.stores.datasets import DatasetStore, parse_rows
from scorer_groups.runs import DatasetItem
from scoring.errors import InvalidDocument, NotFound
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def url(redis_db_url: str) -> str:
    return redis_db_url


@pytest.fixture
async def store(url: str) -> AsyncIterator[DatasetStore]:
    redis = connect(url)
    yield DatasetStore(redis)
    await redis.aclose()


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SGW_REDIS_URL": url, "SGW_LOG_LEVEL": "warning", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "worker.cli", "datasets", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


async def test_cli_creates_from_jsonl_and_csv_and_adds_versions(store: DatasetStore, url: str,
                                                                 tmp_path: Path) -> None:
    jsonl = tmp_path / "qa.jsonl"
    jsonl.write_text(json.dumps({"input": "2+2?", "expected": "4", "metadata": {"topic": "math"}}) + "\n\n"
                     + json.dumps({"input": {"question": "capital of France?"}}) + "\n")
    done = cli(url, "create", str(jsonl), "--project", "p", "--id", "qa")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "dataset qa (qa) version 1: 2 rows"
    csv_file = tmp_path / "more.csv"
    csv_file.write_text('input,expected,lang,metadata\n3+3?,6,en,"{""level"": 2}"\nhello,,fr,\n')
    again = cli(url, "version", "qa", str(csv_file), "--project", "p")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "dataset qa (qa) version 2: 2 rows"
    assert await store.rows("p", "qa", 1) == (1, [
        DatasetItem(input="2+2?", expected="4", metadata={"topic": "math"}),
        DatasetItem(input={"question": "capital of France?"})]), "version 1 is kept as it was"
    assert await store.rows("p", "qa") == (2, [
        DatasetItem(input="3+3?", expected="6", metadata={"lang": "en", "level": 2}),
        DatasetItem(input="hello", expected=None, metadata={"lang": "fr"})])
    listing = cli(url, "list", "--project", "p")
    assert "qa  v2       2 rows  qa" in listing.stdout
    with pytest.raises(NotFound):
        await store.get("other-project", "qa")
    assert cli(url, "list", "--project", "other-project").stdout == "", "datasets are per project"


def test_cli_names_every_bad_row(url: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "ok"}\n{not json}\n{"expected": "no input"}\n{"input": "x", "metadata": 3}\n')
    done = cli(url, "create", str(bad), "--project", "p")
    assert done.returncode == 2
    assert "line 2: not JSON" in done.stderr
    assert "line 3: input: Field required" in done.stderr
    assert "line 4: metadata: Input should be a valid dictionary" in done.stderr


async def test_an_id_is_not_taken_twice(store: DatasetStore) -> None:
    rows = parse_rows('{"input": "a"}\n', "jsonl")
    await store.create("p", "A", rows, dataset_id="same")
    with pytest.raises(InvalidDocument, match="id: a dataset with id 'same' already exists"):
        await store.create("p", "B", parse_rows('{"input": "b"}\n', "jsonl"), dataset_id="same")
    assert (await store.get("p", "same")).name == "A"
    assert await store.rows("p", "same") == (1, rows), "the taken id's rows are untouched"
    with pytest.raises(InvalidDocument, match="a CSV dataset needs a header row with an input column"):
        parse_rows("question,answer\nq,a\n", "csv")
