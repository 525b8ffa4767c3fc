"""The worker's HTTP endpoints: ``/metrics`` (Prometheus) and ``/healthz`` / ``/readyz``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from shared.worker.settings import parse_listen_addr


def metrics_app(registries: Sequence[CollectorRegistry]) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        body = b"".join(generate_latest(r) for r in registries)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


def health_app(live: Callable[[], tuple[bool, str]], ready: Callable[[], tuple[bool, str]]) -> web.Application:
    def respond(check: Callable[[], tuple[bool, str]]) -> web.Response:
        ok, detail = check()
        return web.Response(status=200 if ok else 503, text=(detail or ("ok" if ok else "not ready")) + "\n")

    async def healthz(_: web.Request) -> web.Response:
        return respond(live)

    async def readyz(_: web.Request) -> web.Response:
        return respond(ready)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", healthz)
    app.router.add_get("/readyz", readyz)
    return app


class HttpServers:
    """Serves apps on listen addresses; ``ports[name]`` is the bound port (``:0`` works)."""

    def __init__(self) -> None:
        self._runners: list[web.AppRunner] = []
        self.ports: dict[str, int] = {}

    async def start(self, name: str, app: web.Application, addr: str) -> int | None:
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
        self.ports[name] = bound
        return bound

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()


__all__ = ["REGISTRY", "HttpServers", "health_app", "metrics_app"]
