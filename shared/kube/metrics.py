"""Controller metrics with controller-runtime's names, created once per Prometheus registry.

Several controllers in one process share the collectors (label ``controller`` tells them apart),
because a registry refuses a second collector of the same name.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class ControllerMetrics:
    reconcile_total: Counter  # controller, result = one of shared.kube.controller.Outcome
    reconcile_errors_total: Counter
    reconcile_time_seconds: Histogram
    active_workers: Gauge
    max_concurrent_reconciles: Gauge
    queue_depth: Gauge  # workqueue_depth{name=<controller>}
    queue_adds_total: Counter
    queue_retries_total: Counter
    skipped_total: Counter  # keys not owned by this replica
    conflicts_total: Counter  # 409s that re-ran a reconcile from fresh reads
    repeated_patches_total: Counter  # objects patched twice in one part by one reconcile attempt


_lock = threading.Lock()
_by_registry: dict[int, tuple[CollectorRegistry, ControllerMetrics]] = {}


M = TypeVar("M")


def _one_per_registry(
    table: dict[int, tuple[CollectorRegistry, M]], registry: CollectorRegistry, build: Callable[[CollectorRegistry], M]
) -> M:
    """The metrics ``build`` made for ``registry``, made once (a registry refuses a second family of
    the same name; the table is keyed by id, checked by identity: an id may be reused)."""
    with _lock:
        found = table.get(id(registry))
        if found is not None and found[0] is registry:
            return found[1]
        metrics = build(registry)
        table[id(registry)] = (registry, metrics)
        return metrics


def controller_metrics(registry: CollectorRegistry | None = None) -> ControllerMetrics:
    return _one_per_registry(_by_registry, registry or REGISTRY, _build_controller_metrics)


def _build_controller_metrics(registry: CollectorRegistry) -> ControllerMetrics:
    return ControllerMetrics(
        reconcile_total=Counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller",
            ["controller", "result"],
            registry=registry,
        ),
        reconcile_errors_total=Counter(
            "controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller",
            ["controller"],
            registry=registry,
        ),
        reconcile_time_seconds=Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            ["controller"],
            buckets=RECONCILE_BUCKETS,
            registry=registry,
        ),
        active_workers=Gauge(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            ["controller"],
            registry=registry,
        ),
        max_concurrent_reconciles=Gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            ["controller"],
            registry=registry,
        ),
        queue_depth=Gauge("workqueue_depth", "Current depth of workqueue", ["controller", "name"], registry=registry),
        queue_adds_total=Counter(
            "workqueue_adds_total",
            "Total number of adds handled by workqueue",
            ["controller", "name"],
            registry=registry,
        ),
        queue_retries_total=Counter(
            "workqueue_retries_total",
            "Total number of retries handled by workqueue",
            ["controller", "name"],
            registry=registry,
        ),
        skipped_total=Counter(
            "runnerscale_controller_skipped_total",
            "Keys skipped because another replica owns them",
            ["controller"],
            registry=registry,
        ),
        conflicts_total=Counter(
            "runnerscale_controller_conflicts_total",
            "Writes answered 409 Conflict: the reconcile re-read and decided again",
            ["controller"],
            registry=registry,
        ),
        repeated_patches_total=Counter(
            "runnerscale_reconcile_repeated_patches_total",
            "Objects one reconcile attempt patched more than once in the same part (metadata/spec or"
            " status); the rule is one patch per part",
            ["controller"],
            registry=registry,
        ),
    )


#: Client-side rate-limit waits: 0 (most requests) up to the seconds a burst of thousands queues.
RATE_LIMITER_BUCKETS = (0.0, 0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class KubeClientMetrics:
    """Requests one process's ``KubeClient`` sent and how long its rate limit held them (like
    client-go's ``rest_client_requests_total`` and ``rest_client_rate_limiter_duration_seconds``).

    Every paced request observes its wait, 0 included, so the histogram's count is the requests
    the limit paced and its ``le="0.0"`` bucket the ones that went at once: the share held by the
    limit is read from one metric. The unthrottled view (liveness) is counted, not observed.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests_total = Counter(
            "runnerscale_kube_requests_total",
            "Requests sent to the API server, by verb, resource and HTTP status (0: no answer)",
            ["verb", "resource", "code"],
            registry=registry,
        )
        self.rate_limiter_wait_seconds = Histogram(
            "runnerscale_kube_rate_limiter_wait_seconds",
            "Seconds each request waited for the client-side request-rate limit (0: went at once)",
            buckets=RATE_LIMITER_BUCKETS,
            registry=registry,
        )
        # labels() per request costs a lock and a tuple; the label set is bounded (fixed verbs and
        # resources, HTTP statuses), so the children are kept.
        self._children: dict[tuple[str, str, int], Any] = {}

    def count(self, verb: str, resource: str, code: int) -> None:
        key = (verb, resource, code)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.requests_total.labels(verb, resource, str(code))
        child.inc()

    def observe_wait(self, seconds: float) -> None:
        self.rate_limiter_wait_seconds.observe(seconds)


_client_by_registry: dict[int, tuple[CollectorRegistry, KubeClientMetrics]] = {}


def kube_client_metrics(registry: CollectorRegistry) -> KubeClientMetrics:
    """The one set per registry (a process's clients share it)."""
    return _one_per_registry(_client_by_registry, registry, KubeClientMetrics)
