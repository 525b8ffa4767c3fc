"""The simulator benchmark runs end to end at its smallest size (figures live in the benchmark)."""

from __future__ import annotations

from tests.bench import bench_actions_sim


def test_benchmark_runs_quick() -> None:
    table = bench_actions_sim.run(quick=True)
    assert len(table.rows) == 4
    assert all(isinstance(row[-1], float) and row[-1] > 0 for row in table.rows)
