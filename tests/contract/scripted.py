"""A scripted Actions-like HTTP server for transport tests: real HTTP, canned answers.

It serves the auth chain (registration token, runner-registration) like GHES, then answers each
other request from a per-route script of steps (status, body, headers, delay, or "drop the
connection"), falling back to a default answer. Every request is recorded. The stateful
behaviour lives in the simulator (services/embedded/actions_sim); this server exists to pin transport
behaviour (retry counts, waits, deadlines, TLS, proxies) exactly.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from aiohttp import web


def fake_jwt(exp: float) -> str:
    def b64(doc: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()

    return f"{b64({'alg': 'RS256', 'typ': 'JWT'})}.{b64({'exp': int(exp)})}.c2lnbmF0dXJl"


@dataclass
class Step:
    status: int = 200
    body: bytes | str | dict[str, Any] | list[Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False  # close the connection without answering


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    at: float


class ScriptedServer:
    def __init__(self, *, admin_ttl: float = 3600.0) -> None:
        self.admin_ttl = admin_ttl
        self.scripts: dict[tuple[str, str], deque[Step]] = defaultdict(deque)
        self.defaults: dict[tuple[str, str], Step] = {}
        self.requests: list[Recorded] = []
        self.exchanges = 0
        self.port = 0
        self.scheme = "http"
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def config_url(self, org: str = "octo-org") -> str:
        return f"{self.url}/{org}"

    @property
    def actions_base(self) -> str:
        return f"{self.url}/tenant/123/"

    def script(self, method: str, path: str, *steps: Step) -> None:
        self.scripts[(method, path)].extend(steps)

    def default(self, method: str, path: str, step: Step) -> None:
        self.defaults[(method, path)] = step

    def calls(self, method: str, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path == path]

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.scheme = "https" if ssl_context else "http"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            Recorded(request.method, request.path, dict(request.query), dict(request.headers), body, time.monotonic())
        )
        key = (request.method, request.path)
        script = self.scripts.get(key)
        step = script.popleft() if script else self.defaults.get(key) or self._builtin(request)
        if step.delay:
            await anyio.sleep(step.delay)
        if step.drop:
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)
        return _response(step)

    def _builtin(self, request: web.Request) -> Step:
        if request.path.endswith("/actions/runners/registration-token"):
            return Step(201, {"token": "regtoken-abcdef-123456", "expires_at": "2099-01-01T00:00:00Z"})
        if request.path == "/api/v3/actions/runner-registration":
            self.exchanges += 1
            return Step(201, {"url": self.actions_base, "token": fake_jwt(time.time() + self.admin_ttl)})
        return Step(404, {"typeName": "NotFound", "message": f"no script for {request.method} {request.path}"})


def _response(step: Step) -> web.Response:
    body = step.body
    headers = {"ActivityId": "activity-0001", **step.headers}
    if body is None:
        return web.Response(status=step.status, headers=headers)
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    raw = body.encode() if isinstance(body, str) else body
    headers.setdefault("Content-Type", "application/json; charset=utf-8")
    return web.Response(status=step.status, body=raw, headers=headers)


class RecordingProxy:
    """A minimal HTTP forward proxy: absolute-form requests to http:// targets and CONNECT
    tunnels to https:// targets. It records each connection's first request line and pipes bytes
    to the target unchanged."""

    def __init__(self) -> None:
        self.request_lines: list[str] = []
        self.authorizations: list[str] = []  # Proxy-Authorization of each connection's first request
        self.port = 0
        self._listener: anyio.abc.SocketListener | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
        task_status.started()
        async with listener:  # closed when the serving task is cancelled
            await listener.serve(self._connection)

    async def _connection(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            head = b""
            while b"\r\n\r\n" not in head:
                head += await client.receive()
            lines = head.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
            line = lines[0]
            self.request_lines.append(line)
            auth = [v.split(":", 1)[1].strip() for v in lines[1:] if v.lower().startswith("proxy-authorization:")]
            self.authorizations.append(auth[0] if auth else "")
            verb, target = line.split(" ")[:2]
            tunnel = verb == "CONNECT"  # https:// targets: a TLS tunnel, opaque to the proxy
            hostport = target if tunnel else target.split("://", 1)[1].split("/", 1)[0]
            host, port = hostport.rsplit(":", 1)
            async with await anyio.connect_tcp(host, int(port)) as upstream:
                if tunnel:
                    await client.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    rest = head.split(b"\r\n\r\n", 1)[1]
                    if rest:
                        await upstream.send(rest)
                else:
                    await upstream.send(head)

                async def pump(src: anyio.abc.SocketStream, dst: anyio.abc.SocketStream) -> None:
                    try:
                        async for data in src:
                            await dst.send(data)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        pass

                async with anyio.create_task_group() as tg:
                    tg.start_soon(pump, upstream, client)
                    await pump(client, upstream)
                    tg.cancel_scope.cancel()
