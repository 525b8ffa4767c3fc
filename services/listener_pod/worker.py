"""The ``runnerscale listener-pod`` process: flags, and the controller wiring on the worker runtime.

    runnerscale listener-pod [worker flags] [--listener-image IMG] [--listener-metrics-addr :8080] ...

Tests run it in-process: ``running_worker("listener-pod", settings, make_setup(options))``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio

from services.listener_pod import desired as d
from services.listener_pod.metrics import listener_pod_metrics
from services.listener_pod.reconciler import ListenerPodReconciler, ReconcilerOptions
from shared.api.constants import (
    COMPONENT_LISTENER,
    KIND_AUTOSCALING_LISTENER,
    LABEL_COMPONENT,
    LABEL_LISTENER_NAME,
    LABEL_LISTENER_NAMESPACE,
    LABEL_SCALE_SET_NAME,
)
from shared.bus import subjects
from shared.kube import (
    AUTOSCALING_LISTENERS,
    AUTOSCALING_RUNNER_SETS,
    PODS,
    ROLE_BINDINGS,
    ROLES,
    SERVICE_ACCOUNTS,
    Change,
    ChangeType,
    Controller,
    ObjectKey,
    Watches,
)
from shared.worker import SettingsError, WorkerContext, add_worker_arguments, load_worker_settings, run_worker
from shared.worker.runtime import Setup

NAME = "listener-pod"
CONTROLLER_NAME = "autoscalinglistener"
POD_SELECTOR = f"{LABEL_COMPONENT}={COMPONENT_LISTENER}"


def listener_key_from_labels(obj: Any) -> Iterable[ObjectKey]:
    """Role / RoleBinding (in the ARS namespace, no owner reference) → its AL, by ARC's labels."""
    if obj is None:
        return ()
    labels = obj.metadata.labels
    ns, name = labels.get(LABEL_LISTENER_NAMESPACE), labels.get(LABEL_LISTENER_NAME)
    return (ObjectKey(ns, name),) if ns and name else ()


@dataclass(frozen=True)
class WhenGone(Watches):
    """A :class:`Watches` source that only fires for objects being deleted or deleted (ARS status
    churns with every runner count change; only its disappearance matters to a listener)."""

    def keys(self, change: Change[Any]) -> Iterable[ObjectKey]:
        if change.type is ChangeType.DELETED or (change.obj is not None and change.obj.metadata.is_deleting):
            return self.map_keys(change.obj)
        return ()


def make_setup(options: ReconcilerOptions | None = None, *, pass_bus_settings: bool = True) -> Setup:
    """The worker's setup: one controller over AutoscalingListeners, woken by their pods, service
    accounts, roles and role bindings, their AutoscalingRunnerSets, by ``runnerscale.changes.autoscalinglistener.>`` on the bus,
    and by a periodic resync (GitHub secrets are not watched, as in ARC)."""
    base = options or ReconcilerOptions()

    def setup(ctx: WorkerContext) -> list[Controller]:
        opts = base
        if pass_bus_settings and not opts.bus.servers:
            opts = replace(opts, bus=d.BusPassThrough.from_bus_settings(ctx.settings.bus))
        reconciler = ListenerPodReconciler(
            ctx.kube, opts, recorder=ctx.events, metrics=listener_pod_metrics(ctx.registry)
        )
        als = ctx.informers(AUTOSCALING_LISTENERS)
        arss = ctx.informers(AUTOSCALING_RUNNER_SETS)

        def listeners_of_runner_set(ars: Any) -> list[ObjectKey]:
            """ARS → the ALs that name it (an ARS deleted without the scale-set worker's cleanup
            must still take its listener down promptly)."""
            if ars is None:
                return []
            ns, name = ars.metadata.namespace, ars.metadata.name
            return [
                ObjectKey(al.metadata.namespace, al.metadata.name)
                for informer in als
                for al in informer.list_cached()
                if al.spec.autoscaling_runner_set_namespace == ns and al.spec.autoscaling_runner_set_name == name
            ]

        pods = ctx.informers(PODS, label_selector=POD_SELECTOR)
        sas = ctx.informers(SERVICE_ACCOUNTS, label_selector=LABEL_SCALE_SET_NAME)
        rbac = [
            *ctx.informers(ROLES, label_selector=LABEL_LISTENER_NAME),
            *ctx.informers(ROLE_BINDINGS, label_selector=LABEL_LISTENER_NAME),
        ]
        controller = ctx.controller(
            CONTROLLER_NAME,
            reconciler.reconcile,
            [
                *ctx.for_(als),
                *ctx.owns(pods, KIND_AUTOSCALING_LISTENER),
                *ctx.owns(sas, KIND_AUTOSCALING_LISTENER),
                *[Watches(i, listener_key_from_labels) for i in rbac],
                *[WhenGone(i, listeners_of_runner_set) for i in arss],
            ],
        )
        ctx.route(subjects.LISTENER_POD_CHANGES, controller)
        ctx.listener_pod_reconciler = reconciler  # for tests and introspection
        return [controller]

    return setup


# --- CLI -----------------------------------------------------------------------------------------------


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def add_listener_pod_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("listener pods")
    g.add_argument(
        "--listener-image",
        default=_env("RUNNERSCALE_LISTENER_IMAGE", d.ListenerPodSettings.image),
        help="listener image when the AL's spec.image is empty [env RUNNERSCALE_LISTENER_IMAGE]",
    )
    g.add_argument(
        "--listener-metrics-addr",
        default=_env("RUNNERSCALE_LISTENER_METRICS_ADDR", ":8080"),
        help="listener /metrics address; '0' disables (no port, empty metrics_addr) [env RUNNERSCALE_LISTENER_METRICS_ADDR]",
    )
    g.add_argument(
        "--listener-metrics-endpoint",
        default=_env("RUNNERSCALE_LISTENER_METRICS_ENDPOINT", "/metrics"),
        help="listener metrics path",
    )
    g.add_argument(
        "--listener-health-addr",
        default=_env("RUNNERSCALE_LISTENER_HEALTH_ADDR", ":8081"),
        help="listener /healthz /readyz address (liveness/readiness probes); '0' disables [env RUNNERSCALE_LISTENER_HEALTH_ADDR]",
    )
    g.add_argument(
        "--listener-log-level",
        default=_env("RUNNERSCALE_LISTENER_LOG_LEVEL", "info"),
        help="log level written into the listener config",
    )
    g.add_argument(
        "--listener-nats-url",
        action="append",
        default=None,
        help="NATS URL(s) written into the listener config (default: this worker's --nats-url)",
    )
    g.add_argument(
        "--exclude-label-propagation-prefix",
        action="append",
        default=[],
        help="label key prefix not copied to derived objects (repeatable)",
    )
    g.add_argument(
        "--resync-period",
        type=float,
        default=float(_env("RUNNERSCALE_LISTENER_RESYNC_SECONDS", "60")),
        help="seconds between re-reconciles of every AL (GitHub secret rotation)",
    )
    g.add_argument(
        "--listener-restart-backoff",
        type=float,
        default=1.0,
        help="base seconds of the backoff between recreations of a failing listener pod",
    )
    g.add_argument("--listener-restart-backoff-max", type=float, default=60.0, help="cap of that backoff")
    g.add_argument(
        "--node-sim-exec",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="annotate pods runnerscale.dev/node-sim-exec=true (the embedded node simulator runs them as processes)",
    )


def options_from_args(args: argparse.Namespace) -> ReconcilerOptions:
    for flag, value in (
        ("--resync-period", args.resync_period),
        ("--listener-restart-backoff", args.listener_restart_backoff),
        ("--listener-restart-backoff-max", args.listener_restart_backoff_max),
    ):
        if value <= 0:
            raise SettingsError(flag, f"must be > 0, got {value}")
    for flag, addr in (
        ("--listener-metrics-addr", args.listener_metrics_addr),
        ("--listener-health-addr", args.listener_health_addr),
    ):
        if d.enabled_addr(addr) and not d.addr_port(addr) and not addr.endswith(":0"):
            raise SettingsError(flag, f"{addr!r} is not a host:port address")
    settings = d.ListenerPodSettings(
        image=args.listener_image,
        metrics_addr=args.listener_metrics_addr,
        metrics_endpoint=args.listener_metrics_endpoint,
        health_addr=args.listener_health_addr,
        log_level=args.listener_log_level,
        exclude_label_prefixes=tuple(args.exclude_label_propagation_prefix or ()),
        node_sim_exec=args.node_sim_exec,
    )
    return ReconcilerOptions(
        settings=settings,
        backoff=d.Backoff(base=args.listener_restart_backoff, cap=args.listener_restart_backoff_max),
        resync_seconds=args.resync_period,
    )


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=f"runnerscale {NAME}", description="reconcile AutoscalingListeners into listener pods"
    )
    add_worker_arguments(parser)
    add_listener_pod_arguments(parser)
    args = parser.parse_args(list(argv))
    try:
        settings = load_worker_settings(args)
        options = options_from_args(args)
    except SettingsError as exc:
        print(f"runnerscale {NAME}: {exc}", file=sys.stderr)
        return 2
    if args.listener_nats_url:
        options = replace(
            options,
            bus=replace(d.BusPassThrough.from_bus_settings(settings.bus), servers=tuple(args.listener_nats_url)),
        )
    return anyio.run(run_worker, NAME, settings, make_setup(options))
