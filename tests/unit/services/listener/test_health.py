"""Probe verdicts and metric rendering of the listener, without servers."""

from __future__ import annotations

import datetime as dt
from typing import Any

from services.listener.health import HealthState, Role, verdict
from services.listener.metrics import ListenerMetrics, seconds_between
from shared.actions.messages import JobAssigned, JobCompleted, JobStarted
from shared.actions.models import ScaleSetStatistics

STALE = 60.0


def state(role: Role, *, session: str = "", progress: float | None, polled: float | None) -> HealthState:
    s = HealthState(role=role, session_id=session)
    s.started, s.last_progress, s.last_poll_ok = 0.0, progress, polled
    return s


def test_leader_with_session_and_recent_poll_is_live_and_ready() -> None:
    v = verdict(state(Role.LEADER, session="s1", progress=100, polled=100), now=110, staleness=STALE)
    assert (v.live, v.ready) == (True, True)


def test_standby_is_live_but_not_ready() -> None:
    v = verdict(state(Role.STANDBY, progress=100, polled=None), now=110, staleness=STALE)
    assert (v.live, v.ready, v.reason) == (True, False, "standby")


def test_leader_without_recent_poll_is_not_ready() -> None:
    v = verdict(state(Role.LEADER, session="s1", progress=150, polled=10), now=160, staleness=STALE)
    assert (v.live, v.ready) == (True, False)


def test_leader_without_session_is_not_ready() -> None:
    v = verdict(state(Role.LEADER, progress=150, polled=150), now=160, staleness=STALE)
    assert (v.live, v.ready) == (True, False)


def test_wedged_loop_fails_liveness() -> None:
    v = verdict(state(Role.LEADER, session="s1", progress=10, polled=10), now=200, staleness=STALE)
    assert (v.live, v.ready) == (False, False)


def test_never_progressed_counts_from_start() -> None:
    s = HealthState()
    s.started = 0.0
    assert verdict(s, now=30, staleness=STALE).live
    assert not verdict(s, now=90, staleness=STALE).live


T0 = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def sample(m: ListenerMetrics, metric_name: str, /, **labels: str) -> float | None:
    return m.registry.get_sample_value(metric_name, labels)


def test_metrics_use_arc_names_and_labels() -> None:
    m = ListenerMetrics(name="arc", namespace="ns", organization="octo-org")
    m.record_static(min_runners=1, max_runners=5)
    m.record_statistics(ScaleSetStatistics(total_assigned_jobs=3, total_running_jobs=2, total_registered_runners=4,
                                           total_busy_runners=2, total_idle_runners=2, total_available_jobs=1,
                                           total_acquired_jobs=1))  # fmt: skip
    m.record_desired(replicas=4, patch_id=3)
    ss = {"name": "arc", "namespace": "ns", "repository": "", "organization": "octo-org", "enterprise": ""}
    for metric, want in [
        ("gha_min_runners", 1), ("gha_max_runners", 5), ("gha_assigned_jobs", 3), ("gha_running_jobs", 2),
        ("gha_registered_runners", 4), ("gha_busy_runners", 2), ("gha_idle_runners", 2),
        ("gha_desired_runners", 4), ("gha_available_jobs", 1), ("gha_acquired_jobs", 1),
    ]:  # fmt: skip
        assert sample(m, metric, **ss) == want, metric

    job: dict[str, Any] = dict(owner_name="octo-org", repository_name="octo-repo", job_display_name="build", event_name="push",
               queue_time=at(0), scale_set_assign_time=at(4), runner_assign_time=at(10))  # fmt: skip
    m.record_job_assigned(JobAssigned(**job), received_at=at(5))
    m.record_job_started(JobStarted(runner_name="r1", **job))
    m.record_job_completed(JobCompleted(result="succeeded", runner_name="r1", finish_time=at(70), **job))
    jl = {
        "enterprise": "",
        "organization": "octo-org",
        "repository": "octo-repo",
        "job_name": "build",
        "event_name": "push",
    }
    assert sample(m, "gha_started_jobs_total", **jl) == 1
    assert sample(m, "gha_completed_jobs_total", **jl, job_result="succeeded") == 1
    assert sample(m, "gha_job_startup_duration_seconds_sum", **jl) == 6
    assert sample(m, "gha_job_execution_duration_seconds_sum", **jl, job_result="succeeded") == 60
    assert sample(m, "gha_job_queue_duration_seconds_sum", **jl) == 4
    text = m.render().decode()
    assert "gha_started_jobs_total{" in text and "gha_job_startup_duration_seconds_bucket{" in text


def test_canceled_before_a_runner_counts_but_has_no_execution_time() -> None:
    m = ListenerMetrics(name="arc", namespace="ns")
    m.record_job_completed(JobCompleted(result="canceled", owner_name="o", repository_name="r"))
    labels = {
        "enterprise": "",
        "organization": "o",
        "repository": "r",
        "job_name": "",
        "event_name": "",
        "job_result": "canceled",
    }
    assert sample(m, "gha_completed_jobs_total", **labels) == 1
    assert sample(m, "gha_job_execution_duration_seconds_count", **labels) is None


def test_seconds_between_ignores_unset_and_negative() -> None:
    assert seconds_between(None, at(1)) is None
    assert seconds_between(at(5), at(1)) is None
    assert seconds_between(at(1), at(3.5)) == 2.5
