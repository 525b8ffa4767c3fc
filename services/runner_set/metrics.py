"""Prometheus metrics of the runner-set worker: ARC's runner gauges plus revision and failure-budget state."""

from __future__ import annotations

import contextlib
import datetime as dt

from prometheus_client import CollectorRegistry, Counter, Gauge

from services.runner_set import decide, failures
from shared.actions import ActionsError, parse_config_url
from shared.api import EphemeralRunnerSet
from shared.api.constants import LABEL_SCALE_SET_NAME, LABEL_SCALE_SET_NAMESPACE
from shared.kube import ObjectKey

__all__ = ["GAUGE_LABELS", "RunnerSetMetrics"]

GAUGE_LABELS = ("name", "namespace", "repository", "organization", "enterprise")


class RunnerSetMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else CollectorRegistry()
        self.pending = Gauge(
            "gha_controller_pending_ephemeral_runners",
            "Number of ephemeral runners in a pending state.",
            GAUGE_LABELS,
            registry=registry,
        )
        self.running = Gauge(
            "gha_controller_running_ephemeral_runners",
            "Number of ephemeral runners in a running state.",
            GAUGE_LABELS,
            registry=registry,
        )
        self.failed = Gauge(
            "gha_controller_failed_ephemeral_runners",
            "Number of ephemeral runners in a failed state.",
            GAUGE_LABELS,
            registry=registry,
        )
        self.revision_lag = Gauge(
            "runnerscale_runner_set_revision_lag",
            "spec.actionableRevision - status.appliedActionableRevision: a runner spec update not yet rolled out.",
            GAUGE_LABELS,
            registry=registry,
        )
        self.desired_applied = Gauge(
            "runnerscale_runner_set_desired_replicas",
            "spec.replicas as last applied from the listener.",
            GAUGE_LABELS,
            registry=registry,
        )
        self.backoff_seconds = Gauge(
            "runnerscale_runner_set_failure_backoff_seconds",
            "Seconds left of the failure-budget backoff during which no runner is created (0: none).",
            GAUGE_LABELS,
            registry=registry,
        )
        self.backoff_level = Gauge(
            "runnerscale_runner_set_failure_backoff_level",
            "Failure-budget backoff level (0: none).",
            GAUGE_LABELS,
            registry=registry,
        )
        self.budget_failures = Gauge(
            "runnerscale_runner_set_failure_budget_failures",
            "Runner failures of the current revision counted in the failure-budget window.",
            GAUGE_LABELS,
            registry=registry,
        )
        self.backoffs = Counter(
            "runnerscale_runner_set_failure_backoffs_total",
            "Failure-budget escalations (runner creation backed off).",
            GAUGE_LABELS,
            registry=registry,
        )
        self.failed_replaced = Counter(
            "runnerscale_runner_set_failed_runners_replaced_total",
            "Failed runners removed after --failed-runner-ttl (and replaced when replicas still want them).",
            GAUGE_LABELS,
            registry=registry,
        )
        self.clamped = Counter(
            "runnerscale_runner_set_max_runners_clamped_total",
            "Desired states above the set's maxRunners clamped, and scale-ups capped at it.",
            GAUGE_LABELS,
            registry=registry,
        )
        self._labels: dict[ObjectKey, tuple[str, ...]] = {}

    def _all(self) -> tuple[Gauge | Counter, ...]:
        return (
            self.pending,
            self.running,
            self.failed,
            self.revision_lag,
            self.desired_applied,
            self.backoff_seconds,
            self.backoff_level,
            self.budget_failures,
            self.backoffs,
            self.failed_replaced,
            self.clamped,
        )

    def labels_of(self, ers: EphemeralRunnerSet) -> tuple[str, ...] | None:
        try:
            cfg = parse_config_url(ers.spec.ephemeral_runner_spec.github_config_url)
        except (ActionsError, ValueError):
            return None
        return (
            ers.metadata.labels.get(LABEL_SCALE_SET_NAME, ers.metadata.name),
            ers.metadata.labels.get(LABEL_SCALE_SET_NAMESPACE, ers.metadata.namespace),
            cfg.repository,
            cfg.organization,
            cfg.enterprise,
        )

    def set_budget(self, ers: EphemeralRunnerSet, a: failures.Assessment | None, now: dt.datetime) -> None:
        labels = self.labels_of(ers)
        if labels is None or a is None:
            return
        left = (a.blocked_until - now).total_seconds() if a.blocked_until is not None else 0.0
        self.backoff_seconds.labels(*labels).set(max(0.0, left))
        self.backoff_level.labels(*labels).set(a.level)
        self.budget_failures.labels(*labels).set(a.failures)
        if a.escalated:
            self.backoffs.labels(*labels).inc()

    def clamp(self, ers: EphemeralRunnerSet) -> None:
        labels = self.labels_of(ers)
        if labels is not None:
            self.clamped.labels(*labels).inc()

    def replaced(self, ers: EphemeralRunnerSet) -> None:
        labels = self.labels_of(ers)
        if labels is not None:
            self.failed_replaced.labels(*labels).inc()

    def set(self, key: ObjectKey, ers: EphemeralRunnerSet, b: decide.Buckets) -> None:
        labels = self.labels_of(ers)
        if labels is None:
            return  # as ARC: an unparsable URL publishes no gauges (the Event says why)
        old = self._labels.get(key)
        if old is not None and old != labels:
            self.forget(key)
        self._labels[key] = labels
        applied = ers.status.applied_actionable_revision if ers.status else 0
        self.pending.labels(*labels).set(b.counts.pending)
        self.running.labels(*labels).set(b.counts.running)
        self.failed.labels(*labels).set(b.counts.failed)
        self.revision_lag.labels(*labels).set(max(0, ers.spec.actionable_revision - applied))
        self.desired_applied.labels(*labels).set(ers.spec.replicas)

    def forget(self, key: ObjectKey) -> None:
        labels = self._labels.pop(key, None)
        if labels is None:
            return
        for g in self._all():
            with contextlib.suppress(KeyError):
                g.remove(*labels)
