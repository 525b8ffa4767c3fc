"""Smoke run of the Actions client benchmark (figures come from `python -m tests.bench actions_client`)."""

from __future__ import annotations

from tests.bench import bench_actions_client


def test_benchmark_runs_and_reports_every_operation() -> None:
    table = bench_actions_client.run(quick=True)
    assert [row[0] for row in table.rows] == [
        "decode 50-job message",
        "get scale set",
        "generate JIT config",
        "poll + ack (message waiting)",
    ]
    assert all(_positive(row[1]) and _positive(row[4]) for row in table.rows)


def _positive(cell: object) -> bool:
    return isinstance(cell, int | float) and cell > 0
