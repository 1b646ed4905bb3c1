"""The console's dataset-run page in Debian's headless chromium, against the real API process,
Redis and local judge of the console tests' fixtures (``tests.support.console_browser``): a run
is opened from the list and shows its header and rows with each judge member's rating; over rows
people labelled (``humanRating``/``humanPass``) it shows the run's agreement with them - the
figures the API returned for the group and each judge, the confusion at each mark, the largest
disagreements, each leading to its row - with a judge label and outputs written like an XSS
payload shown as text. A run over unlabelled rows says that no row carries a human verdict.
``SGW_CONSOLE_RUNS_SCREENSHOT=<path>`` saves the labelled run's page."""

from __future__ import annotations

import os
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import pytest

from scorer_groups import Client
from tests.support.console_browser import XSS, Env, sign_in, wait_for

pytestmark = pytest.mark.integration

# The console tests' fixtures, for this module: its own API process with its groups, and chromium.

By = pytest.importorskip("selenium.webdriver.common.by").By
NoAlertPresentException = pytest.importorskip("selenium.common.exceptions").NoAlertPresentException

# What people said of each row, and what the two judges say (the local judge reads the
# [[rating@<model>=N]] markers in the agent's output). q6 carries no verdict; q2 both kinds.
LABELLED: list[dict[str, Any]] = [{"input": "q0", "humanRating": 9}, {"input": "q1", "humanRating": 2},
                                  {"input": "q2", "humanRating": 8, "humanPass": True}, {"input": "q3", "humanRating": 3},
                                  {"input": "q4", "humanRating": 7}, {"input": "q5", "humanPass": False}, {"input": "q6"}]
QUALITY_SAYS = {"q0": 8, "q1": 3, "q2": 9, "q3": 5, "q4": 7, "q5": 8, "q6": 4}
HOSTILE_SAYS = 6  # the same on every row: no spread, so its Spearman is null ("-" on the page)
LONG = " and more" * 40  # past the 200 characters the rows table shows of an output


@dataclass
class Runs:
    labelled: dict[str, Any]  # the run documents, as GET /v1/evaluations/{id} answers
    unlabelled: dict[str, Any]


def agent(question: str) -> str:
    return (f"{XSS} answer to {question} [[rating@quality-model={QUALITY_SAYS.get(question, 5)}]] "
            f"[[rating@hostile-model={HOSTILE_SAYS}]]{LONG}")


def run_document(env: Env, run_id: str) -> dict[str, Any]:
    with env.api.client(env.key) as http:
        answer = http.get(f"/v1/evaluations/{run_id}")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())


@pytest.fixture(scope="module")
def runs(console: Env) -> Runs:
    with Client(console.api.url, console.key) as client:
        quality = client.monitor.judges.create(name="Quality", criteria="Helpful?", model="quality-model")
        hostile = client.monitor.judges.create(name="Hostile", criteria="Safe?", model="hostile-model")
        group = client.monitor.scorer_groups.create(
            "Calibrated", members=[{"kind": "judge", "refId": quality.id, "weight": 1},
                                   {"kind": "judge", "refId": hostile.id, "weight": 1, "label": XSS}],
            online={"enabled": False, "sampleRate": 1, "alertThreshold": 6, "severity": "high"})
        subject = {"kind": "custom_agent", "displayName": "support bot"}
        labelled = client.datasets.create("Labelled questions", rows=LABELLED)
        unlabelled = client.datasets.create("Unlabelled questions", rows=[{"input": "q0"}, {"input": "q1"}])
        first = client.evaluations.run(dataset_id=labelled.id, subject=subject,
                                       scorer_group_id=group.id).execute(agent).finalize()
        second = client.evaluations.run(dataset_id=unlabelled.id, subject=subject,
                                        scorer_group_id=group.id).execute(agent).finalize()
    return Runs(run_document(console, first.id), run_document(console, second.id))


# --- the figures as the page writes them -----------------------------------------------------

def fixed(value: float) -> str:
    """JavaScript's toFixed(2): a half rounds away from zero (Python's format rounds it to even)."""
    return str(Decimal(value).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP))


def js_number(value: float) -> str:
    """JavaScript's String(number): 5 for 5.0, the shortest round trip otherwise (as repr)."""
    return str(int(value)) if value == int(value) else repr(value)


def figure(value: float | None) -> str:
    return "-" if value is None else fixed(value)


def suggested(s: dict[str, Any] | None) -> str:
    if s is None:
        return "-"
    return (f"{js_number(s['threshold'])} (balanced accuracy {fixed(s['balancedAccuracy'])}, "
            f"{fixed(s['low'])}\u2013{fixed(s['high'])}; {s['sure']}: {s['passes']} pass / {s['fails']} fail rows)")


def human(d: dict[str, Any]) -> str:
    verdict = None if d.get("humanPass") is None else "pass" if d["humanPass"] else "fail"
    if d.get("humanRating") is None:
        return verdict or "-"
    return f"{fixed(d['humanRating'])} ({verdict})" if verdict else fixed(d["humanRating"])


def text_of(node: Any, css: str) -> str:
    return str(node.find_element(By.CSS_SELECTOR, css).text)


def open_run_from_the_list(browser: Any, env: Env, run_id: str) -> None:
    sign_in(browser, env)
    browser.get(env.api.url + "/console#/runs")
    wait_for(browser, f"#runs tr[data-run='{run_id}'] a.run-link")[0].click()
    wait_for(browser, "#run-rows")
    assert browser.current_url.endswith(f"#/runs/{run_id}")


# --- the tests -------------------------------------------------------------------------------

def test_a_labelled_run_shows_its_agreement_with_people(console: Env, browser: Any, runs: Runs) -> None:
    run = runs.labelled
    agreement = run["agreement"]
    assert agreement is not None and agreement["labelledRows"] == 6, "q6 carries no verdict"
    group, judges = agreement["group"], agreement["judges"]
    quality, hostile = (next(j for j in judges if j["label"] == label) for label in ("Quality", XSS))
    # The data gives the page both kinds of figure to show: numbers, and nulls ("-").
    assert group["spearman"] is not None and quality["suggestedThreshold"] is not None
    assert hostile["spearman"] is None

    open_run_from_the_list(browser, console, run["id"])
    if os.environ.get("SGW_CONSOLE_RUNS_SCREENSHOT"):
        browser.save_screenshot(os.environ["SGW_CONSOLE_RUNS_SCREENSHOT"])

    # The header.
    assert browser.find_element(By.ID, "run-graded-by").text == "Calibrated (group)"
    assert browser.find_element(By.ID, "run-subject").text == "support bot"
    assert browser.find_element(By.ID, "run-status").text == "completed"
    assert browser.find_element(By.ID, "run-rating").text == fixed(run["rating"])
    assert browser.find_element(By.ID, "run-scored").text == "7 of 7"
    lines = [li.get_attribute("textContent") for li in browser.find_elements(By.CSS_SELECTOR, "#run-breakdown li")]
    assert lines == run["breakdown"] and lines

    # One line per column, the group's first, each with the figures the API returned.
    table = wait_for(browser, "#agreement")[0]
    heads = [th.text for th in table.find_elements(By.CSS_SELECTOR, "thead th")]
    assert "kappa at the gate mark 5" in heads and "kappa at alertThreshold 6" in heads
    shown = [tr.get_attribute("data-column") for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr[data-column]")]
    assert shown == ["Calibrated", "Quality", XSS]
    for column in (group, quality, hostile):
        line = table.find_element(By.CSS_SELECTOR, f"tr[data-column=\"{column['label']}\"]")
        kappa = {m["mark"]: m["kappa"] for m in column["marks"]}
        assert text_of(line, "[data-figure=labelledRows]") == str(column["labelledRows"])
        assert text_of(line, "[data-figure=spearman]") == figure(column["spearman"])
        assert text_of(line, "[data-figure=meanAbsoluteError]") == figure(column["meanAbsoluteError"])
        assert text_of(line, "[data-figure='kappa:gate']") == figure(kappa["gate"])
        assert text_of(line, "[data-figure='kappa:alertThreshold']") == figure(kappa["alertThreshold"])
        assert text_of(line, "[data-figure=suggestedThreshold]") == suggested(column["suggestedThreshold"])
    missing = table.find_element(By.CSS_SELECTOR, f"tr[data-column=\"{XSS}\"] [data-figure=spearman] span")
    assert missing.get_attribute("title") == "too few rows or no spread"

    # The confusion at each mark: rows are the people's verdict, columns the machine's.
    at_alert = next(m for m in group["marks"] if m["mark"] == "alertThreshold")["confusion"]
    confusion = table.find_element(By.CSS_SELECTOR, "[data-confusion='Calibrated:alertThreshold']")
    for cell, count in at_alert.items():
        assert text_of(confusion, f"[data-cell={cell}]") == str(count), cell
    assert text_of(confusion, "tbody tr:first-child th") == "people pass"
    assert table.find_elements(By.CSS_SELECTOR, f"[data-confusion=\"{XSS}:gate\"]")

    # The largest disagreement: what each side said; its button leads to the row.
    worst = quality["disagreements"][0]
    line = table.find_element(By.CSS_SELECTOR, f"[data-disagreement='Quality:{worst['row']}']")
    assert text_of(line, "[data-figure=machine]") == fixed(worst["machine"])
    assert text_of(line, "[data-figure=people]") == human(worst)
    assert text_of(line, "[data-figure=gap]") == fixed(worst["gap"])
    line.find_element(By.CSS_SELECTOR, "button").click()
    wait_for(browser, f"#run-rows tr[data-row='{worst['row']}'].highlight")

    # The rows: each judge member's rating, the output cut with the whole of it in the title.
    rows = browser.find_elements(By.CSS_SELECTOR, "#run-rows tbody tr")
    assert [r.get_attribute("data-row") for r in rows] == [str(r["row"]) for r in run["rows"]]
    first, verdicts = rows[0], {v["label"]: v for v in run["rows"][0]["judgeScorerResults"]}
    assert text_of(first, "td[data-judge='Quality'] .run-verdict") == fixed(verdicts["Quality"]["rating"])
    assert text_of(first, f"td[data-judge=\"{XSS}\"] .run-verdict") == fixed(HOSTILE_SAYS)
    output = first.find_element(By.CSS_SELECTOR, ".run-output")
    assert output.get_attribute("title") == run["rows"][0]["output"] == agent("q0")
    assert output.get_attribute("textContent") == agent("q0")[:200] + "\u2026"

    # The hostile label and outputs are text: no element made of them, nothing ran.
    assert table.find_element(By.CSS_SELECTOR, f"tr[data-column=\"{XSS}\"] td").text == f"{XSS} (judge)"
    assert output.text.startswith(XSS)
    assert browser.find_elements(By.CSS_SELECTOR, "main img") == [], "a label or an output became markup"
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018


def test_a_run_over_unlabelled_rows_says_no_row_carries_a_human_verdict(console: Env, browser: Any,
                                                                         runs: Runs) -> None:
    run = runs.unlabelled
    assert run.get("agreement") is None
    open_run_from_the_list(browser, console, run["id"])
    assert "No row of this dataset carries a human verdict" in wait_for(browser, "#agreement-none")[0].text
    assert browser.find_elements(By.ID, "agreement") == []
    assert len(browser.find_elements(By.CSS_SELECTOR, "#run-rows tbody tr")) == run["rowCount"] == 2
