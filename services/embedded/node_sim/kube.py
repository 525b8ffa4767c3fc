"""A thin JSON client of the Kubernetes API for the node simulator, and a pod informer.

The node sim works on plain dicts (pod status is written back verbatim through ``pods/status``),
so it talks raw JSON through kubernetes-asyncio's ``ApiClient.call_api`` (which brings kubeconfig
loading, TLS and auth) instead of the typed models. Every call carries a deadline.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import anyio
import msgspec

from shared.kube.client import resolve_environment_once, user_agent_for
from shared.log import get_logger

log = get_logger(__name__)

Obj = dict[str, Any]


class KubeError(Exception):
    """A non-2xx answer; ``status`` is the HTTP code, ``reason`` the Status reason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410): relist."""


# What a call can fail with that is worth retrying (the API answered an error, or did not answer).
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (KubeError, aiohttp.ClientError, OSError, TimeoutError)


class KubeRest:
    """Raw JSON access to the API server named by a kubeconfig."""

    def __init__(self, api_client: Any, timeout: float = 10.0) -> None:
        self._api = api_client
        self.timeout = timeout

    @classmethod
    async def from_kubeconfig(cls, path: str | Path, timeout: float = 10.0) -> KubeRest:
        from kubernetes_asyncio import client, config

        cfg = client.Configuration()
        await config.load_kube_config(config_file=str(path), client_configuration=cfg)
        api = client.ApiClient(configuration=cfg)
        # kubernetes-asyncio's session has trust_env=True: aiohttp would re-read netrc and the
        # proxy environment in a thread on every request (issue 10). Resolve them once, as the
        # workers' client does.
        resolve_environment_once(api)
        api.user_agent = user_agent_for("node-sim")  # the emulator and audit logs tell it apart by this
        return cls(api, timeout)

    @property
    def host(self) -> str:
        """The API server's URL (``https://…`` for a real cluster or ``runnerscale apiserver --tls``)."""
        return str(self._api.configuration.host)

    async def close(self) -> None:
        await self._api.close()

    async def _open(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None,
        body: Any,
        content_type: str,
        timeout: aiohttp.ClientTimeout,
    ) -> aiohttp.ClientResponse:
        # kubernetes-asyncio's call_api walks every body through sanitize_for_serialization and
        # json.dumps (issue 10: a fifth of node-sim's time in a burst, the bodies being plain JSON
        # already); the same request is sent here on its session, the body encoded by msgspec.
        # Authentication still comes from the configuration on every call (refreshable tokens).
        api = self._api
        rest = api.rest_client
        headers = {**api.default_headers, "Content-Type": content_type, "Accept": "application/json"}
        params = list(query or [])
        await api.update_params_for_auth(headers, params, ["BearerToken"])
        url = str(api.configuration.host) + path
        if params:
            url += "?" + urlencode(params)
        args: dict[str, Any] = {"method": method, "url": url, "timeout": timeout, "headers": headers}
        if body is not None:
            args["data"] = body if isinstance(body, bytes) else msgspec.json.encode(body)
        if rest.proxy:
            args["proxy"] = rest.proxy
        if rest.proxy_headers:
            args["proxy_headers"] = rest.proxy_headers
        if getattr(rest, "server_hostname", None):
            args["server_hostname"] = rest.server_hostname
        resp: aiohttp.ClientResponse = await rest.pool_manager.request(**args)
        return resp

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Obj:
        """One call; raises :class:`KubeError` on a non-2xx answer."""
        t = timeout or self.timeout
        # aiohttp's total deadline covers the connection, the request and the body's read (issue
        # 10: an anyio deadline around it as well cost as much CPU as a third of the request).
        resp = await self._open(method, path, query, body, content_type, aiohttp.ClientTimeout(total=t))
        async with resp:
            raw = await resp.read()
        try:
            doc = msgspec.json.decode(raw) if raw else {}
        except msgspec.DecodeError:
            doc = {"message": raw[:200].decode(errors="replace")}
        if not isinstance(doc, dict):
            doc = {"message": raw[:200].decode(errors="replace")}
        if not 200 <= resp.status < 300:
            raise KubeError(resp.status, str(doc.get("reason", "")), str(doc.get("message", "")))
        return doc

    # --- the calls the node sim makes ---------------------------------------------------------

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        """GET a core/v1 object (``pods``, ``secrets``, ``configmaps``); None when absent."""
        try:
            return await self.request("GET", f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def replace_pod_status(self, pod: Obj) -> Obj:
        m = pod["metadata"]
        return await self.request("PUT", f"/api/v1/namespaces/{m['namespace']}/pods/{m['name']}/status", body=pod)

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await self.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body=body)

    async def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's last step: delete with grace 0, only the pod instance it ran (uid)."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        try:
            await self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=body)
        except KubeError as exc:
            if exc.status not in (404, 409):  # gone already, or a new pod of the same name
                raise

    async def create_event(self, namespace: str, event: Obj) -> None:
        await self.request("POST", f"/api/v1/namespaces/{namespace}/events", body=event)

    async def list_pods(self, namespace: str | None) -> tuple[list[Obj], str]:
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        doc = await self.request("GET", path, timeout=max(self.timeout, 30))
        items = doc.get("items") or []
        for it in items:
            it.setdefault("kind", "Pod")
            it.setdefault("apiVersion", "v1")
        return items, str((doc.get("metadata") or {}).get("resourceVersion", ""))

    async def watch_pods(
        self, namespace: str | None, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[tuple[str, Obj]]:
        """Events after ``resource_version`` until the server ends the stream; 410 → WatchExpired."""
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        # No total deadline on a stream; a read deadline beyond the server's own timeout instead.
        timeout = aiohttp.ClientTimeout(sock_connect=self.timeout, sock_read=timeout_seconds + 30)
        with anyio.fail_after(self.timeout + 1):
            resp = await self._open("GET", path, query, None, "application/json", timeout)
        async with resp:
            if resp.status != 200:
                raw = await resp.read()
                if resp.status == 410:
                    raise WatchExpired(raw[:200].decode(errors="replace"))
                raise KubeError(resp.status, "", raw[:200].decode(errors="replace"))
            while True:
                line = await resp.content.readline()
                if not line:
                    return
                if not line.strip():
                    continue
                try:
                    ev = msgspec.json.decode(line)
                except msgspec.DecodeError:
                    log.warning("unparsable watch line skipped", line=line[:200].decode(errors="replace"))
                    continue
                typ, obj = ev.get("type", ""), ev.get("object") or {}
                if typ == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchExpired(str(obj.get("message", "")))
                    raise KubeError(
                        int(obj.get("code") or 500), str(obj.get("reason", "")), str(obj.get("message", ""))
                    )
                yield typ, obj


class PodHandler:
    """What the informer feeds: a full list after each (re)list, then single events."""

    async def on_sync(self, pods: list[Obj]) -> None: ...
    async def on_upsert(self, pod: Obj) -> None: ...
    async def on_delete(self, pod: Obj) -> None: ...


async def run_pod_informer(
    kube: KubeRest,
    namespace: str | None,
    handler: PodHandler,
    *,
    watch_timeout: int = 300,
    on_synced: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """List+watch pods forever: resume from the last seen resourceVersion when a stream ends or
    drops, relist on 410 (the handler reconciles the full list, so missed deletions are seen)."""
    rv = ""
    backoff = 0.2
    while True:
        try:
            if not rv:
                pods, rv = await kube.list_pods(namespace)
                await handler.on_sync(pods)
                if on_synced is not None:
                    await on_synced()
            async for typ, obj in kube.watch_pods(namespace, rv, watch_timeout):
                new_rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                if typ in ("ADDED", "MODIFIED"):
                    await handler.on_upsert(obj)
                elif typ == "DELETED":
                    await handler.on_delete(obj)
                if new_rv:
                    rv = new_rv
            backoff = 0.2  # a clean end of stream (server timeout): resume at once
        except WatchExpired:
            log.info("pod watch expired, relisting", resource_version=rv)
            rv = ""
        except (KubeError, aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("pod watch failed, retrying", error=f"{type(exc).__name__}: {exc}", retry_in=backoff)
            await anyio.sleep(backoff)  # backoff before reconnecting, not synchronisation
            backoff = min(backoff * 2, 5.0)
