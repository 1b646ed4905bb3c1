"""``sgw_group_incident_open`` has a series only while an incident is open: at 50,000
groups, one series per alerting group made /metrics 2 MB whatever was wrong."""

from __future__ import annotations

from prometheus_client import generate_latest

from worker.metrics import REGISTRY, PrometheusIncidents


def series() -> list[str]:
    return [line for line in generate_latest(REGISTRY).decode().splitlines()
            if line.startswith("sgw_group_incident_open{") and 'project="p-series' in line]


def test_a_series_exists_only_while_its_incident_is_open() -> None:
    incidents = PrometheusIncidents()
    for i in range(1_000):  # every watched group reports its state: most are quiet
        incidents.incident_open("p-series", f"g-{i}", "window_below", False)
    assert series() == []
    incidents.incident_open("p-series", "g-7", "drift", True)
    assert series() == ['sgw_group_incident_open{group="g-7",project="p-series",reason="drift"} 1.0']
    incidents.incident_open("p-series", "g-7", "drift", False)
    incidents.incident_open("p-series", "g-7", "drift", False)  # resolved twice (two watchers): still none
    assert series() == []
