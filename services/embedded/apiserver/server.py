"""The emulator process: aiohttp app, fault middleware, request metrics, control endpoint, lifecycle."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import yaml
from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from services.embedded.tls import TlsMaterial, make_tls_material, server_context
from shared.log import get_logger

from . import admission, discovery, errors
from .api import Api
from .errors import ApiError
from .faults import FaultError, FaultRule, Faults, default_reason
from .gc import Controllers
from .handlers import (
    RequestInfo,
    error_response,
    handle_discovery,
    handle_openapi,
    handle_resource,
    json_response,
    parse_request_info,
)
from .resources import Registry
from .store import Store, Watcher
from .tokens import TokenIssuer

log = get_logger(__name__)
T = TypeVar("T")
INFO_KEY = web.RequestKey("runnerscale_request_info", RequestInfo)
DROP_AFTER_KEY = web.RequestKey("runnerscale_drop_after", object)


class Settings(msgspec.Struct, kw_only=True):
    """Runtime knobs, settable from Python or ``PUT /_emulator/settings``."""

    watch_lag_seconds: float = 0.0  # delay every watch event by this much (informer cache lag)
    bookmark_interval_seconds: float = 60.0  # 0 = only the bookmark before a watch's deadline
    gc_delay_seconds: float = 0.05  # how long the controllers wait before a sweep
    gc_paused: bool = False
    # Watch history per resource, like the watch cache: a watch can resume from an event younger
    # than this or among the resource's newest watch_history_min_events; older → 410 Expired.
    watch_history_seconds: float = 75.0
    watch_history_min_events: int = 100


class SettingsPatch(msgspec.Struct, kw_only=True, omit_defaults=True):
    watch_lag_seconds: float | None = None
    bookmark_interval_seconds: float | None = None
    gc_delay_seconds: float | None = None
    gc_paused: bool | None = None
    watch_history_seconds: float | None = None
    watch_history_min_events: int | None = None


class CutRequest(msgspec.Struct, kw_only=True):
    abrupt: bool = False


class CompactRequest(msgspec.Struct, kw_only=True):
    resource_version: int | None = None


class Emulator:
    """A Kubernetes API server emulator. Run it with :meth:`start` in a loop, or use
    :class:`BackgroundEmulator` to run it in a thread of its own."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, history: int = 20000, tls: TlsMaterial | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls  # set: serve HTTPS with this CA-signed certificate (in-cluster clients need it)
        self.store = Store(history=history)
        self.registry = Registry()
        self.api = Api(self.store, self.registry)
        if tls is not None:
            self.api.cluster_ca_pem = tls.ca_pem
        self.faults = Faults()
        self.tokens = TokenIssuer()
        self.settings = Settings()
        self.controllers = Controllers(self.api, self.settings.gc_delay_seconds)
        self.open_watches: set[Watcher] = set()
        self.request_counts: Counter[tuple[str, str, str, str]] = Counter()
        # The same requests by answer status: conflicts (409) and not-founds per request kind.
        self.status_counts: Counter[tuple[tuple[str, str, str, str], int]] = Counter()
        # The same requests by User-Agent (issue 10: which process sends how many, runnerscale's
        # clients name their component there as client-go's do).
        self.agent_counts: Counter[tuple[tuple[str, str, str, str], str]] = Counter()
        # What the watch streams sent, by resource: [watches opened, events, writes, bytes] (issue 10:
        # the bench counts watch traffic per runner, to see what grows with the burst's size).
        self.watch_counts: dict[str, list[int]] = {}
        self._request_children: dict[tuple[tuple[str, str, str, str], int], Any] = {}
        self.metrics_registry = CollectorRegistry()
        self._requests = PromCounter(
            "apiserver_request",
            "API requests served by the emulator, by verb, group, resource, subresource and code.",
            ["verb", "group", "resource", "subresource", "code"],
            registry=self.metrics_registry,
        )
        self._objects = Gauge("apiserver_storage_objects", "Objects stored, all kinds.", registry=self.metrics_registry)
        self._objects.set_function(self.store.count)
        self._rv = Gauge(
            "apiserver_resource_version", "Current global resourceVersion.", registry=self.metrics_registry
        )
        self._rv.set_function(lambda: self.store.rv)
        self._runner: web.ServerRunner | None = None
        self._gc_task: asyncio.Task[None] | None = None
        self._bootstrap()

    def _bootstrap(self) -> None:
        ns_rt = self.registry.lookup("", "v1", "namespaces")
        assert ns_rt is not None
        for name in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.api.create(ns_rt, "", {"metadata": {"name": name}})
            self.api.ensure_namespace_defaults(name)
        pc_rt = self.registry.lookup("scheduling.k8s.io", "v1", "priorityclasses")
        assert pc_rt is not None
        for pc in admission.system_priority_classes():
            self.api.create(pc_rt, "", pc)
        # Each served resource's watch history starts now, as the watch caches do at start-up.
        for rt in self.registry.all():
            self.store.open_window(rt.key)

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def build_server(self) -> web.Server:
        """aiohttp's low-level server: every path goes to one handler (issue 10: an Application's
        router, which matched a catch-all route, and its middleware chain cost CPU per request)."""
        loop = asyncio.get_running_loop()

        def make_request(
            message: RawRequestMessage,
            payload: StreamReader,
            protocol: RequestHandler,
            writer: AbstractStreamWriter,
            task: asyncio.Task[None],
        ) -> web.BaseRequest:
            return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=64 * 1024 * 1024)

        return web.Server(self._serve, request_factory=make_request, access_log=None, handler_cancellation=True)

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.headers.get(hdrs.EXPECT):
            await _expect_continue(request)
        return await self._middleware(request, self._dispatch)

    async def start(self) -> str:
        self._runner = web.ServerRunner(self.build_server(), handle_signals=False, shutdown_timeout=2.0)
        await self._runner.setup()
        ssl_context = server_context(self.tls) if self.tls is not None else None
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=ssl_context)
        await site.start()
        addresses = self._runner.addresses  # (host, port, …) of each listening socket
        if addresses:
            self.port = int(addresses[0][1])
        self._gc_task = asyncio.get_running_loop().create_task(self.controllers.run())
        log.info("apiserver emulator listening", url=self.url)
        return self.url

    async def stop(self) -> None:
        self.cut_watches(reason="shutdown")
        if self._gc_task:
            self._gc_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gc_task
        if self._runner:
            await self._runner.cleanup()
            self._runner = None

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        ca = self.tls.ca_pem if self.tls is not None else None
        # Written whole, then renamed: another process waiting for the file never reads half of it.
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text(yaml.safe_dump(kubeconfig_doc(self.url, namespace, ca), sort_keys=False))
        partial.replace(path)
        return path

    # --- test hooks (call on the emulator's loop) --------------------------------------------

    def compact(self, resource_version: int | None = None) -> int:
        """Drop watch/continue history up to ``resource_version`` (default: all of it)."""
        return self.store.compact(resource_version)

    def cut_watches(self, abrupt: bool = False, reason: str = "") -> int:
        """End every open watch stream; returns how many were cut.

        ``abrupt=False`` ends each stream cleanly (the client sees EOF, as after a server-side
        timeout); ``abrupt=True`` drops the TCP connection mid-stream (the client sees a payload
        error, as when a proxy or the apiserver dies)."""
        reason = reason or ("cut" if abrupt else "end")
        watches = list(self.open_watches)
        for w in watches:
            w.close(reason)
        return len(watches)

    def update_settings(self, patch: SettingsPatch) -> Settings:
        for f in patch.__struct_fields__:
            v = getattr(patch, f)
            if v is not None:
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
                    raise ApiError(400, "BadRequest", f"setting {f} must be >= 0")
                setattr(self.settings, f, v)
        self.controllers.delay = self.settings.gc_delay_seconds
        self.controllers.paused = self.settings.gc_paused
        self.store.watch_history_seconds = self.settings.watch_history_seconds
        self.store.watch_history_min_events = self.settings.watch_history_min_events
        if not self.settings.gc_paused:
            self.controllers.wake()
        return self.settings

    def load_crds(self, path: str | Path) -> list[str]:
        """Install every CustomResourceDefinition found in a YAML file or directory of files."""
        p = Path(path)
        files = sorted(p.glob("*.yaml")) + sorted(p.glob("*.yml")) if p.is_dir() else [p]
        installed = []
        for f in files:
            installed += self.load_crd_yaml(f.read_text())
        return installed

    def load_crd_yaml(self, text: str) -> list[str]:
        """Install the CRDs of a (multi-document) YAML text; existing names are left as they are."""
        crd_rt = self.registry.lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        assert crd_rt is not None
        installed = []
        for doc in yaml.safe_load_all(text):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                name = (doc.get("metadata") or {}).get("name", "")
                if self.store.get(crd_rt.key, "", name) is None:
                    self.api.create(crd_rt, "", doc)
                    self.api.establish_crd(name)  # installed at start: served before the first request
                installed.append(name)
        return installed

    # --- HTTP ----------------------------------------------------------------------------------

    async def _middleware(
        self, request: web.BaseRequest, handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        path = request.path
        if path.startswith("/_emulator/") or path in ("/metrics", "/healthz", "/livez", "/readyz"):
            return await handler(request)
        try:
            info = parse_request_info(request.method, path, request.query, self)
        except ApiError as err:
            return error_response(err)
        status = 500
        try:
            request[DROP_AFTER_KEY] = None
            if info.is_resource:
                if (
                    rule := self.faults.take(
                        info.verb, info.plural, info.subresource, info.namespace, info.name, ("latency",)
                    )
                ) is not None:
                    await asyncio.sleep(rule.delay_seconds)  # injected latency
                if (
                    rule := self.faults.take(
                        info.verb, info.plural, info.subresource, info.namespace, info.name, ("error",)
                    )
                ) is not None:
                    raise _fault_error(rule, info.plural, info.name)
                if info.verb == "watch":
                    rule = self.faults.take(
                        info.verb, info.plural, info.subresource, info.namespace, info.name, ("drop_watch",)
                    )
                    if rule is not None:
                        request[DROP_AFTER_KEY] = rule.after_events
            request[INFO_KEY] = info
            resp = await handler(request)
            status = resp.status
            return resp
        except ApiError as err:
            status = err.code
            return error_response(err)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # an emulator bug: answer like the server's panic handler, log it
            log.error("request failed", method=request.method, path=path, error=repr(exc))
            status = 500
            return error_response(
                ApiError(500, "InternalError", f"Internal error occurred: {type(exc).__name__}: {exc}")
            )
        finally:
            if info.is_resource:
                key = (info.verb, info.group, info.plural, info.subresource)
                self.request_counts[key] += 1
                self.status_counts[key, status] += 1
                self.agent_counts[key, request.headers.get("User-Agent", "")] += 1
                child = self._request_children.get((key, status))
                if child is None:  # labels() per request costs a lock and a tuple of strings
                    child = self._request_children[(key, status)] = self._requests.labels(*key, str(status))
                child.inc()

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if path == "/metrics":
            return web.Response(
                body=generate_latest(self.metrics_registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
            )
        if path.startswith("/_emulator"):
            return await self._control(request, path)
        if path == "/version":
            return json_response(discovery.version_info())
        if path.startswith("/openapi/"):
            return handle_openapi(path, self)
        info = request.get(INFO_KEY)
        if info is not None and info.is_resource:
            return await handle_resource(request, info, self, request.get(DROP_AFTER_KEY))
        if path in ("/api", "/apis") or path.startswith(("/api/", "/apis/")):
            if request.method != "GET":
                raise errors.resource_not_found()
            return handle_discovery(path, self, f"{self.host}:{self.port}")
        raise errors.page_not_found()

    async def _control(self, request: web.BaseRequest, path: str) -> web.Response:
        """The ``/_emulator/`` control endpoint (fault rules, compaction, watch cuts, settings)."""
        m = request.method
        try:
            body = await request.read()
            if path == "/_emulator/state" and m == "GET":
                return json_response(self.state())
            if path == "/_emulator/faults":
                if m == "GET":
                    return json_response(msgspec.to_builtins(self.faults.list()))
                if m == "POST":
                    rule = msgspec.json.decode(body, type=FaultRule)
                    return json_response(msgspec.to_builtins(self.faults.add(rule)), 201)
                if m == "DELETE":
                    self.faults.clear()
                    return json_response({"cleared": True})
            if path.startswith("/_emulator/faults/") and m == "DELETE":
                rule_id = int(path.rsplit("/", 1)[1])
                if not self.faults.remove(rule_id):
                    return json_response({"error": f"no fault rule with id {rule_id}"}, 404)
                return json_response({"removed": rule_id})
            if path == "/_emulator/compact" and m == "POST":
                req = msgspec.json.decode(body or b"{}", type=CompactRequest)
                return json_response({"compacted_revision": self.compact(req.resource_version)})
            if path == "/_emulator/cut-watches" and m == "POST":
                req_cut = msgspec.json.decode(body or b"{}", type=CutRequest)
                return json_response({"cut": self.cut_watches(abrupt=req_cut.abrupt)})
            if path == "/_emulator/settings":
                if m == "GET":
                    return json_response(msgspec.to_builtins(self.settings))
                if m in ("PUT", "PATCH"):
                    patch = msgspec.json.decode(body or b"{}", type=SettingsPatch)
                    return json_response(msgspec.to_builtins(self.update_settings(patch)))
            if path == "/_emulator/gc" and m == "POST":
                changed = self.controllers.run_once()
                return json_response({"changed": changed})
            if path == "/_emulator/watch-counts" and m == "GET":
                fields = ("watches", "events", "writes", "bytes")
                return json_response(
                    [{"resource": r} | dict(zip(fields, c, strict=True)) for r, c in sorted(self.watch_counts.items())]
                )
            if path == "/_emulator/watch-counts" and m == "DELETE":
                self.watch_counts.clear()
                return json_response({"cleared": True})
            if path == "/_emulator/requests" and m == "GET":
                statuses: dict[tuple[str, str, str, str], dict[str, int]] = {}
                for (key, code), c in self.status_counts.items():
                    statuses.setdefault(key, {})[str(code)] = c
                agents: dict[tuple[str, str, str, str], dict[str, int]] = {}
                for (key, agent), c in self.agent_counts.items():
                    agents.setdefault(key, {})[agent] = c
                rows = [
                    {"verb": k[0], "group": k[1], "resource": k[2], "subresource": k[3], "count": c}
                    | {"statuses": statuses.get(k, {}), "agents": agents.get(k, {})}
                    for k, c in sorted(self.request_counts.items())
                ]
                return json_response(rows)
            if path == "/_emulator/requests" and m == "DELETE":
                self.request_counts.clear()
                self.status_counts.clear()
                self.agent_counts.clear()
                return json_response({"cleared": True})
            if path == "/_emulator/crds" and m == "POST":
                return json_response({"installed": self.load_crd_yaml(body.decode())})
        except (msgspec.ValidationError, msgspec.DecodeError, FaultError, ValueError, yaml.YAMLError) as exc:
            return json_response({"error": f"{path}: {exc}"}, 400)
        except ApiError as err:
            return error_response(err)
        return json_response({"error": f"unknown control request {m} {path}"}, 404)

    def state(self) -> dict[str, Any]:
        return {
            "resource_version": self.store.rv,
            "compacted_revision": self.store.compacted_rv,
            "objects": self.store.count(),
            "open_watches": len(self.open_watches),
            "settings": msgspec.to_builtins(self.settings),
        }


def _fault_error(rule: FaultRule, plural: str, name: str) -> ApiError:
    reason = rule.reason or default_reason(rule.code)
    message = rule.message or {
        409: f'Operation cannot be fulfilled on {plural} "{name}": {errors.STALE}',
        429: "Too many requests, please try again later.",
    }.get(rule.code, f"injected fault: {rule.code} {reason}")
    err = ApiError(rule.code, reason, message, retry_after_seconds=rule.retry_after_seconds)
    if rule.code == 409:
        err.name, err.kind = name, plural
    return err


# The names in-cluster clients may use for the API server, besides the loopback address.
IN_CLUSTER_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


def emulator_tls_material(host: str = "127.0.0.1") -> TlsMaterial:
    """A fresh CA and a serving certificate for the emulator's loopback address and in-cluster names."""
    return make_tls_material([host, "localhost", *IN_CLUSTER_NAMES], "runnerscale API emulator CA")


def kubeconfig_doc(url: str, namespace: str = "default", ca_pem: str | None = None) -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": url}
    if ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem.encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "runnerscale-emulator", "cluster": cluster}],
        "users": [{"name": "runnerscale-emulator", "user": {"token": "emulator-not-a-secret"}}],
        "contexts": [
            {
                "name": "runnerscale-emulator",
                "context": {"cluster": "runnerscale-emulator", "user": "runnerscale-emulator", "namespace": namespace},
            }
        ],
        "current-context": "runnerscale-emulator",
        "preferences": {},
    }


class BackgroundEmulator:
    """An Emulator running on its own event loop in a daemon thread (survives test loops)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, tls: TlsMaterial | None = None) -> None:
        self._host, self._port, self._tls = host, port, tls
        self.loop: asyncio.AbstractEventLoop | None = None
        self.emulator: Emulator | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self, timeout: float = 15.0) -> Emulator:
        self._thread = threading.Thread(target=self._main, name="apiserver-emulator", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("apiserver emulator did not start in time")
        if self._error is not None:
            raise RuntimeError(f"apiserver emulator failed to start: {self._error!r}")
        assert self.emulator is not None
        return self.emulator

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self.loop = loop
        asyncio.set_event_loop(loop)
        try:
            self.emulator = Emulator(self._host, self._port, tls=self._tls)
            loop.run_until_complete(self.emulator.start())
        except BaseException as exc:  # reported to the starting thread
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self.emulator.stop())
            loop.close()

    def call(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """Run ``fn`` on the emulator's loop and return its result (store access is not thread-safe)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(_as_coro(fn), self.loop).result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        if self.loop is not None and self._thread is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)


async def _as_coro(fn: Callable[[], T]) -> T:
    return fn()


async def _expect_continue(request: web.BaseRequest) -> None:
    """aiohttp's default ``Expect`` handling (its router did this before the handler ran):
    ``100-continue`` is answered at once, any other expectation is a 417."""
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version == HttpVersion11:
        if expect.lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the main body has not started
        else:
            raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")
