"""The listener benchmark still runs (quick sizes); its figures are in README "Listener"."""

from __future__ import annotations

from tests.bench import bench_listener


def test_listener_benchmark_quick_run_produces_every_row():
    table = bench_listener.run(quick=True)
    assert len(table.rows) == 4
    takeover = table.rows[-1]
    assert takeover[0].startswith("HA takeover") and 0 < takeover[2] < 10
