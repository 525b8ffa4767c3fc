"""Smoke run of the end-to-end benchmark (quick mode: 3 idle runners, 10 s at rest, 3 jobs; 6 cold
jobs, 10 runners sustained for 15 s, 100 idle runners for RSS) on the embedded stack: it completes,
and at rest nothing but liveness writes to the API server (the runner-set no longer rewrites an
unchanged desired state, README "End-to-end benchmark") and liveness is one Lease write per worker
per renew period; every latency, overhead and RSS row has samples."""

from __future__ import annotations

import pytest

from tests.bench import bench_e2e

pytestmark = pytest.mark.slow


def test_bench_e2e_quick() -> None:
    table = bench_e2e.run(quick=True)
    rows = {str(row[0]).strip(): row[1] for row in table.rows}
    assert "run failed" not in rows, rows
    assert rows["anything else, per minute"] == "0", table.render()
    # One member Lease write per worker per renew period (10 s): 4 in the 10 s window, at most 8
    # when windows and periods align (README "Shard ownership leases"); per-shard Leases made 1,223.
    assert float(str(rows["runnerscale liveness (its Lease writes), per minute"])) <= 48, table.render()
    assert float(str(rows["controller API writes per runner life (3 jobs)"])) > 0
    top = [str(row[0]) for row in table.rows if not str(row[0]).startswith(" ")]
    latency = [k for k in top if k.startswith(("job queued", "job finished", "per-runner overhead"))]
    assert len(latency) == 3, table.render()
    for key in latency:
        assert "(n=" in str(rows[key]), (key, table.render())
    for worker in ("scale-set", "listener-pod", "runner-set", "runner"):
        assert "?" not in str(rows[worker]) and "≈" in str(rows[worker]), table.render()
    assert str(rows["largest fleet reached"]).startswith("100 "), table.render()
