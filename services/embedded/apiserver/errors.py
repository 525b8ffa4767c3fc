"""The apiserver's error hierarchy: one exception type rendered as a Kubernetes ``Status`` body.

Every message and key order follows the real constructors (apimachinery ``errors.go``) so that
clients which branch on ``reason`` or parse ``message`` behave as against a real cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Cause:
    reason: str
    message: str
    field: str = ""

    def to_json(self) -> dict[str, str]:
        out = {"reason": self.reason, "message": self.message}
        if self.field:
            out["field"] = self.field
        return out


@dataclass
class ApiError(Exception):
    """A request failed; ``status_body()`` is what the client receives."""

    code: int
    reason: str
    message: str
    name: str = ""
    group: str = ""
    kind: str = ""
    uid: str = ""
    causes: list[Cause] = field(default_factory=list)
    retry_after_seconds: int = 0

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def details(self) -> dict[str, Any] | None:
        d: dict[str, Any] = {}
        if self.name:
            d["name"] = self.name
        if self.group:
            d["group"] = self.group
        if self.kind:
            d["kind"] = self.kind
        if self.uid:
            d["uid"] = self.uid
        if self.causes:
            d["causes"] = [c.to_json() for c in self.causes]
        if self.retry_after_seconds:
            d["retryAfterSeconds"] = self.retry_after_seconds
        return d

    def status_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
        if self.message:
            body["message"] = self.message
        if self.reason:
            body["reason"] = self.reason
        d = self.details()
        if d is not None and (d or self.reason in ("NotFound", "AlreadyExists", "Conflict", "Invalid")):
            body["details"] = d
        body["code"] = self.code
        return body


def qualified(group: str, plural: str) -> str:
    """The "qualified resource" used in messages: ``pods`` or ``ephemeralrunners.actions.github.com``."""
    return f"{plural}.{group}" if group else plural


def not_found(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{qualified(group, plural)} "{name}" not found', name=name, group=group, kind=plural
    )


def resource_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource")


def already_exists(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        409, "AlreadyExists", f'{qualified(group, plural)} "{name}" already exists', name=name, group=group, kind=plural
    )


def conflict(group: str, plural: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(group, plural)} "{name}": {why}',
        name=name,
        group=group,
        kind=plural,
    )


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(group: str, kind: str, name: str, causes: list[Cause], details_kind: str | None = None) -> ApiError:
    """422 Invalid; the message lists every cause as ``field: message``."""
    qual = f"{kind}.{group}" if group else kind
    parts = [f"{c.field}: {c.message}" if c.field else c.message for c in causes]
    joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    return ApiError(
        422,
        "Invalid",
        f'{qual} "{name}" is invalid: {joined}',
        name=name,
        group=group,
        kind=details_kind or kind,
        causes=causes,
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def forbidden(group: str, plural: str, name: str, why: str, causes: list[Cause] | None = None) -> ApiError:
    return ApiError(
        403,
        "Forbidden",
        f'{qualified(group, plural)} "{name}" is forbidden: {why}',
        name=name,
        group=group,
        kind=plural,
        causes=causes or [],
    )


def unsupported_media_type(accepted: list[str]) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: " + ", ".join(accepted),
    )


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def internal(message: str) -> ApiError:
    # The real server gives 500 without a reason for some storage errors (e.g. RV set on create).
    return ApiError(500, "", message)


def invalid_value(value: Any, detail: str) -> str:
    """Go's ``field.Invalid`` message text: ``Invalid value: "x": detail``."""
    if isinstance(value, str):
        shown = '"' + value + '"'
    elif isinstance(value, bool):
        shown = "true" if value else "false"
    elif value is None:
        shown = "null"
    else:
        shown = str(value)
    return f"Invalid value: {shown}: {detail}"
