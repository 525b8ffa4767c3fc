"""The demo's closing summary (services/embedded/demo/summary.py): percentiles, latencies, writes."""

from __future__ import annotations

import pytest

from services.embedded.demo.__main__ import RunnerTracker
from services.embedded.demo.summary import JobTimes, RequestCount, percentile, summarize


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [([3.0], 50, 3.0), ([1.0, 2.0, 3.0, 4.0], 50, 2.0), ([1.0, 2.0, 3.0, 4.0], 99, 4.0), ([5.0, 1.0, 3.0], 50, 3.0)],
)
def test_nearest_rank_percentile(values: list[float], p: int, expected: float) -> None:
    assert percentile(values, p) == expected


def test_latencies_per_job_from_its_own_runner() -> None:
    jobs = [
        JobTimes("r1", queued=100.0, finished=110.0),  # warm runner: Running before the job → 0
        JobTimes("r2", queued=100.0, finished=112.0),  # waited 3 s for its runner
        JobTimes("r3", queued=101.0, finished=None),  # still running: not counted
        JobTimes("", queued=101.0, finished=None),  # never assigned
    ]
    running = {"r1": 90.0, "r2": 103.0, "r3": 104.0}
    removed = {"r1": 110.5, "r2": 114.0}
    requests = [
        RequestCount("create", "ephemeralrunners", 3),
        RequestCount("patch", "ephemeralrunners", 9, subresource="status"),
        RequestCount("create", "pods", 3),
        RequestCount("delete", "secrets", 3),
        RequestCount("get", "pods", 500),  # reads do not count
        RequestCount("patch", "leases", 40, group="coordination.k8s.io"),
    ]
    s = summarize(jobs, running, removed, requests, runners_seen=3)
    assert s.jobs == 2
    assert sorted(s.queued_to_running) == [0.0, 3.0]
    assert sorted(s.finished_to_removed) == [0.5, 2.0]
    assert (s.runner_writes, s.all_writes) == (18, 58)
    assert s.lines() == [
        "summary: 2 job(s) run on 3 runner(s)",
        "  job queued -> runner Running:   p50 0.00s  p99 3.00s  (n=2)",
        "  job finished -> runner removed: p50 0.50s  p99 2.00s  (n=2)",
        "  API writes per runner: 6.0 (ephemeralrunners, pods, secrets: 18 writes; all resources: 58)",
    ]


def test_no_counters_on_a_real_server_and_no_samples() -> None:
    s = summarize([], {}, {}, None, runners_seen=0)
    assert s.lines()[1:] == [
        "  job queued -> runner Running:   n/a (no sample)",
        "  job finished -> runner removed: n/a (no sample)",
        "  API writes per runner: n/a (no request counters on this API server)",
    ]


def test_tracker_records_first_running_and_removal() -> None:
    t = RunnerTracker(kube=None, namespace="")
    t.record("a", "Pending", False, 1.0)
    t.record("a", "Running", False, 2.0)
    t.record("a", "Running", False, 3.0)
    t.record("a", "Running", True, 4.0)
    t.record("a", "Running", True, 5.0)
    assert (t.running_at, t.removed_at, t.seen) == ({"a": 2.0}, {"a": 4.0}, {"a"})
