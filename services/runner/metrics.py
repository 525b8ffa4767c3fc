"""Prometheus metrics of the runner worker (``runnerscale_runner_*``)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter


@dataclass(frozen=True)
class RunnerMetrics:
    pods_created: Counter
    pod_failures: Counter
    runners_deleted: Counter
    outdated: Counter
    jit_configs: Counter
    service_removals: Counter
    job_events: Counter
    failures: Counter


def runner_metrics(registry: CollectorRegistry | None = None) -> RunnerMetrics:
    """Metrics registered in ``registry`` (a fresh private registry when None, e.g. in tests)."""
    reg = registry if registry is not None else CollectorRegistry()
    return RunnerMetrics(
        pods_created=Counter("runnerscale_runner_pods_created_total", "Runner pods created", registry=reg),
        pod_failures=Counter(
            "runnerscale_runner_pod_failures_total", "Runner pod failures recorded (no job)", ["reason"], registry=reg
        ),
        runners_deleted=Counter(
            "runnerscale_runner_deleted_total",
            "EphemeralRunners deleted by the runner worker",
            ["reason"],
            registry=reg,
        ),
        outdated=Counter(
            "runnerscale_runner_outdated_total", "Runners that exited with the version-deprecated code", registry=reg
        ),
        jit_configs=Counter(
            "runnerscale_runner_jit_configs_total", "JIT config requests by result", ["result"], registry=reg
        ),
        service_removals=Counter(
            "runnerscale_runner_service_removals_total",
            "Runner removals from the Actions service by result",
            ["result"],
            registry=reg,
        ),
        job_events=Counter(
            "runnerscale_runner_job_events_total",
            "Job events consumed by kind and result",
            ["kind", "result"],
            registry=reg,
        ),
        failures=Counter(
            "runnerscale_runner_failures_total",
            "Runners that ended in failure (status Failed, or deleted for a failure), by scale set and reason",
            ["namespace", "name", "reason"],
            registry=reg,
        ),
    )
