"""The error hierarchy of the Kubernetes access layer.

Everything that goes wrong talking to the API server surfaces as a :class:`KubeError` subclass
naming the request (``PATCH ephemeralrunnersets.actions.github.com ns/name/status``). Callers
never see ``ApiException``, an aiohttp error, ``asyncio.TimeoutError`` or a ``KeyError``.

``translate_status`` is a pure function (status code + body + headers → error) so the mapping is
testable without a server.
"""

from __future__ import annotations

from typing import Any

import msgspec


class StatusCause(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One field-level cause of an Invalid (422) error: ``field`` is a path such as ``spec.replicas``."""

    reason: str = ""
    message: str = ""
    field: str = ""


class StatusDetails(msgspec.Struct, kw_only=True, omit_defaults=True, rename="camel"):
    name: str = ""
    group: str = ""
    kind: str = ""
    uid: str = ""
    causes: list[StatusCause] = []
    retry_after_seconds: int = 0


class Status(msgspec.Struct, kw_only=True, omit_defaults=True):
    """meta/v1 Status, the body of every error response."""

    kind: str = ""
    status: str = ""
    message: str = ""
    reason: str = ""
    details: StatusDetails | None = None
    code: int = 0


def decode_status(body: bytes) -> Status | None:
    """The Status in ``body``, or None when the body is not a Status (HTML from a proxy, garbage)."""
    try:
        status = msgspec.json.decode(body, type=Status)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return status if status.kind == "Status" or status.reason or status.code else None


class KubeError(Exception):
    """Base of every error of the Kubernetes access layer.

    ``request`` names the call (verb, resource, namespace/name), ``status`` is the HTTP code (0 when
    no response arrived), ``reason`` the Status reason, ``message`` the server's message.
    """

    retryable: bool = False

    def __init__(
        self, request: str, message: str, *, status: int = 0, reason: str = "", details: StatusDetails | None = None
    ) -> None:
        self.request = request
        self.message = message
        self.status = status
        self.reason = reason
        self.details = details
        code = f" ({status} {reason})" if status else (f" ({reason})" if reason else "")
        super().__init__(f"{request}: {message}{code}")


class NotFound(KubeError):
    """404: the object (or its namespace, or the resource type) does not exist."""


class Conflict(KubeError):
    """409 Conflict: the write was decided on a stale resourceVersion / uid. Re-read and decide again."""

    retryable = True


class AlreadyExists(KubeError):
    """409 AlreadyExists: a create found an object of that name."""


class Invalid(KubeError):
    """422 Invalid: the object was rejected; ``causes`` lists the offending fields."""

    @property
    def causes(self) -> list[StatusCause]:
        return list(self.details.causes) if self.details else []


class BadRequest(KubeError):
    """400 (malformed request or patch) and 415 (unsupported patch type): a bug in the caller."""


class Forbidden(KubeError):
    """401/403: not allowed (RBAC), or the namespace is terminating."""


class Gone(KubeError):
    """410 Expired/Gone: a watch or continue token refers to compacted history. Relist."""


class Throttled(KubeError):
    """429: API priority and fairness pushed back. ``retry_after`` seconds (None when unstated)."""

    retryable = True

    def __init__(self, request: str, message: str, *, retry_after: float | None = None, **kw: object) -> None:
        super().__init__(request, message, **kw)  # type: ignore[arg-type]
        self.retry_after = retry_after


class ServerError(KubeError):
    """5xx other than a timeout: the server failed; retry with backoff."""

    retryable = True


class Timeout(KubeError):
    """No answer within the request's deadline (client side), or a 504 / reason Timeout from the server."""

    retryable = True


class ConnectionFailed(KubeError):
    """The TCP/TLS connection could not be made or was dropped before a response."""

    retryable = True


class DecodeFailed(KubeError):
    """A 2xx response whose body is not the expected object (wrong kind, malformed JSON)."""


class LocklessWrite(KubeError):
    """A write without a resourceVersion precondition was issued inside :func:`retry_on_conflict`.

    Such a write can never conflict, so the retry loop around it would be protection in name
    only. Raised before anything is sent.
    """


def _retry_after(headers: object, details: StatusDetails | None) -> float | None:
    raw = None
    getter = getattr(headers, "get", None)
    if getter is not None:
        raw = getter("Retry-After")
    if raw is not None:
        try:
            return max(0.0, float(raw))
        except ValueError:
            pass  # an HTTP-date Retry-After; fall back to the Status details
    if details is not None and details.retry_after_seconds > 0:
        return float(details.retry_after_seconds)
    return None


def translate_status(request: str, code: int, body: bytes, headers: object = None) -> KubeError:
    """The :class:`KubeError` for an HTTP error response (pure: no I/O)."""
    status = decode_status(body)
    reason = status.reason if status else ""
    message = (
        status.message if status and status.message else body[:200].decode("utf-8", "replace").strip()
    ) or f"HTTP {code}"
    details = status.details if status else None
    kw: dict[str, Any] = {"status": code, "reason": reason, "details": details}
    if code == 404:
        return NotFound(request, message, **kw)
    if code == 409:
        if reason == "AlreadyExists":
            return AlreadyExists(request, message, **kw)
        return Conflict(request, message, **kw)
    if code == 422:
        return Invalid(request, message, **kw)
    if code == 410:
        return Gone(request, message, **kw)
    if code == 429:
        return Throttled(request, message, retry_after=_retry_after(headers, details), **kw)
    if code in (400, 405, 406, 413, 415):
        return BadRequest(request, message, **kw)
    if code in (401, 403):
        return Forbidden(request, message, **kw)
    if code == 504 or reason == "Timeout":
        return Timeout(request, message, **kw)
    if code >= 500:
        return ServerError(request, message, **kw)
    return KubeError(request, message, **kw)


def status_from_watch_error(request: str, obj: Status) -> KubeError:
    """The error an ERROR watch event stands for (410 inside a 200 stream → :class:`Gone`)."""
    return translate_status(request, obj.code or 500, msgspec.json.encode(obj))
