"""Worker settings: where Kubernetes and NATS are, who this replica is, where it serves HTTP.

Defaults < environment < flags, validated once at start-up; a bad value is a
:class:`SettingsError` naming the environment variable and the flag (the same error type the bus
settings raise, so a ``main`` catches one type).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from shared.bus.errors import SettingsError
from shared.bus.settings import BusSettings, add_bus_arguments, load_settings

LOG_LEVELS = ("debug", "info", "warning", "error")
OWNERSHIPS = ("kube", "nats")  # where shard leases live (README "Shard ownership leases")


def default_replica_id(environ: Mapping[str, str] | None = None) -> str:
    """``POD_NAME`` (the Downward API), else the hostname."""
    env = os.environ if environ is None else environ
    return env.get("POD_NAME") or socket.gethostname() or "runnerscale-worker"


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Everything ``run_worker`` needs. Durations are seconds.

    ``kubeconfig`` empty: in-cluster when ``KUBERNETES_SERVICE_HOST`` is set, else the default
    kubeconfig (``$KUBECONFIG`` / ``~/.kube/config``). ``kube_url`` (plain HTTP, no auth: the
    embedded emulator) wins over both when set.
    ``metrics_addr`` / ``health_addr``: ``host:port`` (``:0`` picks a free port), ``"0"`` disables.
    ``namespaces`` empty: watch all namespaces.
    """

    bus: BusSettings = msgspec.field(default_factory=BusSettings)
    kubeconfig: str = ""
    kube_url: str = ""
    kube_context: str = ""
    replica_id: str = ""
    metrics_addr: str = ":8080"
    health_addr: str = ":8081"
    namespaces: tuple[str, ...] = ()
    log_level: str = "info"
    workers: int = 2  # concurrent reconciles per controller
    kube_request_timeout: float = 30.0
    actions_timeout: float = 60.0  # deadline of one Actions service call (all retries)
    shutdown_timeout: float = 10.0  # graceful stop budget on SIGTERM
    ownership: str = "kube"  # shard leases: kube (Kubernetes Leases) or nats (NATS KV)
    lease_namespace: str = ""  # kube ownership: "" = POD_NAMESPACE, else runnerscale-system
    lease_duration: float = (
        10.0  # kube ownership (crash handover within D + D/3 ≈ 13.3 s): seconds a shard Lease outlives its last renewal
    )


@dataclass(frozen=True)
class _Opt:
    field: str
    env: str
    flag: str
    help: str
    kind: str = "str"  # str | int | float | list

    @property
    def label(self) -> str:
        return f"{self.env} / {self.flag}"


OPTIONS: tuple[_Opt, ...] = (
    _Opt("kubeconfig", "KUBECONFIG", "--kubeconfig", "kubeconfig path (default: in-cluster, else ~/.kube/config)"),
    _Opt(
        "kube_url",
        "RUNNERSCALE_KUBE_URL",
        "--kube-url",
        "plain-HTTP API server URL without auth (the embedded emulator)",
    ),
    _Opt("kube_context", "RUNNERSCALE_KUBE_CONTEXT", "--kube-context", "kubeconfig context"),
    _Opt("replica_id", "POD_NAME", "--replica-id", "this replica's id (default: POD_NAME, else the hostname)"),
    _Opt(
        "metrics_addr", "RUNNERSCALE_METRICS_ADDR", "--metrics-addr", "Prometheus /metrics listen address, '0' disables"
    ),
    _Opt(
        "health_addr", "RUNNERSCALE_HEALTH_ADDR", "--health-addr", "/healthz and /readyz listen address, '0' disables"
    ),
    _Opt(
        "namespaces",
        "RUNNERSCALE_WATCH_NAMESPACES",
        "--watch-namespace",
        "namespace(s) to watch, comma-separated (default all)",
        "list",
    ),
    _Opt("log_level", "RUNNERSCALE_LOG_LEVEL", "--log-level", "debug, info, warning or error"),
    _Opt("workers", "RUNNERSCALE_WORKERS", "--workers", "concurrent reconciles per controller", "int"),
    _Opt(
        "kube_request_timeout",
        "RUNNERSCALE_KUBE_REQUEST_TIMEOUT",
        "--kube-request-timeout",
        "seconds per Kubernetes API request",
        "float",
    ),
    _Opt(
        "actions_timeout",
        "RUNNERSCALE_ACTIONS_TIMEOUT",
        "--actions-timeout",
        "seconds per Actions service call (all retries)",
        "float",
    ),
    _Opt(
        "shutdown_timeout",
        "RUNNERSCALE_SHUTDOWN_TIMEOUT",
        "--shutdown-timeout",
        "seconds a graceful stop may take",
        "float",
    ),
    _Opt(
        "ownership",
        "RUNNERSCALE_OWNERSHIP",
        "--ownership",
        "where shard leases live: kube (Kubernetes Leases) or nats (NATS KV)",
    ),
    _Opt(
        "lease_namespace",
        "RUNNERSCALE_LEASE_NAMESPACE",
        "--lease-namespace",
        "namespace of the shard Leases (default: POD_NAMESPACE, else runnerscale-system)",
    ),
    _Opt(
        "lease_duration",
        "RUNNERSCALE_LEASE_DURATION",
        "--lease-duration",
        "seconds a shard Lease outlives its last renewal (kube ownership)",
        "float",
    ),
)
_BY_FIELD = {o.field: o for o in OPTIONS}


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the worker flags and the bus flags (unset flags fall back to the environment)."""
    group = parser.add_argument_group("worker")
    for o in OPTIONS:
        if o.kind == "list":
            group.add_argument(
                o.flag,
                dest=f"worker_{o.field}",
                action="append",
                default=None,
                metavar="NS",
                help=f"{o.help} [env {o.env}]",
            )
        else:
            group.add_argument(
                o.flag, dest=f"worker_{o.field}", default=None, metavar=o.env, help=f"{o.help} [env {o.env}]"
            )
    add_bus_arguments(parser)


def _parse(o: _Opt, raw: Any) -> Any:
    if o.kind == "list":
        items = raw if isinstance(raw, list) else [raw]
        out: list[str] = []
        for item in items:
            out.extend(p.strip() for p in str(item).split(",") if p.strip())
        return tuple(dict.fromkeys(out))
    if o.kind == "int":
        return int(raw)
    if o.kind == "float":
        return float(raw)
    return str(raw)


def load_worker_settings(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> WorkerSettings:
    """Build and validate settings: defaults < environment < flags. Raises SettingsError."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for o in OPTIONS:
        raw = getattr(args, f"worker_{o.field}", None) if args is not None else None
        if raw is None:
            raw = env.get(o.env)
        if raw is None or raw == "":
            continue
        try:
            values[o.field] = _parse(o, raw)
        except ValueError:
            raise SettingsError(o.label, f"cannot parse {o.field.replace('_', ' ')} from {raw!r}") from None
    bus = load_settings(args, env)
    settings = WorkerSettings(bus=bus, **values)
    if not settings.replica_id:
        settings = msgspec.structs.replace(settings, replica_id=default_replica_id(env))
    validate_worker_settings(settings)
    return settings


def parse_listen_addr(addr: str) -> tuple[str, int] | None:
    """``":8080"`` / ``"0.0.0.0:8080"`` / ``"127.0.0.1:0"`` → (host, port); ``"0"`` or ``""`` → None (disabled)."""
    if addr in ("", "0"):
        return None
    host, sep, port_text = addr.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{addr!r} is not a host:port listen address")
    return (host.strip("[]") or "0.0.0.0", int(port_text))


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def validate_worker_settings(s: WorkerSettings) -> None:
    """Raise :class:`SettingsError` naming the first bad setting (pure)."""

    def bad(field: str, problem: str) -> SettingsError:
        return SettingsError(_BY_FIELD[field].label, problem)

    for field in ("metrics_addr", "health_addr"):
        try:
            parse_listen_addr(getattr(s, field))
        except ValueError as exc:
            raise bad(field, str(exc)) from None
    if s.kube_url and not s.kube_url.startswith(("http://", "https://")):
        raise bad("kube_url", f"{s.kube_url!r} is not an http(s) URL")
    if s.log_level.lower() not in LOG_LEVELS:
        raise bad("log_level", f"must be one of {', '.join(LOG_LEVELS)}, got {s.log_level!r}")
    if not 1 <= s.workers <= 64:
        raise bad("workers", f"must be 1..64, got {s.workers}")
    for field in ("kube_request_timeout", "actions_timeout", "shutdown_timeout"):
        if getattr(s, field) <= 0:
            raise bad(field, f"must be > 0, got {getattr(s, field)}")
    for ns in s.namespaces:
        if not ns or "/" in ns:
            raise bad("namespaces", f"{ns!r} is not a namespace name")
    if not s.replica_id:
        raise bad("replica_id", "must not be empty")
    if s.ownership not in OWNERSHIPS:
        raise bad("ownership", f"must be one of {', '.join(OWNERSHIPS)}, got {s.ownership!r}")
    if s.lease_duration < 1.0:
        raise bad("lease_duration", f"must be >= 1 second, got {s.lease_duration}")
    if s.lease_namespace and not _DNS_LABEL.fullmatch(s.lease_namespace):
        raise bad("lease_namespace", f"{s.lease_namespace!r} is not a namespace name")


__all__ = [
    "LOG_LEVELS",
    "OPTIONS",
    "OWNERSHIPS",
    "SettingsError",
    "WorkerSettings",
    "add_worker_arguments",
    "default_replica_id",
    "load_worker_settings",
    "parse_listen_addr",
    "validate_worker_settings",
]
