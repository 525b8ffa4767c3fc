"""The HTTP endpoints every process serves: ``/metrics`` (Prometheus) and the probes ``/healthz``
(``/livez``) and ``/readyz`` (README "Worker runtime", and the listener's "Health" section).

A probe is a :data:`Check`: ``() -> (ok, detail)``; the answer is 200 or 503 with the detail as
the body. :class:`HttpServers` serves applications on listen addresses (``:0`` picks a free
port, ``"0"`` or empty disables one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = [
    "REGISTRY",
    "Check",
    "HttpServers",
    "add_metrics",
    "add_probes",
    "health_app",
    "listen_enabled",
    "metrics_app",
    "parse_listen_addr",
]

Check = Callable[[], tuple[bool, str]]


def listen_enabled(addr: str) -> bool:
    """False for a server turned off: an empty address or ARC's ``"0"``."""
    return (addr or "").strip() not in ("", "0")


def parse_listen_addr(addr: str) -> tuple[str, int] | None:
    """``":8080"`` / ``"0.0.0.0:8080"`` / ``"127.0.0.1:0"`` / ``"[::1]:9"`` → (host, port);
    ``"0"`` or ``""`` → None (disabled). ValueError for anything else."""
    if not listen_enabled(addr):
        return None
    host, sep, port_text = addr.strip().rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{addr!r} is not a host:port listen address")
    return (host.strip("[]") or "0.0.0.0", int(port_text))


def add_probes(app: web.Application, *, live: Check, ready: Check) -> None:
    """``/healthz`` and ``/livez`` answer ``live``; ``/readyz`` answers ``ready``."""

    def respond(check: Check) -> web.Response:
        ok, detail = check()
        return web.Response(status=200 if ok else 503, text=detail or ("ok" if ok else "not ready"))

    async def healthz(_: web.Request) -> web.Response:
        return respond(live)

    async def readyz(_: web.Request) -> web.Response:
        return respond(ready)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", healthz)
    app.router.add_get("/readyz", readyz)


def add_metrics(app: web.Application, render: Callable[[], bytes], *, path: str = "/metrics") -> None:
    """Serve ``render()`` (the Prometheus text format) on ``path``."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get(path, metrics)


def metrics_app(registries: Sequence[CollectorRegistry]) -> web.Application:
    app = web.Application()
    add_metrics(app, lambda: b"".join(generate_latest(r) for r in registries))
    return app


def health_app(live: Check, ready: Check) -> web.Application:
    app = web.Application()
    add_probes(app, live=live, ready=ready)
    return app


class HttpServers:
    """Serves apps on listen addresses; ``ports[name]`` is the bound port (``:0`` works)."""

    def __init__(self) -> None:
        self._runners: list[web.AppRunner] = []
        self.ports: dict[str, int] = {}

    async def start(self, name: str, app: web.Application, addr: str) -> int | None:
        """Listen on ``addr`` (None: disabled) and return the bound port."""
        parsed = parse_listen_addr(addr)
        if parsed is None:
            return None
        host, port = parsed
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        self._runners.append(runner)
        bound = runner.addresses[0][1] if runner.addresses else port
        self.ports[name] = int(bound)
        return int(bound)

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
