"""The HTTP shell of the client: one request with retries, a deadline, BOM stripping, and the
mapping of error responses onto the typed hierarchy (README "Actions service client").

:func:`classify_error` is pure; :class:`HttpTransport` does the I/O.
"""

from __future__ import annotations

import base64
import os
import re
import ssl
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

import aiohttp
import anyio
import msgspec
from yarl import URL

from shared.actions.errors import (
    ActionsHTTPError,
    AuthenticationError,
    ClientConfigError,
    DeadlineExceededError,
    JobStillRunningError,
    MessageNotFoundError,
    ProtocolError,
    RateLimitedError,
    RunnerExistsError,
    RunnerNotFoundError,
    ScaleSetExistsError,
    ScaleSetNotFoundError,
    ServiceUnavailableError,
    SessionConflictError,
    TokenExpiredError,
    TransportError,
)
from shared.actions.messages import strip_bom
from shared.actions.retry import RetryPolicy, backoff_delay, parse_retry_after, should_retry_status
from shared.log import get_logger, redact_text, register_secret

__all__ = ["HttpResponse", "HttpTransport", "Surface", "classify_error", "describe_request"]

log = get_logger(__name__)

MAX_BODY_BYTES = 16 * 1024 * 1024
_QUERY = re.compile(r"\?[^\s'\"]*")

# Substrings of the service's .NET exception names, most specific first.
_TYPE_NAME_ERRORS: tuple[tuple[str, type[ActionsHTTPError]], ...] = (
    ("AgentExistsException", RunnerExistsError),
    ("AgentNotFoundException", RunnerNotFoundError),
    ("JobStillRunningException", JobStillRunningError),
    ("RunnerScaleSetSessionConflictException", SessionConflictError),
    ("RunnerScaleSetNotFoundException", ScaleSetNotFoundError),
    ("RunnerScaleSetExistsException", ScaleSetExistsError),
    ("MessageNotFoundException", MessageNotFoundError),
)


class Surface:
    """Which of the three HTTP surfaces a request goes to; decides how a 401 is read."""

    REST = "rest"  # GitHub REST: bad credentials
    ADMIN = "admin"  # Actions service with the admin token
    QUEUE = "queue"  # message queue (and acquirejobs) with the session token


class HttpResponse(msgspec.Struct, frozen=True):
    status: int
    headers: Mapping[str, str]
    body: bytes  # BOM stripped
    request: str  # "METHOD /path", for error texts

    @property
    def activity_id(self) -> str:
        return self.headers.get("ActivityId", "")

    @property
    def github_request_id(self) -> str:
        return self.headers.get("X-GitHub-Request-Id", "")


class _ErrorBody(msgspec.Struct):
    typeName: str = ""  # wire names
    message: str = ""


def describe_request(method: str, url: str | URL) -> str:
    """``"METHOD host/path"``: the query string is dropped, it may carry tokens."""
    u = url if isinstance(url, URL) else URL(url, encoded=True)
    return f"{method.upper()} {u.host or ''}{(':' + str(u.explicit_port)) if u.explicit_port else ''}{u.raw_path}"


def _parse_error_body(response: HttpResponse) -> tuple[str, str]:
    """(typeName, message) from an error body; never raises."""
    if not response.body.strip():
        return "", "unknown error"
    text = response.body.decode("utf-8", errors="replace").strip()
    content_type = response.headers.get("Content-Type", "")
    if "text/plain" in content_type:
        return "", text
    try:
        parsed = msgspec.json.decode(response.body, type=_ErrorBody)
    except msgspec.DecodeError:
        return "", text  # not JSON (an HTML proxy page, say): quote it, truncated
    return parsed.typeName, parsed.message or text


def classify_error(
    response: HttpResponse,
    *,
    surface: str,
    status_errors: Mapping[int, type[ActionsHTTPError]] | None = None,
    what: str = "request failed",
    retry_after: float | None = None,
) -> ActionsHTTPError:
    """Turn an error response into the typed error callers branch on.

    Order: the exception name in a JSON body (substring match, as the reference client), then
    the endpoint's own meaning of a status (``status_errors``), then generic status classes.
    """
    type_name, message = _parse_error_body(response)
    cls: type[ActionsHTTPError] = ActionsHTTPError
    for needle, error_cls in _TYPE_NAME_ERRORS:
        if needle in type_name:
            cls = error_cls
            break
    else:
        status = response.status
        if status_errors and status in status_errors:
            cls = status_errors[status]
        elif status == 429:
            cls = RateLimitedError
        elif 500 <= status <= 599:
            cls = ServiceUnavailableError
        elif status in (401, 403) and surface == Surface.REST:
            cls = AuthenticationError
        elif status == 401:
            cls = TokenExpiredError
    kwargs: dict[str, Any] = dict(
        request=response.request,
        status=response.status,
        type_name=type_name,
        service_message=message,
        activity_id=response.activity_id,
        github_request_id=response.github_request_id,
    )
    if cls is RateLimitedError:
        if retry_after is None:
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
        return RateLimitedError(what, retry_after=retry_after, **kwargs)
    return cls(what, **kwargs)


def build_ssl_context(root_ca_pem: str | bytes | None, *, insecure_skip_verify: bool = False) -> ssl.SSLContext | bool:
    """System roots plus ``root_ca_pem`` (appended, as ARC's listener does), or no verification."""
    if insecure_skip_verify:
        return False
    context = ssl.create_default_context()
    if root_ca_pem:
        pem = root_ca_pem.decode() if isinstance(root_ca_pem, bytes) else root_ca_pem
        try:
            context.load_verify_locations(cadata=pem)
        except (ssl.SSLError, ValueError) as exc:
            raise ClientConfigError(
                f"root CA is not a valid PEM certificate bundle ({exc.__class__.__name__})"
            ) from None
    return context


def env_proxies(environ: Mapping[str, str]) -> dict[str, str]:
    """``{"http": url, "https": url, "no": "host,..."}`` from ``*_PROXY`` variables; lower-case
    names win over upper-case ones, as curl and Python's urllib do."""
    found: dict[str, str] = {}
    for lower_wins in (False, True):
        for name, value in environ.items():
            if not value or not name.lower().endswith("_proxy") or (name == name.lower()) != lower_wins:
                continue
            found[name.lower().removesuffix("_proxy")] = value
    return found


def proxy_for(url: URL, *, explicit: str | None, proxies: Mapping[str, str]) -> str | None:
    """The proxy for ``url``: the explicit one always, else the environment's for the scheme
    unless ``NO_PROXY`` exempts the host."""
    if explicit is not None:
        return explicit
    chosen = proxies.get(url.scheme)
    if not chosen or url.host is None:
        return None
    host = f"{url.host}:{url.explicit_port}" if url.explicit_port else url.host
    # proxy_bypass_environment is public but missing from typeshed's stub.
    if urllib.request.proxy_bypass_environment(host, dict(proxies)):  # type: ignore[attr-defined]
        return None
    return chosen


class HttpTransport:
    """Sends one logical request: retries per the policy, all inside one deadline.

    Proxies come from ``proxy`` or, when it is ``None``, from ``HTTPS_PROXY``/``HTTP_PROXY``/
    ``NO_PROXY`` read at construction. aiohttp's ``trust_env`` is not used: it would also read
    ``~/.netrc`` and then refuse our explicit ``Authorization`` header for a listed host.
    """

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | bool,
        proxy: str | None,
        policy: RetryPolicy,
        user_agent: str,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._ssl = ssl_context
        self._proxy = proxy
        self._env_proxies = env_proxies(os.environ if environ is None else environ)
        for value in self._env_proxies.values():
            password = URL(value).password if "://" in value else None
            register_secret(password)
        self.policy = policy
        self.user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl, limit=50, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False, auto_decompress=True)

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    @property
    def has_proxy(self) -> bool:
        return self._proxy is not None or bool(self._env_proxies.get("https") or self._env_proxies.get("http"))

    async def send(
        self,
        method: str,
        url: URL,
        *,
        headers: Mapping[str, str],
        body: bytes | None = None,
        attempt_timeout: float,
        deadline: float,
        extra_retry_statuses: frozenset[int] = frozenset(),
    ) -> HttpResponse:
        """Send with retries. Returns the final response (success or not, the caller checks the
        status); raises :class:`TransportError` when no response was ever obtained and
        :class:`DeadlineExceededError` when ``deadline`` seconds ran out."""
        if self._session is None:
            raise TransportError("client is not open: use 'async with ActionsClient...'")
        request = describe_request(method, url)
        all_headers = {"User-Agent": self.user_agent, **headers}
        give_up_at = time.monotonic() + deadline
        last_error: BaseException | None = None
        last_response: HttpResponse | None = None
        attempts = self.policy.max_retries + 1
        made = 0
        for attempt in range(attempts):
            remaining = give_up_at - time.monotonic()
            if remaining <= 0:
                break
            made += 1
            last_error = None
            try:
                with anyio.fail_after(min(attempt_timeout, remaining)):
                    last_response = await self._attempt(method, url, all_headers, body, request)
            except TimeoutError as exc:
                last_error, last_response = exc, None
            except aiohttp.ClientConnectorCertificateError as exc:
                # A certificate problem does not heal by retrying.
                # The reason (e.g. "certificate verify failed: unable to get local issuer
                # certificate") names no secret and tells the operator what to fix.
                reason = getattr(exc.certificate_error, "verify_message", None) or str(exc.certificate_error)
                raise TransportError(
                    f"TLS failure: {reason} (for a private CA, set the root CA: the ARS githubServerTLS / listener server_root_ca)",
                    request=request,
                ) from None
            except (aiohttp.ClientError, OSError) as exc:
                last_error, last_response = exc, None
            if last_response is not None and not should_retry_status(last_response.status, extra=extra_retry_statuses):
                return last_response
            if attempt == attempts - 1:
                break
            retry_after = parse_retry_after(last_response.headers.get("Retry-After")) if last_response else None
            delay = backoff_delay(
                attempt, self.policy, status=last_response.status if last_response else 0, retry_after=retry_after
            )
            if retry_after is not None and retry_after > self.policy.retry_after_max:
                break  # the server asks for a longer pause than we hold a call open for
            if time.monotonic() + delay >= give_up_at:
                break
            log.info(
                "retrying actions request",
                request=request,
                attempt=attempt + 1,
                status=last_response.status if last_response else 0,
                error=type(last_error).__name__ if last_error else "",
                delay_s=round(delay, 3),
            )
            await anyio.sleep(delay)
        if last_response is not None:
            return last_response
        if last_error is None or time.monotonic() >= give_up_at:
            raise DeadlineExceededError(f"deadline of {deadline:g}s exceeded", request=request)
        # aiohttp texts may quote the URL; its query string may carry a token.
        detail = _QUERY.sub("?…", redact_text(str(last_error)))[:200]
        raise TransportError(
            f"giving up after {made} attempt(s): {type(last_error).__name__}: {detail}",
            request=request,
        )

    async def _attempt(
        self, method: str, url: URL, headers: Mapping[str, str], body: bytes | None, request: str
    ) -> HttpResponse:
        assert self._session is not None
        proxy = proxy_for(url, explicit=self._proxy, proxies=self._env_proxies)
        proxy_url = URL(proxy) if proxy else None
        proxy_headers = None
        if proxy_url is not None and proxy_url.user:
            # Credentials in the proxy URL go in Proxy-Authorization, not in the request line.
            basic = base64.b64encode(f"{proxy_url.user}:{proxy_url.password or ''}".encode()).decode()
            proxy_url = proxy_url.with_user(None)
            if url.scheme == "https":
                proxy_headers = {"Proxy-Authorization": f"Basic {basic}"}  # on the CONNECT
            else:
                headers = {**headers, "Proxy-Authorization": f"Basic {basic}"}  # plain HTTP: on the request
        async with self._session.request(
            method,
            url,
            headers=headers,
            data=body,
            proxy=proxy_url,
            proxy_headers=proxy_headers,
            allow_redirects=True,
            max_redirects=10,
            # anyio.fail_after bounds the attempt; aiohttp's own timeout is disabled.
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        ) as resp:
            data = bytearray()
            async for chunk in resp.content.iter_chunked(64 * 1024):
                data += chunk
                if len(data) > MAX_BODY_BYTES:
                    # Nothing in this protocol is this large; do not buffer a runaway body.
                    raise ProtocolError(f"response body exceeds {MAX_BODY_BYTES} bytes", request=request)
            return HttpResponse(
                status=resp.status,
                headers=resp.headers,
                body=strip_bom(bytes(data)),
                request=request,
            )
