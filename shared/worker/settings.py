"""Worker settings: where Kubernetes and NATS are, who this replica is, where it serves HTTP.

Defaults < environment < flags (:mod:`shared.settings`), validated once at start-up; a bad value
is a :class:`SettingsError` naming the environment variable and the flag.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
from collections.abc import Mapping
from typing import Annotated, ClassVar

import msgspec

from shared import settings
from shared.bus.settings import BusSettings, register_secrets
from shared.http import parse_listen_addr
from shared.settings import InvalidSetting, SettingsError, option

LOG_LEVELS = ("debug", "info", "warning", "error")
OWNERSHIPS = ("kube", "nats")  # where shard leases live (README "Shard ownership leases")

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def default_replica_id(environ: Mapping[str, str] | None = None) -> str:
    """``POD_NAME`` (the Downward API), else the hostname."""
    env = os.environ if environ is None else environ
    return env.get("POD_NAME") or socket.gethostname() or "runnerscale-worker"


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the runtime needs. Durations are seconds.

    ``kubeconfig`` empty: in-cluster when ``KUBERNETES_SERVICE_HOST`` is set, else the default
    kubeconfig (``$KUBECONFIG`` / ``~/.kube/config``). ``kube_url`` (plain HTTP, no auth: the
    embedded emulator) wins over both when set.
    ``metrics_addr`` / ``health_addr``: ``host:port`` (``:0`` picks a free port), ``"0"`` disables.
    ``namespaces`` empty: watch all namespaces.
    """

    settings_title: ClassVar[str] = "worker"

    bus: BusSettings = msgspec.field(default_factory=BusSettings)
    kubeconfig: Annotated[
        str, option("--kubeconfig", "KUBECONFIG", "kubeconfig path (default: in-cluster, else ~/.kube/config)")
    ] = ""
    kube_url: Annotated[
        str,
        option("--kube-url", "RUNNERSCALE_KUBE_URL", "plain-HTTP API server URL without auth (the embedded emulator)"),
    ] = ""
    kube_context: Annotated[str, option("--kube-context", "RUNNERSCALE_KUBE_CONTEXT", "kubeconfig context")] = ""
    replica_id: Annotated[
        str, option("--replica-id", "POD_NAME", "this replica's id (default: POD_NAME, else the hostname)")
    ] = ""
    metrics_addr: Annotated[
        str, option("--metrics-addr", "RUNNERSCALE_METRICS_ADDR", "Prometheus /metrics listen address, '0' disables")
    ] = ":8080"
    health_addr: Annotated[
        str, option("--health-addr", "RUNNERSCALE_HEALTH_ADDR", "/healthz and /readyz listen address, '0' disables")
    ] = ":8081"
    namespaces: Annotated[
        tuple[str, ...],
        option(
            "--watch-namespace",
            "RUNNERSCALE_WATCH_NAMESPACES",
            "namespace(s) to watch, repeatable or comma-separated (default all)",
            metavar="NS",
        ),
    ] = ()
    log_level: Annotated[str, option("--log-level", "RUNNERSCALE_LOG_LEVEL", "debug, info, warning or error")] = "info"
    # Concurrent reconciles per controller (never two of one key). Sized for bursts: 16 instead of
    # 2 halved teardown latency (README "Settings"); the request-rate limit below keeps manners.
    workers: Annotated[int, option("--workers", "RUNNERSCALE_WORKERS", "concurrent reconciles per controller")] = 16
    # Client-side Kubernetes request rate and burst per process, like client-go's QPS/Burst.
    kube_qps: Annotated[
        float,
        option("--kube-qps", "RUNNERSCALE_KUBE_QPS", "Kubernetes requests per second per process (0: unlimited)"),
    ] = 200.0
    kube_burst: Annotated[
        int,
        option("--kube-burst", "RUNNERSCALE_KUBE_BURST", "Kubernetes requests allowed at once above the rate"),
    ] = 400
    kube_request_timeout: Annotated[
        float,
        option("--kube-request-timeout", "RUNNERSCALE_KUBE_REQUEST_TIMEOUT", "seconds per Kubernetes API request"),
    ] = 30.0
    # Deadline of one Actions service call, all retries included.
    actions_timeout: Annotated[
        float,
        option("--actions-timeout", "RUNNERSCALE_ACTIONS_TIMEOUT", "seconds per Actions service call (all retries)"),
    ] = 60.0
    # Deadline of one reconcile, conflict re-runs included: longer than the slowest bounded step
    # (an Actions call with retries, 120 s in the runner worker), short enough that a hung
    # reconcile frees its worker and is retried.
    reconcile_timeout: Annotated[
        float,
        option(
            "--reconcile-timeout",
            "RUNNERSCALE_RECONCILE_TIMEOUT",
            "seconds one reconcile may take before it is cancelled and retried",
        ),
    ] = 300.0
    # Graceful stop budget on SIGTERM: in-flight reconciles get this long to finish.
    shutdown_timeout: Annotated[
        float, option("--shutdown-timeout", "RUNNERSCALE_SHUTDOWN_TIMEOUT", "seconds a graceful stop may take")
    ] = 10.0
    ownership: Annotated[
        str,
        option(
            "--ownership",
            "RUNNERSCALE_OWNERSHIP",
            "where shard leases live: kube (Kubernetes Leases) or nats (NATS KV)",
        ),
    ] = "kube"
    # kube ownership: "" = POD_NAMESPACE, else runnerscale-system
    lease_namespace: Annotated[
        str,
        option(
            "--lease-namespace",
            "RUNNERSCALE_LEASE_NAMESPACE",
            "namespace of the shard Leases (default: POD_NAMESPACE, else runnerscale-system)",
        ),
    ] = ""
    # kube ownership (crash handover within D + D/3 ≈ 13.3 s)
    lease_duration: Annotated[
        float,
        option(
            "--lease-duration",
            "RUNNERSCALE_LEASE_DURATION",
            "seconds a shard Lease outlives its last renewal (kube ownership)",
        ),
    ] = 10.0

    def validate(self) -> None:
        """Raise :class:`InvalidSetting` for the first bad setting (pure)."""
        for field in ("metrics_addr", "health_addr"):
            try:
                parse_listen_addr(getattr(self, field))
            except ValueError as exc:
                raise InvalidSetting(field, str(exc)) from None
        if self.kube_url and not self.kube_url.startswith(("http://", "https://")):
            raise InvalidSetting("kube_url", f"{self.kube_url!r} is not an http(s) URL")
        if self.log_level.lower() not in LOG_LEVELS:
            raise InvalidSetting("log_level", f"must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}")
        if not 1 <= self.workers <= 64:
            raise InvalidSetting("workers", f"must be 1..64, got {self.workers}")
        if not 0 <= self.kube_qps < float("inf"):
            raise InvalidSetting("kube_qps", f"must be >= 0 (0: unlimited), got {self.kube_qps}")
        if self.kube_qps > 0 and self.kube_burst < 1:
            raise InvalidSetting("kube_burst", f"must be >= 1, got {self.kube_burst}")
        for field in ("kube_request_timeout", "actions_timeout", "reconcile_timeout", "shutdown_timeout"):
            if getattr(self, field) <= 0:
                raise InvalidSetting(field, f"must be > 0, got {getattr(self, field)}")
        for ns in self.namespaces:
            if not ns or "/" in ns:
                raise InvalidSetting("namespaces", f"{ns!r} is not a namespace name")
        if not self.replica_id:
            raise InvalidSetting("replica_id", "must not be empty")
        if self.ownership not in OWNERSHIPS:
            raise InvalidSetting("ownership", f"must be one of {', '.join(OWNERSHIPS)}, got {self.ownership!r}")
        if self.lease_duration < 1.0:
            raise InvalidSetting("lease_duration", f"must be >= 1 second, got {self.lease_duration}")
        if self.lease_namespace and not _DNS_LABEL.fullmatch(self.lease_namespace):
            raise InvalidSetting("lease_namespace", f"{self.lease_namespace!r} is not a namespace name")


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the worker flags and the bus flags (unset flags fall back to the environment)."""
    settings.add_arguments(parser, WorkerSettings)


def load_worker_settings(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> WorkerSettings:
    """Build and validate settings: defaults < environment < flags. Raises SettingsError."""
    env = os.environ if environ is None else environ
    loaded = settings.load(WorkerSettings, args, env, defaults={"replica_id": default_replica_id(env)})
    register_secrets(loaded.bus)
    return loaded


__all__ = [
    "LOG_LEVELS",
    "OWNERSHIPS",
    "SettingsError",
    "WorkerSettings",
    "add_worker_arguments",
    "default_replica_id",
    "load_worker_settings",
    "parse_listen_addr",
]
