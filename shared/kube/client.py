"""The connection to the API server: kubernetes-asyncio's ApiClient used as an authenticated transport.

Requests go through ``ApiClient.call_api`` (so kubeconfig auth, exec plugins, token refresh, TLS and
proxies behave exactly as in kubernetes-asyncio) with ``_preload_content=False``: this module reads
the raw bytes, decodes them with msgspec and turns every failure into a :class:`KubeError`. The
generated per-kind methods are not used, which sidesteps two of their traps: the
JSON-patch default for dict bodies on custom resources, and ``None`` returned for unmapped 2xx codes.

Every call has a deadline: ``request_timeout`` (default 30 s) unless the call passes its own.

The proxy environment is resolved once, when the client is built, never per request (README
"Kubernetes access layer", "Client"), and a client-side request-rate limit with a burst
(:class:`RequestRateLimit`, like client-go's QPS/Burst) paces every request and watch opening.
"""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypedDict, Unpack

import aiohttp
import anyio
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio.config import ConfigException
from yarl import URL

from shared.kube.errors import ConnectionFailed, KubeError, Timeout, translate_status
from shared.kube.metrics import KubeClientMetrics
from shared.log import get_logger

log = get_logger(__name__)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

DEFAULT_REQUEST_TIMEOUT = 30.0
#: Client-side request rate (requests per second) and burst, per client (README "Client (`KubeClient`)").
DEFAULT_QPS = 200.0
DEFAULT_BURST = 400
Query = Sequence[tuple[str, str]]


# The directory holding the pod's service-account token and CA when it is not the fixed
# in-cluster path (set by node-sim for process pods).
SERVICE_ACCOUNT_DIR_ENV = "RUNNERSCALE_SERVICEACCOUNT_DIR"


#: Resources the request metrics name; any other is counted as ``other`` so the label set stays
#: bounded whatever path a caller sends (README "Metrics").
METRIC_RESOURCES = frozenset(
    {
        "autoscalinglisteners",
        "autoscalingrunnersets",
        "configmaps",
        "customresourcedefinitions",
        "ephemeralrunners",
        "ephemeralrunnersets",
        "events",
        "leases",
        "namespaces",
        "nodes",
        "pods",
        "rolebindings",
        "roles",
        "secrets",
        "serviceaccounts",
    }
)
_VERB_BY_METHOD = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def request_labels(method: str, path: str, query: Query = ()) -> tuple[str, str]:
    """``(verb, resource)`` of a request as the API server names them, from a fixed set.

    ``resource`` is the plural (``pods``), ``<plural>/status`` for the status subresource, ``other``
    for anything else (a non-resource path, an unknown plural). ``verb`` is one of get, list,
    watch, create, update, patch, delete, deletecollection (or the method for other methods).
    """
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        rest = []
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    plural = rest[0] if rest else ""
    named = len(rest) >= 2 or not rest  # a non-resource path (/version) is a get, as the server counts it
    resource = plural if plural in METRIC_RESOURCES else "other"
    if len(rest) >= 3 and rest[2] == "status" and resource != "other":
        resource += "/status"
    watching = any(k == "watch" and v in ("1", "true") for k, v in query)
    if method == "GET":
        verb = "get" if named else "watch" if watching else "list"
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = _VERB_BY_METHOD.get(method, method.lower())
    return verb, resource


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("runnerscale")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0"


def user_agent_for(component: str = "") -> str:
    """client-go's form, ``<program>/<version> (<os>/<arch>) <client>``: ``runnerscale-runner/0.1.0
    (linux/amd64) kubernetes-asyncio/33.3.0``. The API server's audit log and the emulator's request
    counts (``/_emulator/requests``) tell the processes apart by it."""
    from kubernetes_asyncio import __version__ as client_version

    program = f"runnerscale-{component}" if component else "runnerscale"
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)
    return f"{program}/{_package_version()} ({sys.platform}/{arch}) kubernetes-asyncio/{client_version}"


class RequestRateLimit:
    """A token bucket like client-go's QPS/Burst: ``burst`` requests at once, then ``qps`` per second.

    :meth:`reserve` takes a token now and returns how long the caller must wait for it (tokens may
    go negative, so waiters are served in the order they reserved, like golang's ``rate.Reserve``).
    ``qps <= 0`` disables the limit.
    """

    def __init__(self, qps: float, burst: int, *, clock: Any = time.monotonic) -> None:
        if qps > 0 and burst < 1:
            raise ValueError(f"burst must be >= 1 when qps > 0, got {burst}")
        self.qps = float(qps)
        self.burst = int(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._stamp: float = clock()
        self.throttled = 0  # requests that had to wait (for metrics and tests)

    @property
    def enabled(self) -> bool:
        return self.qps > 0

    def reserve(self) -> float:
        """Take one token; return the seconds until it is due (0: go now)."""
        if not self.enabled:
            return 0.0
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.qps)
        self._stamp = now
        self._tokens -= 1.0
        if self._tokens >= 0:
            return 0.0
        self.throttled += 1
        return -self._tokens / self.qps

    async def wait(self) -> float:
        """Wait for a token; return the seconds waited (0: went at once)."""
        delay = self.reserve()
        if delay > 0:
            await anyio.sleep(delay)
        return delay


def resolve_environment_once(api_client: Any) -> None:
    """Pin the proxy settings from the environment now and stop aiohttp from re-reading them.

    kubernetes-asyncio builds its aiohttp session with ``trust_env=True``, which makes aiohttp read
    ``*_PROXY``/``NO_PROXY`` and ``~/.netrc`` in a thread on *every* request. The proxy for the API
    server is resolved here, once (an explicit ``configuration.proxy`` wins); netrc is not consulted
    (Kubernetes credentials come from the kubeconfig or the service account, and aiohttp refuses
    netrc credentials next to the bearer token anyway).
    """
    rest = api_client.rest_client
    session = rest.pool_manager
    if not getattr(session, "_trust_env", False):
        return
    if rest.proxy is None and api_client.configuration.host:
        try:
            proxy, auth = get_env_proxy_for_url(URL(api_client.configuration.host))
        except LookupError:  # no proxy configured for this host, or NO_PROXY covers it
            pass
        else:
            rest.proxy = str(proxy)
            if auth is not None:
                rest.proxy_headers = {**(rest.proxy_headers or {}), "Proxy-Authorization": auth.encode()}
    session._trust_env = False  # aiohttp has no public setter; read per request in ClientSession._request


class ClientOptions(TypedDict, total=False):
    """What every constructor passes on to :class:`KubeClient` (its defaults apply when left out)."""

    request_timeout: float
    qps: float
    burst: int
    user_agent: str | None  # None: ``user_agent_for()``
    metrics: KubeClientMetrics | None  # None: not counted


class KubeClient:
    """An authenticated connection to one API server. Use ``async with`` or call :meth:`close`."""

    def __init__(
        self,
        api_client: Any,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        user_agent: str | None = None,
        metrics: KubeClientMetrics | None = None,
    ) -> None:
        if request_timeout <= 0:
            raise ValueError(f"request_timeout must be > 0, got {request_timeout}")
        if not math.isfinite(qps):
            raise ValueError(f"qps must be finite, got {qps}")
        resolve_environment_once(api_client)
        # Set once on the ApiClient's default headers: every call_api sends it, no per-request cost.
        api_client.user_agent = user_agent or user_agent_for()
        self._api = api_client
        self.request_timeout = float(request_timeout)
        self.rate_limit = RequestRateLimit(qps, burst)
        self.metrics = metrics
        self._closed = False
        self._parent: KubeClient | None = None

    def unthrottled(self) -> KubeClient:
        """A view of this client (same connection pool) that the request-rate limit does not pace.

        For liveness traffic (shard leases): a renewal must not queue behind a burst of bulk
        requests, or it would miss its deadline and the replica would lose its shards exactly when
        it is busiest. Closing the view does nothing; closing this client closes both.
        """
        view = object.__new__(KubeClient)
        view._api = self._api
        view.request_timeout = self.request_timeout
        view.rate_limit = RequestRateLimit(0, 0)
        view.metrics = self.metrics
        view._closed = False
        view._parent = self
        return view

    @property
    def closed(self) -> bool:
        return self._closed or (self._parent is not None and self._parent.closed)

    # --- construction ----------------------------------------------------------------------------

    @classmethod
    async def from_kubeconfig(
        cls,
        path: str | Path | None = None,
        *,
        context: str | None = None,
        **options: Unpack[ClientOptions],
    ) -> KubeClient:
        """Connect with a kubeconfig file (``None``: ``$KUBECONFIG`` or ``~/.kube/config``)."""
        from kubernetes_asyncio import client, config

        cfg = client.Configuration()
        try:
            await config.load_kube_config(
                config_file=str(path) if path else None, context=context, client_configuration=cfg
            )
        except (config.ConfigException, OSError, ValueError, TypeError) as exc:
            raise ConnectionFailed(f"load kubeconfig {path or '(default)'}", str(exc)) from None
        return cls(client.ApiClient(configuration=cfg), **options)

    @classmethod
    def in_cluster(
        cls,
        **options: Unpack[ClientOptions],
    ) -> KubeClient:
        """Connect with the pod's service account (token re-read when it rotates).

        The token and CA are read from ``$RUNNERSCALE_SERVICEACCOUNT_DIR`` when set (node-sim runs
        pods as local processes and says there where the pod's service-account mount is), else
        from the fixed in-cluster path."""
        from kubernetes_asyncio import client, config

        cfg = client.Configuration()
        files = {}
        if sa_dir := os.environ.get(SERVICE_ACCOUNT_DIR_ENV):
            files = {"token_filename": f"{sa_dir}/token", "cert_filename": f"{sa_dir}/ca.crt"}
        try:
            config.load_incluster_config(client_configuration=cfg, **files)  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as exc:
            raise ConnectionFailed("load in-cluster config", str(exc)) from None
        return cls(client.ApiClient(configuration=cfg), **options)

    @classmethod
    def from_url(
        cls,
        url: str,
        **options: Unpack[ClientOptions],
    ) -> KubeClient:
        """An unauthenticated client for a plain-HTTP server (the embedded emulator, test proxies)."""
        from kubernetes_asyncio import client

        cfg = client.Configuration()
        cfg.host = url.rstrip("/")
        return cls(client.ApiClient(configuration=cfg), **options)

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | Path | None = None,
        *,
        context: str | None = None,
        **options: Unpack[ClientOptions],
    ) -> KubeClient:
        """A kubeconfig path if given; else in-cluster when running in a pod; else the default kubeconfig."""
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster(**options)
        return await cls.from_kubeconfig(kubeconfig, context=context, **options)

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._parent is None:
                await self._api.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- requests --------------------------------------------------------------------------------

    async def _send(
        self, what: str, method: str, path: str, query: Query, body: Any, content_type: str, client_timeout: Any
    ) -> aiohttp.ClientResponse:
        if self.closed:
            raise ConnectionFailed(what, "client is closed")
        waited = await self.rate_limit.wait()  # inside the caller's deadline, like client-go's limiter and its context
        if self.metrics is not None and self.rate_limit.enabled:
            self.metrics.observe_wait(waited)
        try:
            response: aiohttp.ClientResponse = await self._api.call_api(
                path,
                method,
                query_params=list(query),
                header_params={"Accept": JSON, "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=client_timeout,
            )
        except ConfigException as exc:  # credentials could not be refreshed (exec plugin, token file)
            raise ConnectionFailed(what, f"authentication failed: {exc}") from None
        return response

    async def request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        query: Query = (),
        body: Any = None,
        content_type: str = JSON,
        timeout: float | None = None,
    ) -> bytes:
        """Send one request and return the 2xx body; anything else raises a :class:`KubeError`.

        ``what`` names the request in errors (``PATCH pods ns/name``). ``body`` is a JSON tree.
        """
        deadline = timeout or self.request_timeout
        status = 0  # no answer (timeout, connection failure, cancelled)
        try:
            with anyio.fail_after(deadline):
                resp = await self._send(what, method, path, query, body, content_type, deadline)
                try:
                    data = await resp.read()
                    status, headers = resp.status, resp.headers
                finally:
                    resp.release()
        except TimeoutError:
            raise Timeout(what, f"no response within {deadline:g}s") from None
        except aiohttp.ClientError as exc:
            raise ConnectionFailed(what, f"{type(exc).__name__}: {exc}") from None
        finally:
            if self.metrics is not None:
                self.metrics.count(*request_labels(method, path, query), status)
        if not 200 <= status < 300:
            raise translate_status(what, status, data, headers)
        return data

    @asynccontextmanager
    async def stream(
        self, path: str, *, what: str, query: Query, read_timeout: float
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """Open a streaming GET (a watch) and yield an iterator of its lines.

        Opening (headers) has the request deadline; each line must arrive within ``read_timeout``.
        A stream that breaks mid-way raises :class:`ConnectionFailed` / :class:`Timeout` from the
        iterator; a clean end of stream just ends the iteration.
        """
        client_timeout = aiohttp.ClientTimeout(
            total=None, connect=self.request_timeout, sock_connect=self.request_timeout, sock_read=read_timeout
        )
        status = 0
        try:
            with anyio.fail_after(self.request_timeout):
                resp = await self._send(what, "GET", path, query, None, JSON, client_timeout)
                status = resp.status
                if resp.status != 200:
                    try:
                        data = await resp.read()
                    finally:
                        resp.release()
                    raise translate_status(what, resp.status, data, resp.headers)
        except TimeoutError:
            raise Timeout(what, f"no response headers within {self.request_timeout:g}s") from None
        except aiohttp.ClientError as exc:
            raise ConnectionFailed(what, f"{type(exc).__name__}: {exc}") from None
        finally:
            if self.metrics is not None:  # counted when opened, like the API server counts a watch
                self.metrics.count(*request_labels("GET", path, query), status)
        try:
            yield _lines(resp, what, read_timeout)
        finally:
            resp.close()  # never hand a half-read stream back to the pool


async def _lines(resp: aiohttp.ClientResponse, what: str, read_timeout: float) -> AsyncIterator[bytes]:
    while True:
        try:
            line = await resp.content.readline()
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise Timeout(what, f"no data for {read_timeout:g}s") from None
        except (aiohttp.ClientError, ValueError) as exc:  # ValueError: line above the read buffer
            raise ConnectionFailed(what, f"stream broke: {type(exc).__name__}: {exc}") from None
        if not line:
            return
        if line.strip():
            yield line


__all__ = [
    "DEFAULT_BURST",
    "DEFAULT_QPS",
    "DEFAULT_REQUEST_TIMEOUT",
    "JSON",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "ClientOptions",
    "KubeClient",
    "KubeError",
    "RequestRateLimit",
    "request_labels",
    "user_agent_for",
]
