"""Metrics of the listener-pod worker (one set per Prometheus registry)."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from shared.actions import ActionsError, parse_config_url

SCALE_SET_LABELS = ("name", "namespace", "repository", "organization", "enterprise")


@dataclass(frozen=True)
class ListenerPodMetrics:
    #: As ARC: 1 while the listener container runs, 0 on pod create/delete/terminate.
    running_listeners: Gauge
    #: Listener pods deleted to be recreated, by reason (terminated, evicted, pod-failed,
    #: pod-succeeded, spec-drift, config-changed, foreign-owner).
    recreations_total: Counter
    #: Config Secret data (re)written, by reason (created, changed).
    config_writes_total: Counter

    def set_running(self, al_name: str, al_namespace: str, config_url: str, value: int) -> None:
        self.running_listeners.labels(*url_labels(al_name, al_namespace, config_url)).set(value)

    def forget(self, al_name: str, al_namespace: str, config_url: str) -> None:
        with contextlib.suppress(KeyError):
            self.running_listeners.remove(*url_labels(al_name, al_namespace, config_url))


def url_labels(name: str, namespace: str, config_url: str) -> tuple[str, str, str, str, str]:
    """(name, namespace, repository, organization, enterprise); an unparsable URL gives empty parts."""
    try:
        cfg = parse_config_url(config_url)
    except (ActionsError, ValueError):
        return (name, namespace, "", "", "")
    return (name, namespace, cfg.repository, cfg.organization, cfg.enterprise)


_lock = threading.Lock()
_by_registry: dict[int, tuple[CollectorRegistry, ListenerPodMetrics]] = {}


def listener_pod_metrics(registry: CollectorRegistry | None = None) -> ListenerPodMetrics:
    registry = registry or REGISTRY
    with _lock:
        found = _by_registry.get(id(registry))
        if found is not None and found[0] is registry:
            return found[1]
        metrics = ListenerPodMetrics(
            running_listeners=Gauge(
                "gha_controller_running_listeners",
                "Number of listeners whose listener container is running (per AutoscalingListener)",
                list(SCALE_SET_LABELS),
                registry=registry,
            ),
            recreations_total=Counter(
                "runnerscale_listener_pod_recreations_total",
                "Listener pods deleted in order to be recreated, by reason",
                ["name", "namespace", "reason"],
                registry=registry,
            ),
            config_writes_total=Counter(
                "runnerscale_listener_config_writes_total",
                "Listener config Secrets created or rewritten, by reason",
                ["name", "namespace", "reason"],
                registry=registry,
            ),
        )
        _by_registry[id(registry)] = (registry, metrics)
        return metrics
