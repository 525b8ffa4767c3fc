"""The semantic benchmark runs and reports every case (timings are for `make bench`, not tests)."""

from __future__ import annotations

from tests.bench import bench_semantic


def test_bench_semantic_quick_run_reports_every_case() -> None:
    table = bench_semantic.run(quick=True)
    assert len(table.rows) == len(bench_semantic.cases()) == 6
    functions = {row[1] for row in table.rows}
    assert functions == {"semantic_equal", "semantic_derivative"}
    assert {row[2] for row in table.rows} == {"equal", "drift"}
    assert all(_positive(row[3]) and _positive(row[4]) for row in table.rows)
    assert "semantic_equal" in table.render()


def _positive(cell: object) -> bool:
    return isinstance(cell, int | float) and cell > 0
