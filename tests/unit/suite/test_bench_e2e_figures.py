"""The end-to-end benchmark's pure computations (tests/bench/e2e_figures.py): percentiles, the
latencies of a job from its own runner, replacement gaps under a sustained queue, the per-runner
overhead from throughput, VmRSS parsing and the RSS extrapolation."""

from __future__ import annotations

import math

import pytest

from tests.bench import e2e_figures as fig


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [
        ([3.0], 50, 3.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
        ([4.0, 3.0, 2.0, 1.0], 99, 4.0),
        ([float(i) for i in range(1, 101)], 99, 99.0),
        ([float(i) for i in range(1, 101)], 50, 50.0),
    ],
)
def test_nearest_rank_percentile(values: list[float], p: float, expected: float) -> None:
    assert fig.percentile(values, p) == expected


def test_percentile_of_nothing_is_an_error_and_shown_as_no_sample() -> None:
    with pytest.raises(ValueError):
        fig.percentile([], 50)
    assert fig.p50_p99([]) == "n/a (no sample)"
    assert fig.p50_p99([0.25, 0.5, 2.0]) == "0.50 s / 2.00 s (n=3)"


def test_jobs_from_the_simulator_records() -> None:
    raw = [
        {"runner_name": "r1", "queue_time": 100.0, "runner_assign_time": 101.5, "finish_time": 102.5},
        {"runner_name": "", "queue_time": 100, "runner_assign_time": None, "finish_time": None},
    ]
    assert fig.jobs_from_sim(raw) == [fig.Job("r1", 100.0, 101.5, 102.5), fig.Job("", 100.0, None, None)]


def test_latencies_of_each_job_come_from_the_runner_that_took_it() -> None:
    jobs = [
        fig.Job("warm", queued=100.0, assigned=100.1, finished=101.1),  # Running before it was queued → 0
        fig.Job("cold", queued=100.0, assigned=100.9, finished=101.9),
        fig.Job("late", queued=100.0, assigned=None, finished=None),  # not handed over yet
        fig.Job("", queued=100.0, assigned=None, finished=None),
    ]
    running = {"warm": 90.0, "cold": 100.75, "other": 100.0}
    gone = {"warm": 101.6, "cold": 102.2}
    assert fig.queued_to_running(jobs, running) == [0.0, 0.75]
    assert fig.queued_to_assigned(jobs) == pytest.approx([0.1, 0.9])
    assert fig.finished_to_gone(jobs, gone) == pytest.approx([0.5, 0.3])
    # A ready runner's wait for its job: from its pod Running to the hand-over (warm: 10.1 s).
    assert fig.job_wait(jobs, running) == pytest.approx([10.1, 0.15])
    assert fig.job_wait([fig.Job("cold", 100.0, 100.5, None)], running) == [0.0]  # asked before Running was written
    assert fig.stage({"a": 1.0, "b": 2.0}, {"a": 1.5, "c": 9.0}) == [0.5]
    # The listener's next publish at or after each job's queue time.
    assert fig.first_after([99.0, 100.2, 100.5], jobs[:2]) == pytest.approx([0.2, 0.2])
    assert fig.first_after([99.0], jobs[:1]) == []


def test_each_new_runner_replaces_the_earliest_job_that_ended_before_it_was_created() -> None:
    finishes = [10.0, 10.5, 12.0]
    new_runners = [
        (9.0, 9.5),  # created before any job ended: a scale-up, not a replacement
        (10.2, 11.0),  # replaces the job that ended at 10.0
        (11.0, 11.4),  # replaces 10.5
        (11.5, 12.5),  # nothing ended before 11.5 that is not replaced yet
        (12.1, 12.6),  # replaces 12.0
    ]
    expected = [(10.0, 1.0), (10.5, 0.9), (12.0, 0.6)]
    for got in (fig.replacement_gaps(finishes, new_runners), fig.replacement_gaps(finishes, reversed(new_runners))):
        assert [f for f, _ in got] == [f for f, _ in expected]
        assert [g for _, g in got] == pytest.approx([g for _, g in expected])


def test_cycle_overhead_from_throughput() -> None:
    # 50 runners, 30 s, 150 jobs of 1 s: each runner cycles every 10 s, 9 s of it overhead.
    assert fig.cycle_overhead(50, 150, 30.0, 1.0) == pytest.approx(9.0)
    # ARC's published 3.26 jobs/s would be 50/3.26 − 1 ≈ 14.3 s.
    assert fig.cycle_overhead(50, 326, 100.0, 1.0) == pytest.approx(50 / 3.26 - 1)
    assert math.isinf(fig.cycle_overhead(50, 0, 30.0, 1.0))


def test_vm_rss_from_proc_status() -> None:
    text = "Name:\tpython\nVmPeak:\t  999 kB\nVmRSS:\t  102400 kB\nThreads:\t3\n"
    assert fig.vm_rss_mb(text) == pytest.approx(102400 * 1024 / 1e6)
    assert fig.vm_rss_mb("Name:\tkthreadd\n") is None


def test_rss_extrapolates_linearly_through_two_points() -> None:
    assert fig.extrapolate(1000, 150.0, 2000, 200.0, 10_000) == pytest.approx(600.0)
    assert fig.extrapolate(50, 100.0, 1000, 100.0, 10_000) == pytest.approx(100.0)
    assert fig.extrapolate(50, 100.0, 50, 120.0, 10_000) is None


def test_timeline_starts_afresh_when_a_generated_name_is_used_again() -> None:
    from tests.bench.bench_e2e import Timeline

    tl = Timeline()
    pod = {"metadata": {"name": "r-abcde", "uid": "1"}, "status": {"phase": "Running"}}
    tl.observe("pods", "ADDED", pod, 1.0)
    tl.observe("pods", "DELETED", pod, 2.0)
    assert tl.pods_running() == 0
    again = {"metadata": {"name": "r-abcde", "uid": "2"}, "status": {"phase": "Pending"}}
    tl.observe("pods", "ADDED", again, 3.0)
    tl.observe("pods", "MODIFIED", {**again, "status": {"phase": "Running"}}, 4.0)
    tl.observe("pods", "DELETED", pod, 4.5)  # the old object's end, seen late
    assert tl.pods_running() == 1
    assert (tl.pod_added["r-abcde"], tl.pod_running["r-abcde"]) == (3.0, 4.0)
    tl.relisted("pods", set(), 5.0)  # a relist without it: gone meanwhile
    assert tl.pods_running() == 0


def test_each_replacement_pairs_with_the_earliest_runner_gone_before_it_was_created() -> None:
    gones = [10.0, 10.5, 12.0]
    created = {"up": 9.0, "a": 10.2, "b": 11.0, "c": 11.5, "d": 12.1}
    pod_added = {"a": 10.4, "b": 11.3, "d": 12.2}  # c: no pod yet
    running = {"a": 11.0, "b": 11.4}  # d: pod not Running yet
    handed = {"a": 11.25, "b": 11.35}  # b asked before its Running status was written
    chain = fig.replacement_chain(gones, created, pod_added, running, handed)
    # "up" was created before any runner was gone (a scale-up); "c" found 10.0 and 10.5 taken.
    assert [(r.name, r.gone) for r in chain] == [("a", 10.0), ("b", 10.5), ("d", 12.0)]
    assert chain[2] == fig.Replacement("d", 12.0, 12.1, 12.2, None, None)
    stages = fig.chain_stages(chain)
    assert stages["gone→created"] == pytest.approx([0.2, 0.5, 0.1])
    assert stages["created→pod"] == pytest.approx([0.2, 0.3, 0.1])
    assert stages["pod→running"] == pytest.approx([0.6, 0.1])
    assert stages["running→handed"] == pytest.approx([0.25, 0.0])
    assert stages["gone→running"] == pytest.approx([1.0, 0.9])
    assert fig.chain_stages([]) == {k: [] for k in stages}
