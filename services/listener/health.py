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
from shared.listener_config import parse_listen_addr


class Role(str, enum.Enum):
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
    async def healthz(_: web.Request) -> web.Response:
        v = verdict(state, now=time.monotonic(), staleness=staleness)
        return web.Response(status=200 if v.live else 503, text=v.reason if not v.live else "ok")

    async def readyz(_: web.Request) -> web.Response:
        v = verdict(state, now=time.monotonic(), staleness=staleness)
        return web.Response(status=200 if v.ready else 503, text=v.reason)

    async def metrics_handler(_: web.Request) -> web.Response:
        assert metrics is not None
        return web.Response(body=metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    app = web.Application()
    if health:
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
    if metrics is not None:
        app.router.add_get(metrics_path, metrics_handler)
    return app


class HttpEndpoints:
    """Serves the apps on their listen addresses; ``ports`` holds the bound ports (``:0`` works)."""

    def __init__(self) -> None:
        self._runners: list[web.AppRunner] = []
        self.ports: dict[str, int] = {}

    async def start(self, name: str, app: web.Application, addr: str) -> int:
        host, port = parse_listen_addr(addr)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        self._runners.append(runner)
        bound = runner.addresses[0][1] if runner.addresses else port
        self.ports[name] = bound
        return bound

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
