"""ActionsClientPool: one cached ActionsClient per (namespace, secret, config URL, proxy, TLS).

ARC reads the GitHub secret live on every reconcile that needs credentials and caches the client
per credentials/URL/namespace/proxy/CA. The pool does the same:

- every :meth:`ActionsClientPool.get` takes the result of an uncached GET of the Secret (and of
  the proxy credential Secrets and the TLS ConfigMap, when configured) that began at most
  ``max_age`` seconds (:data:`CREDENTIALS_MAX_AGE`, 1 s) before the call did, and makes that read
  itself when there is none (concurrent callers of one key share it). A rotation is therefore seen
  by every call that begins more than ``max_age`` after it; a burst of JIT calls costs at most one
  Secret GET per key per ``max_age``, and a call within it waits for no read. ``max_age=0``: a read
  that began after the call did (ARC's live read per reconcile);
- the client is rebuilt when any of their resourceVersions changed (a rotated token or key is used
  at once), and the replaced client is closed;
- :meth:`close` (called by the worker runtime on shutdown) closes every client.

Errors are :class:`ActionsCredentialsUnavailable` (missing Secret, unusable keys, missing CA) so a
reconcile can turn them into one Kubernetes Event; nothing secret is in their text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlsplit, urlunsplit

import anyio
import msgspec

from shared.actions import ActionsClient, ActionsError, ClientSettings, credentials_from_secret
from shared.api import ProxyConfig, TLSConfig
from shared.kube import CONFIG_MAPS, SECRETS, ApiReader, KubeError, NotFound, ObjectKey
from shared.kube.objects import ConfigMap
from shared.log import get_logger

log = get_logger(__name__)

# How old (seconds, from when it began) a credentials read may be for a call to use it: a rotation
# is seen by every call that begins later than this after it (README "`ActionsClientPool`").
CREDENTIALS_MAX_AGE = 1.0

SECRET_KEYS = ("github_token", "github_app_id", "github_app_installation_id", "github_app_private_key")


class ActionsCredentialsUnavailable(Exception):
    """The client cannot be built: a Secret/ConfigMap is missing or its content is unusable."""

    def __init__(self, namespace: str, what: str, problem: str) -> None:
        self.namespace = namespace
        self.what = what
        self.problem = problem
        super().__init__(f"{what} in namespace {namespace}: {problem}")


class RunnerConfigLike(Protocol):
    """What the pool needs from an EphemeralRunnerSpec / AutoscalingRunnerSetSpec / listener spec."""

    github_config_url: str
    github_config_secret: str
    proxy: ProxyConfig | None
    github_server_tls: TLSConfig | None


@dataclass(frozen=True)
class PoolKey:
    namespace: str
    secret: str
    config_url: str
    proxy: bytes  # encoded ProxyConfig (b"" when none)
    tls: bytes  # encoded TLSConfig


@dataclass
class _Entry:
    fingerprint: tuple[str, ...]  # resourceVersions the client was built from
    client: ActionsClient
    read_started: float = float("-inf")  # clock() when the reads behind ``fingerprint`` began


def proxy_url_for(config_url: str, proxy: ProxyConfig | None, credentials: Mapping[str, tuple[str, str]]) -> str | None:
    """The proxy URL to use for ``config_url`` (pure): https targets use ``proxy.https``, http
    targets ``proxy.http``; a host listed in ``noProxy`` (exact, or a ``.suffix``/suffix match)
    gets none. ``credentials`` maps a credentialSecretRef name to (username, password)."""
    if proxy is None:
        return None
    parts = urlsplit(config_url)
    host = (parts.hostname or "").lower()
    for entry in proxy.no_proxy:
        e = entry.strip().lower()
        if not e:
            continue
        if e == "*" or host == e.lstrip(".") or host.endswith("." + e.lstrip(".")):
            return None
    server = proxy.https if parts.scheme == "https" else proxy.http
    if server is None or not server.url:
        return None
    if not server.credential_secret_ref:
        return server.url
    user, password = credentials.get(server.credential_secret_ref, ("", ""))
    if not user:
        return server.url
    p = urlsplit(server.url)
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{p.hostname or ''}" + (f":{p.port}" if p.port else "")
    return urlunsplit((p.scheme, netloc, p.path, p.query, p.fragment))


class ActionsClientPool:
    """Builds and caches Actions clients; safe for concurrent reconciles."""

    def __init__(
        self,
        reader: ApiReader,
        *,
        timeout: float = 60.0,
        settings: ClientSettings | None = None,
        user_agent: Any = None,
        max_age: float = CREDENTIALS_MAX_AGE,
    ) -> None:
        if max_age < 0:
            raise ValueError("max_age must be >= 0")
        self.reader = reader
        self.max_age = max_age
        self.timeout = timeout
        self.settings = settings
        self.user_agent = user_agent
        self._entries: dict[PoolKey, _Entry] = {}
        self._locks: dict[PoolKey, anyio.Lock] = {}
        self._closed = False
        self._clock = anyio.current_time
        self.builds = 0  # how many clients were built (tests, metrics)
        self.reads = 0  # how many times the credentials were read (tests)

    def __len__(self) -> int:
        return len(self._entries)

    async def for_spec(self, namespace: str, spec: RunnerConfigLike) -> ActionsClient:
        """The client for an object's GitHub configuration (an EphemeralRunnerSpec, ARS spec, ...)."""
        return await self.get(
            namespace,
            config_url=spec.github_config_url,
            secret_name=spec.github_config_secret,
            proxy=spec.proxy,
            tls=spec.github_server_tls,
        )

    async def get(
        self,
        namespace: str,
        *,
        config_url: str,
        secret_name: str,
        proxy: ProxyConfig | None = None,
        tls: TLSConfig | None = None,
    ) -> ActionsClient:
        if self._closed:
            raise RuntimeError("ActionsClientPool is closed")
        if not secret_name:
            raise ActionsCredentialsUnavailable(namespace, "githubConfigSecret", "is empty")
        key = PoolKey(
            namespace,
            secret_name,
            config_url,
            msgspec.json.encode(proxy) if proxy else b"",
            msgspec.json.encode(tls) if tls else b"",
        )
        # Oldest start a read may have for this call to use it (max_age 0: one that began after
        # the call did, as fresh as the call's own read would have been).
        oldest = self._clock() - self.max_age
        entry = self._entries.get(key)
        if entry is not None and entry.read_started >= oldest:
            return entry.client  # recent enough: no read, no wait for one in flight
        lock = self._locks.setdefault(key, anyio.Lock())
        async with lock:
            entry = self._entries.get(key)
            if entry is not None and entry.read_started >= oldest:
                return entry.client  # a read that began within the bound (e.g. while we waited)
            read_started = self._clock()
            self.reads += 1
            secret = await self._secret(namespace, secret_name)
            fingerprint = [secret.metadata.resource_version]
            proxy_creds: dict[str, tuple[str, str]] = {}
            if proxy is not None:
                for server in (proxy.http, proxy.https):
                    if (
                        server is not None
                        and server.credential_secret_ref
                        and server.credential_secret_ref not in proxy_creds
                    ):
                        s = await self._secret(namespace, server.credential_secret_ref)
                        fingerprint.append(s.metadata.resource_version)
                        proxy_creds[server.credential_secret_ref] = (_text(s, "username"), _text(s, "password"))
            root_ca: str | None = None
            ref = tls.certificate_from.config_map_key_ref if tls and tls.certificate_from else None
            if ref is not None:
                cm = await self._config_map(namespace, ref.name)
                fingerprint.append(cm.metadata.resource_version)
                root_ca = cm.data.get(ref.key)
                if not root_ca:
                    raise ActionsCredentialsUnavailable(namespace, f"ConfigMap {ref.name}", f"has no key {ref.key!r}")
            fp = tuple(fingerprint)
            if entry is not None and entry.fingerprint == fp:
                entry.read_started = read_started
                return entry.client
            try:
                creds = credentials_from_secret({k: v for k in SECRET_KEYS if (v := secret.decoded(k)) is not None})
            except (ActionsError, ValueError) as exc:
                raise ActionsCredentialsUnavailable(namespace, f"Secret {secret_name}", str(exc)) from None
            try:
                client = ActionsClient.from_config(
                    config_url,
                    creds,
                    timeout=self.timeout,
                    settings=self.settings,
                    proxy=proxy_url_for(config_url, proxy, proxy_creds),
                    root_ca=root_ca,
                    user_agent=self.user_agent,
                )
                await client.__aenter__()
            except ActionsError as exc:
                raise ActionsCredentialsUnavailable(namespace, "githubConfigUrl / TLS / proxy", str(exc)) from None
            self.builds += 1
            self._entries[key] = _Entry(fp, client, read_started)
            if entry is not None:
                log.info("GitHub credentials changed; Actions client rebuilt", namespace=namespace, secret=secret_name)
                await entry.client.close()
            return client

    async def _secret(self, namespace: str, name: str) -> Any:
        try:
            return await self.reader.get(SECRETS, ObjectKey(namespace, name))
        except NotFound:
            raise ActionsCredentialsUnavailable(namespace, f"Secret {name}", "not found") from None
        except KubeError as exc:
            raise ActionsCredentialsUnavailable(namespace, f"Secret {name}", f"cannot be read: {exc}") from None

    async def _config_map(self, namespace: str, name: str) -> ConfigMap:
        try:
            return await self.reader.get(CONFIG_MAPS, ObjectKey(namespace, name))
        except NotFound:
            raise ActionsCredentialsUnavailable(namespace, f"ConfigMap {name}", "not found") from None
        except KubeError as exc:
            raise ActionsCredentialsUnavailable(namespace, f"ConfigMap {name}", f"cannot be read: {exc}") from None

    async def close(self) -> None:
        """Close every client (idempotent)."""
        self._closed = True
        entries, self._entries = list(self._entries.values()), {}
        with anyio.CancelScope(shield=True):
            for entry in entries:
                try:
                    await entry.client.close()
                except Exception as exc:
                    log.info("Actions client close failed", error=type(exc).__name__)


def _text(secret: Any, key: str) -> str:
    raw = secret.decoded(key)
    return raw.decode("utf-8", "replace").strip() if raw else ""


__all__ = [
    "CONFIG_MAPS",
    "CREDENTIALS_MAX_AGE",
    "ActionsClientPool",
    "ActionsCredentialsUnavailable",
    "ConfigMap",
    "PoolKey",
    "proxy_url_for",
]
