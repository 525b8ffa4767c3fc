"""The node simulator's small HTTP control endpoint (``--control-port``): fault knobs and a view
of what the node runs. JSON in and out.

| call | effect |
|---|---|
| `GET /healthz` | `{"ok": true, "synced": bool, "node": name}` |
| `GET /pods` | the node's view of each pod (runtime state, pids) |
| `GET /pods/{ns}/{name}/logs[?container=c]` | the log tail (last 200 lines) of a container |
| `GET /faults` | `{"image_pull": [patterns]}` |
| `POST /faults/image-pull {"pattern": "busybox*"}` | pulls of matching images fail (ErrImagePull / ImagePullBackOff) |
| `DELETE /faults/image-pull` | clear those patterns (backed-off pulls then succeed) |
| `POST /pods/{ns}/{name}/crash {"container": "", "exit_code": 137}` | kill a running container; 404 when none runs |
| `POST /node/lose` | lose the node: its pods end Failed (NodeLost) |
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from aiohttp import web

from shared.log import get_logger

if TYPE_CHECKING:
    from .node import NodeSim

log = get_logger(__name__)


class ImagePullFault(msgspec.Struct, forbid_unknown_fields=True):
    pattern: str


class CrashRequest(msgspec.Struct, forbid_unknown_fields=True):
    container: str = ""
    exit_code: int = 137


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(doc), content_type="application/json")


async def _body(request: web.Request, typ: type[Any]) -> Any:
    raw = await request.read()
    try:
        return msgspec.json.decode(raw or b"{}", type=typ)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"{request.method} {request.path}: {exc}"}), content_type="application/json"
        ) from None


def make_app(node: NodeSim) -> web.Application:
    routes = web.RouteTableDef()

    @routes.get("/healthz")
    async def healthz(request: web.Request) -> web.Response:
        return _json({"ok": True, "synced": node.synced.is_set(), "node": node.node_name})

    @routes.get("/pods")
    async def pods(request: web.Request) -> web.Response:
        return _json(node.snapshot())

    @routes.get("/pods/{ns}/{name}/logs")
    async def logs(request: web.Request) -> web.Response:
        return _json(
            node.logs(request.match_info["ns"], request.match_info["name"], request.query.get("container") or None)
        )

    @routes.get("/faults")
    async def faults(request: web.Request) -> web.Response:
        return _json({"image_pull": list(node.fail_image_pulls)})

    @routes.post("/faults/image-pull")
    async def add_pull_fault(request: web.Request) -> web.Response:
        body = await _body(request, ImagePullFault)
        node.add_image_pull_failure(body.pattern)
        return _json({"image_pull": list(node.fail_image_pulls)}, 201)

    @routes.delete("/faults/image-pull")
    async def clear_pull_faults(request: web.Request) -> web.Response:
        node.clear_image_pull_failures()
        return _json({"image_pull": []})

    @routes.post("/pods/{ns}/{name}/crash")
    async def crash(request: web.Request) -> web.Response:
        body = await _body(request, CrashRequest)
        ok = node.crash(request.match_info["ns"], request.match_info["name"], body.container or None, body.exit_code)
        if not ok:
            return _json({"error": "no running container of that name on this node"}, 404)
        return _json({"crashed": True})

    @routes.post("/node/lose")
    async def lose(request: web.Request) -> web.Response:
        return _json({"pods": node.lose_node()})

    app = web.Application()
    app.add_routes(routes)
    return app


async def serve_control(
    node: NodeSim, host: str, port: int, *, task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Serve until cancelled; reports the bound port through ``task_status``."""
    runner = web.AppRunner(make_app(node), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        log.info("node-sim control endpoint listening", host=host, port=bound)
        task_status.started(bound)
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
