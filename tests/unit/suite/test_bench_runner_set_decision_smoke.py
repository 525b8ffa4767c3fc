"""The runner-set decision benchmark runs every pass kind at both quick sizes, old and new deciding alike
(the benchmark asserts equal plans each pass; timings are for `make bench`, not tests)."""

from __future__ import annotations

from tests.bench import bench_runner_set_decision


def test_bench_runner_set_decision_quick_run_reports_every_pass_kind_and_size() -> None:
    table = bench_runner_set_decision.run(quick=True)
    assert [(row[0], row[1]) for row in table.rows] == [
        (kind, n) for kind in ("scale-up", "steady", "status counts") for n in (30, 100)
    ]
    assert all(isinstance(cell, float) and cell > 0 for row in table.rows for cell in row[2:])
    assert "runner-set cached decision" in table.render()
