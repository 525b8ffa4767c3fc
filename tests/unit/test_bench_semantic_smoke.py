"""The semantic benchmark runs and reports every case (timings are for `make bench`, not tests)."""

from __future__ import annotations

from tests.bench import bench_semantic


def test_bench_semantic_quick_run_reports_every_case() -> None:
    table = bench_semantic.run(quick=True)
    assert len(table.rows) == len(bench_semantic.cases()) == 6
    functions = {row[1] for row in table.rows}
    assert functions == {"semantic_equal", "semantic_derivative"}
    assert {row[2] for row in table.rows} == {"equal", "drift"}
    assert all(row[3] > 0 and row[4] > 0 for row in table.rows)
    assert "semantic_equal" in table.render()
