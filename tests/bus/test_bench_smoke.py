"""The bus benchmark runs end to end in quick mode (figures are checked in benchmarks, not here)."""

from tests.bench import bench_bus


def test_bus_benchmark_quick_run_reports_every_measure() -> None:
    table = bench_bus.run(quick=True)
    measures = {row[0]: row[1] for row in table.rows}
    assert set(measures) == {
        "publish→handler p50 (ms)",
        "publish→handler p99 (ms)",
        "end-to-end, 32 publishers (msgs/s)",
        "sequential publish, acked (msgs/s)",
        "leader takeover after crash, ttl 1 s (s)",
    }
    assert all(isinstance(v, float) and v > 0 for v in measures.values())
