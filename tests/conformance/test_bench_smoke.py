"""Smoke run of the emulator benchmark (quick mode): it runs and reports positive figures."""

from __future__ import annotations

from tests.bench import bench_apiserver


def test_bench_apiserver_quick() -> None:
    table = bench_apiserver.run(quick=True)
    assert len(table.rows) == 10
    assert all(isinstance(row[1], (int, float)) and row[1] > 0 for row in table.rows)
