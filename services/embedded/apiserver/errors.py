"""The apiserver's error hierarchy: one exception type rendered as a Kubernetes ``Status`` body.

Every message and key order follows the real constructors (apimachinery ``errors.go``) so that
clients which branch on ``reason`` or parse ``message`` behave as against a real cluster.
"""

from __future__ import annotations

import json
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
    plain_text: bool = False  # answered as text/plain, not as a Status (the catch-all 404)
    empty_details: bool = False  # the body carries "details": {} even without any

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
        if d is not None and (
            d or self.empty_details or self.reason in ("NotFound", "AlreadyExists", "Conflict", "Invalid")
        ):
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


def page_not_found() -> ApiError:
    """Paths no API group claims (unknown groups, CRD groups' unknown versions and resources) fall
    through to the server's catch-all handler: a plain-text 404, not a Status."""
    return ApiError(404, "NotFound", "404 page not found\n", plain_text=True)


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
    parts = list(dict.fromkeys(f"{c.field}: {c.message}" if c.field else c.message for c in causes))
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


def options_invalid(kind: str, causes: list[Cause]) -> ApiError:
    """422 for bad request options (``ListOptions``, ``CreateOptions``, ``DeleteOptions`` …)."""
    return invalid("meta.k8s.io", kind, "", causes)


def too_large_resource_version(rv: int, current: int) -> ApiError:
    """504 for a read at a resourceVersion the server has not reached within ~3 s."""
    return ApiError(
        504,
        "Timeout",
        f"Timeout: Too large resource version: {rv}, current: {current}",
        causes=[Cause("ResourceVersionTooLarge", "Too large resource version")],
        retry_after_seconds=1,
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


def go_quote(text: str) -> str:
    """Go's ``%q`` of a string (close enough: JSON string escaping without ASCII-only output)."""
    return json.dumps(text, ensure_ascii=False)


def invalid_value(value: Any, detail: str) -> str:
    """Go's ``field.Invalid`` message text: ``Invalid value: "x": detail`` (strings quoted, numbers
    and booleans bare, anything else as JSON)."""
    if isinstance(value, str):
        shown = go_quote(value)
    elif isinstance(value, bool):
        shown = "true" if value else "false"
    elif value is None:
        shown = "null"
    elif isinstance(value, (int, float)):
        shown = str(value)
    else:
        shown = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return f"Invalid value: {shown}: {detail}"


def _go_char(ch: str) -> str:
    """Go's ``quoteChar`` in encoding/json syntax errors."""
    if ch == "'":
        return "'\\''"
    if ch == '"':
        return "'\"'"
    return "'" + json.dumps(ch, ensure_ascii=False)[1:-1] + "'"


def _container_at(text: str, pos: int) -> str:
    """``{`` or ``[``: the innermost JSON container open at ``pos`` (strings skipped)."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text[:pos]:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append(ch)
        elif ch in "}]" and stack:
            stack.pop()
    return stack[-1] if stack else ""


def go_json_error(raw: bytes, go_type: str) -> str | None:
    """The message Go's ``json.Unmarshal`` gives for ``raw`` decoded into ``go_type`` (a struct or
    map type name), or None when it decodes. Covers syntax errors and a top-level type mismatch."""
    text = raw.decode("utf-8", errors="replace")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        pos, msg = exc.pos, exc.msg
        if pos >= len(text) or msg.startswith("Unterminated string"):
            return "unexpected end of JSON input"
        ch = _go_char(text[pos])
        if msg.startswith("Expecting property name"):
            return f"invalid character {ch} looking for beginning of object key string"
        if msg.startswith("Expecting ':'"):
            return f"invalid character {ch} after object key"
        if msg.startswith("Expecting ','"):
            where = "object key:value pair" if _container_at(text, pos) == "{" else "array element"
            return f"invalid character {ch} after {where}"
        if msg.startswith("Extra data"):
            return f"invalid character {ch} after top-level value"
        if msg.startswith("Invalid control character"):
            return f"invalid character {ch} in string literal"
        if msg.startswith("Invalid \\"):
            return f"invalid character {ch} in string escape code"
        return f"invalid character {ch} looking for beginning of value"
    kind = json_kind(value)
    if kind in ("object", "null"):
        return None
    return f"json: cannot unmarshal {kind} into Go value of type {go_type}"


def json_kind(value: Any) -> str:
    """The JSON type name Go's decoder uses in its messages."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "bool"
    if value is None:
        return "null"
    return "number"


def summarize_body(raw: bytes, limit: int = 30) -> str:
    """apiserver's ``summarizeData``: the body's start as text when it looks like JSON, else hex."""
    if not raw:
        return "<empty>"
    head = raw[:limit]
    suffix = " ..." if len(raw) > limit else ""
    if raw[:1] == b"{":
        return head.decode("utf-8", errors="replace") + suffix
    return head.hex() + suffix


def unrecognized_object(kind: str, why: str, raw: bytes) -> ApiError:
    """400 for a body whose type cannot be told (``transformDecodeError`` without a kind)."""
    return bad_request(f"the object provided is unrecognized (must be of type {kind}): {why} ({summarize_body(raw)})")
