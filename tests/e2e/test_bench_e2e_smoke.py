"""Smoke run of the end-to-end benchmark (quick mode: 3 idle runners, 10 s at rest, 3 jobs) on the
embedded stack: it completes, and at rest nothing but liveness writes to the API server (the
runner-set no longer rewrites an unchanged desired state, README "End-to-end benchmark")."""

from __future__ import annotations

import pytest

from tests.bench import bench_e2e

pytestmark = pytest.mark.slow


def test_bench_e2e_quick() -> None:
    table = bench_e2e.run(quick=True)
    rows = {str(row[0]).strip(): row[1] for row in table.rows}
    assert "run failed" not in rows, rows
    assert rows["anything else, per minute"] == "0", table.render()
    assert float(rows["controller API writes per runner life (3 jobs)"]) > 0
