"""The listener benchmark still runs (quick sizes); its figures are in README "Listener"."""

from __future__ import annotations

from typing import cast

from tests.bench import bench_listener


def test_listener_benchmark_quick_run_produces_every_row() -> None:
    table = bench_listener.run(quick=True)
    assert len(table.rows) == 4
    takeover = table.rows[-1]
    assert str(takeover[0]).startswith("HA takeover") and 0 < cast(float, takeover[2]) < 10
