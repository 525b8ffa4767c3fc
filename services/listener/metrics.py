"""Listener metrics with ARC's names and default label sets (README "Listener"), plus the
gauges and histogram ARC users asked for (available/acquired jobs, queue duration).

Each listener instance owns a ``CollectorRegistry`` so several can run in one process (tests, HA
replicas in-process). Scale-set gauges carry ``name, namespace, repository, organization,
enterprise``; job metrics carry ``enterprise, organization, repository, job_name, event_name``
(+ ``job_result`` on completion), with organization/repository taken from the job message as ARC
does.
"""

from __future__ import annotations

import datetime as dt
from collections import OrderedDict

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from shared.actions.messages import JobAssigned, JobCompleted, JobStarted
from shared.actions.models import ScaleSetStatistics

# How many counted message ids to remember (a batch is at most 50 events; this spans hours).
_COUNTED_MESSAGES_MEMORY = 4096

SCALE_SET_LABELS = ("name", "namespace", "repository", "organization", "enterprise")
JOB_LABELS = ("enterprise", "organization", "repository", "job_name", "event_name")
COMPLETED_JOB_LABELS = (*JOB_LABELS, "job_result")

# ARC's default histogram buckets (seconds).
DEFAULT_BUCKETS = (
    0.01, 0.05, 0.1, 0.5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 18, 20, 25, 30, 40, 50, 60, 70, 80, 90,
    100, 110, 120, 150, 180, 210, 240, 300, 360, 420, 480, 540, 600, 900, 1200, 1800, 2400, 3000, 3600,
)  # fmt: skip


def _is_set(t: dt.datetime | None) -> bool:
    # The service sends Go's zero time (0001-01-01) or omits the field for "not applicable".
    return t is not None and t.year > 1


def seconds_between(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    """``end - start`` in seconds, or None when either is unset or the difference is negative."""
    if not (_is_set(start) and _is_set(end)):
        return None
    assert start is not None and end is not None
    seconds = (end - start).total_seconds()
    return seconds if seconds >= 0 else None


class ListenerMetrics:
    def __init__(
        self, *, name: str, namespace: str, repository: str = "", organization: str = "", enterprise: str = ""
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._counted_messages: OrderedDict[int, None] = OrderedDict()
        self.enterprise = enterprise
        self._scale_set = {
            "name": name,
            "namespace": namespace,
            "repository": repository,
            "organization": organization,
            "enterprise": enterprise,
        }
        r = self.registry

        def gauge(metric: str, doc: str) -> Gauge:
            return Gauge(metric, doc, SCALE_SET_LABELS, registry=r)

        self.assigned_jobs = gauge("gha_assigned_jobs", "Number of jobs assigned to this scale set.")
        self.running_jobs = gauge("gha_running_jobs", "Number of jobs running (or about to run).")
        self.registered_runners = gauge("gha_registered_runners", "Number of runners registered by the scale set.")
        self.busy_runners = gauge("gha_busy_runners", "Number of registered runners running a job.")
        self.idle_runners = gauge("gha_idle_runners", "Number of registered runners not running a job.")
        self.min_runners = gauge("gha_min_runners", "Minimum number of runners.")
        self.max_runners = gauge("gha_max_runners", "Maximum number of runners.")
        self.desired_runners = gauge("gha_desired_runners", "Number of runners desired by the scale set.")
        self.available_jobs = gauge("gha_available_jobs", "Number of jobs available to acquire (GHES flow).")
        self.acquired_jobs = gauge("gha_acquired_jobs", "Number of jobs acquired, not yet assigned.")
        self.started_jobs = Counter(
            "gha_started_jobs", "Total number of jobs started.", JOB_LABELS, registry=r
        )  # exposed as gha_started_jobs_total
        self.completed_jobs = Counter(
            "gha_completed_jobs", "Total number of jobs completed.", COMPLETED_JOB_LABELS, registry=r
        )
        self.job_startup_duration = Histogram(
            "gha_job_startup_duration_seconds",
            "Time from scale-set assignment to runner assignment of a job.",
            JOB_LABELS,
            buckets=DEFAULT_BUCKETS,
            registry=r,
        )
        self.job_execution_duration = Histogram(
            "gha_job_execution_duration_seconds",
            "Time from runner assignment to job finish.",
            COMPLETED_JOB_LABELS,
            buckets=DEFAULT_BUCKETS,
            registry=r,
        )
        self.job_queue_duration = Histogram(
            "gha_job_queue_duration_seconds",
            "Time from a job being queued to its assignment to this scale set.",
            JOB_LABELS,
            buckets=DEFAULT_BUCKETS,
            registry=r,
        )
        self.is_leader = Gauge(
            "runnerscale_listener_leader",
            "1 while this replica holds the scale set's lease and session.",
            SCALE_SET_LABELS,
            registry=r,
        )
        self.session_conflicts = Counter(
            "runnerscale_listener_session_conflicts",
            "409 'session already exists' answers on session create.",
            SCALE_SET_LABELS,
            registry=r,
        )
        self.rejected_messages = Counter(
            "runnerscale_listener_rejected_messages",
            "Service messages that could not be decoded, by reason; acknowledged unless they carry no id.",
            (*SCALE_SET_LABELS, "reason"),
            registry=r,
        )
        self.last_patch_id = gauge("runnerscale_listener_patch_id", "Patch ID of the last published desired state.")
        # A leader that holds its lease and session but whose polls hang or keep failing is still a
        # leader: the alert "not polling" needs the time of the last answered poll (README "Alerts").
        self.last_poll = gauge(
            "runnerscale_listener_last_poll_timestamp_seconds",
            "Unix time of the last long poll the Actions service answered (with messages or none).",
        )

    def first_sight(self, message_id: int) -> bool:
        """True the first time a service message id is counted: job metrics stay exact when a
        message is delivered again (redelivery, a new session, a late duplicate)."""
        if message_id in self._counted_messages:
            return False
        self._counted_messages[message_id] = None
        while len(self._counted_messages) > _COUNTED_MESSAGES_MEMORY:
            self._counted_messages.popitem(last=False)
        return True

    # -- scale set ---------------------------------------------------------------------------

    def record_static(self, *, min_runners: int, max_runners: int) -> None:
        self.min_runners.labels(**self._scale_set).set(min_runners)
        self.max_runners.labels(**self._scale_set).set(max_runners)

    def record_statistics(self, stats: ScaleSetStatistics) -> None:
        s = self._scale_set
        self.assigned_jobs.labels(**s).set(stats.total_assigned_jobs)
        self.running_jobs.labels(**s).set(stats.total_running_jobs)
        self.registered_runners.labels(**s).set(stats.total_registered_runners)
        self.busy_runners.labels(**s).set(stats.total_busy_runners)
        self.idle_runners.labels(**s).set(stats.total_idle_runners)
        self.available_jobs.labels(**s).set(stats.total_available_jobs)
        self.acquired_jobs.labels(**s).set(stats.total_acquired_jobs)

    def record_desired(self, *, replicas: int, patch_id: int) -> None:
        self.desired_runners.labels(**self._scale_set).set(replicas)
        self.last_patch_id.labels(**self._scale_set).set(patch_id)

    def set_leader(self, leader: bool) -> None:
        self.is_leader.labels(**self._scale_set).set(1 if leader else 0)

    def record_poll(self) -> None:
        self.last_poll.labels(**self._scale_set).set_to_current_time()

    def record_session_conflict(self) -> None:
        self.session_conflicts.labels(**self._scale_set).inc()

    def record_rejected(self, reason: str) -> None:
        self.rejected_messages.labels(**self._scale_set, reason=reason).inc()

    # -- jobs --------------------------------------------------------------------------------

    def _job_labels(self, job: JobAssigned | JobStarted | JobCompleted) -> dict[str, str]:
        return {
            "enterprise": self.enterprise,
            "organization": job.owner_name or "",
            "repository": job.repository_name or "",
            "job_name": job.job_display_name or "",
            "event_name": job.event_name or "",
        }

    def record_job_assigned(self, job: JobAssigned, *, received_at: dt.datetime) -> None:
        assigned_at = job.scale_set_assign_time if _is_set(job.scale_set_assign_time) else received_at
        queued = seconds_between(job.queue_time, assigned_at)
        if queued is not None:
            self.job_queue_duration.labels(**self._job_labels(job)).observe(queued)

    def record_job_started(self, job: JobStarted) -> None:
        labels = self._job_labels(job)
        self.started_jobs.labels(**labels).inc()
        startup = seconds_between(job.scale_set_assign_time, job.runner_assign_time)
        if startup is not None:
            self.job_startup_duration.labels(**labels).observe(startup)

    def record_job_completed(self, job: JobCompleted) -> None:
        labels = {**self._job_labels(job), "job_result": job.result or ""}
        self.completed_jobs.labels(**labels).inc()
        # A job canceled before any runner took it has no runner assignment: no execution time.
        execution = seconds_between(job.runner_assign_time, job.finish_time)
        if execution is not None:
            self.job_execution_duration.labels(**labels).observe(execution)

    def render(self) -> bytes:
        return generate_latest(self.registry)
