"""Liveness, readiness and metrics over HTTP.

``/healthz`` (liveness): the listener's loop is making progress: a leader polled, or a standby
tried the lease, within the staleness window. A wedged loop fails it and Kubernetes restarts the
pod (ARC's listener has no probes at all).

``/readyz`` (readiness): this replica is the active listener: it holds the lease, has a live
message session and completed a poll within the staleness window. A standby answers 503 with
``standby`` so ``kubectl get pods`` shows which replica is active.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from aiohttp import web

from services.listener.metrics import ListenerMetrics
from shared.http import add_metrics, add_probes


class Role(enum.StrEnum):
    STARTING = "starting"
    STANDBY = "standby"
    LEADER = "leader"
    STOPPING = "stopping"


@dataclass
class HealthState:
    """Mutable facts the loop updates; the endpoints read them through :func:`verdict`."""

    role: Role = Role.STARTING
    session_id: str = ""
    #: monotonic time of the last loop progress (a poll answered or a lease attempt made)
    last_progress: float | None = None
    #: monotonic time of the last successful long poll (200 or 202)
    last_poll_ok: float | None = None
    started: float = 0.0

    def __post_init__(self) -> None:
        self.started = time.monotonic()

    def progressed(self) -> None:
        self.last_progress = time.monotonic()

    def polled(self) -> None:
        self.last_poll_ok = self.last_progress = time.monotonic()


@dataclass(frozen=True)
class Verdict:
    live: bool
    ready: bool
    reason: str


def verdict(state: HealthState, *, now: float, staleness: float) -> Verdict:
    """Pure: decide both probes from the loop's facts."""
    progress = state.last_progress if state.last_progress is not None else state.started
    live = now - progress <= staleness
    if not live:
        return Verdict(False, False, f"no loop progress for {now - progress:.0f}s")
    if state.role is not Role.LEADER:
        return Verdict(True, False, state.role.value)
    if not state.session_id:
        return Verdict(True, False, "leader without a message session")
    if state.last_poll_ok is None or now - state.last_poll_ok > staleness:
        return Verdict(True, False, "no successful poll recently")
    return Verdict(True, True, "ok")


def build_app(
    *, state: HealthState, staleness: float, metrics: ListenerMetrics | None, metrics_path: str, health: bool
) -> web.Application:
    """The listener's routes on one application (``metrics`` None: no ``/metrics``; ``health``
    False: no probes), served by :class:`shared.http.HttpServers`."""

    def live() -> tuple[bool, str]:
        v = verdict(state, now=time.monotonic(), staleness=staleness)
        return v.live, "ok" if v.live else v.reason

    def ready() -> tuple[bool, str]:
        v = verdict(state, now=time.monotonic(), staleness=staleness)
        return v.ready, v.reason

    app = web.Application()
    if health:
        add_probes(app, live=live, ready=ready)
    if metrics is not None:
        add_metrics(app, metrics.render, path=metrics_path)
    return app
