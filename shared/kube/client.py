"""The connection to the API server: kubernetes-asyncio's ApiClient used as an authenticated transport.

Requests go through ``ApiClient.call_api`` (so kubeconfig auth, exec plugins, token refresh, TLS and
proxies behave exactly as in kubernetes-asyncio) with ``_preload_content=False``: this module reads
the raw bytes, decodes them with msgspec and turns every failure into a :class:`KubeError`. The
generated per-kind methods are not used, which sidesteps two of their traps: the
JSON-patch default for dict bodies on custom resources, and ``None`` returned for unmapped 2xx codes.

Every call has a deadline: ``request_timeout`` (default 30 s) unless the call passes its own.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
from kubernetes_asyncio.config import ConfigException

from shared.kube.errors import ConnectionFailed, KubeError, Timeout, translate_status
from shared.log import get_logger

log = get_logger(__name__)

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

DEFAULT_REQUEST_TIMEOUT = 30.0
Query = Sequence[tuple[str, str]]


# The directory holding the pod's service-account token and CA when it is not the fixed
# in-cluster path (set by node-sim for process pods).
SERVICE_ACCOUNT_DIR_ENV = "RUNNERSCALE_SERVICEACCOUNT_DIR"


class KubeClient:
    """An authenticated connection to one API server. Use ``async with`` or call :meth:`close`."""

    def __init__(self, api_client: Any, *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> None:
        if request_timeout <= 0:
            raise ValueError(f"request_timeout must be > 0, got {request_timeout}")
        self._api = api_client
        self.request_timeout = float(request_timeout)
        self._closed = False

    # --- construction ----------------------------------------------------------------------------

    @classmethod
    async def from_kubeconfig(
        cls,
        path: str | Path | None = None,
        *,
        context: str | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
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
        return cls(client.ApiClient(configuration=cfg), request_timeout=request_timeout)

    @classmethod
    def in_cluster(cls, *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> KubeClient:
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
        return cls(client.ApiClient(configuration=cfg), request_timeout=request_timeout)

    @classmethod
    def from_url(cls, url: str, *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> KubeClient:
        """An unauthenticated client for a plain-HTTP server (the embedded emulator, test proxies)."""
        from kubernetes_asyncio import client

        cfg = client.Configuration()
        cfg.host = url.rstrip("/")
        return cls(client.ApiClient(configuration=cfg), request_timeout=request_timeout)

    @classmethod
    async def connect(
        cls,
        kubeconfig: str | Path | None = None,
        *,
        context: str | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
    ) -> KubeClient:
        """A kubeconfig path if given; else in-cluster when running in a pod; else the default kubeconfig."""
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster(request_timeout=request_timeout)
        return await cls.from_kubeconfig(kubeconfig, context=context, request_timeout=request_timeout)

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._api.close()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- requests --------------------------------------------------------------------------------

    async def _send(
        self, what: str, method: str, path: str, query: Query, body: Any, content_type: str, client_timeout: Any
    ) -> aiohttp.ClientResponse:
        if self._closed:
            raise ConnectionFailed(what, "client is closed")
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
        try:
            with anyio.fail_after(self.request_timeout):
                resp = await self._send(what, "GET", path, query, None, JSON, client_timeout)
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
    "DEFAULT_REQUEST_TIMEOUT",
    "JSON",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "KubeClient",
    "KubeError",
]
