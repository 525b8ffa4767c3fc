"""Fault injection rules: make chosen requests fail, slow down, or lose their watch stream.

A rule matches on verb, resource, subresource, namespace and name (empty = any) and fires at
most ``times`` times (0 = unlimited). Rules are plain msgspec Structs so the HTTP control
endpoint and Python callers share one shape.
"""

from __future__ import annotations

import itertools
import threading
from typing import Literal

import msgspec

Action = Literal["error", "latency", "drop_watch"]


class FaultRule(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One fault. ``action``: ``error`` (answer ``code`` with a Status), ``latency`` (delay the
    request by ``delay_seconds`` then serve it), ``drop_watch`` (cut a matching watch stream after
    ``after_events`` events)."""

    action: Action
    verb: str = ""  # get list watch create update patch delete deletecollection; "" = any
    resource: str = ""  # plural, e.g. "pods" or "ephemeralrunners"
    subresource: str = ""  # "status"; "" = any
    namespace: str = ""
    name: str = ""
    times: int = 1  # how many requests it fires on; 0 = unlimited
    code: int = 500
    reason: str = ""
    message: str = ""
    retry_after_seconds: int = 0
    delay_seconds: float = 0.0
    after_events: int = 0
    id: int = 0
    fired: int = 0


class FaultError(ValueError):
    """A fault rule is malformed (bad action, code or count)."""


_DEFAULT_REASON = {
    409: "Conflict",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
    403: "Forbidden",
    404: "NotFound",
}


def default_reason(code: int) -> str:
    return _DEFAULT_REASON.get(code, "InternalError" if code >= 500 else "BadRequest")


def validate_rule(rule: FaultRule) -> FaultRule:
    if rule.action == "error" and not (400 <= rule.code <= 599):
        raise FaultError(f"fault rule: code must be an HTTP error status (400-599), got {rule.code}")
    if rule.times < 0:
        raise FaultError(f"fault rule: times must be >= 0, got {rule.times}")
    if rule.action == "latency" and rule.delay_seconds <= 0:
        raise FaultError("fault rule: latency needs delay_seconds > 0")
    return rule


class Faults:
    """The active rules. Thread-safe, because tests add rules from outside the server's loop."""

    def __init__(self) -> None:
        self._rules: list[FaultRule] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def add(self, rule: FaultRule) -> FaultRule:
        validate_rule(rule)
        with self._lock:
            rule.id = next(self._ids)
            rule.fired = 0
            self._rules.append(rule)
        return rule

    def remove(self, rule_id: int) -> bool:
        with self._lock:
            before = len(self._rules)
            self._rules = [r for r in self._rules if r.id != rule_id]
            return len(self._rules) != before

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def list(self) -> list[FaultRule]:
        with self._lock:
            return [msgspec.structs.replace(r) for r in self._rules]

    def take(
        self, verb: str, resource: str, subresource: str, namespace: str, name: str, actions: tuple[str, ...]
    ) -> FaultRule | None:
        """The first matching rule with one of ``actions``, counted as fired (and retired when spent)."""
        with self._lock:
            for r in self._rules:
                if r.action not in actions:
                    continue
                if r.verb and r.verb != verb:
                    continue
                if r.resource and r.resource != resource:
                    continue
                if r.subresource and r.subresource != subresource:
                    continue
                if r.namespace and r.namespace != namespace:
                    continue
                if r.name and r.name != name:
                    continue
                r.fired += 1
                if r.times and r.fired >= r.times:
                    self._rules.remove(r)
                return msgspec.structs.replace(r)
        return None
