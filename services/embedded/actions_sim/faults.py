"""Fault rules: which request gets which misbehaviour, count-limited.

Endpoints are named by what they do; the research spec's row IDs (G1…J2) are accepted as
aliases, and ``*`` matches every endpoint of the service (never the ``/_sim/`` control API, nor
the runner-side ``/_runner/`` API, whose endpoints are matched by name only).
"""

from __future__ import annotations

import itertools

import msgspec

from services.embedded.actions_sim.views import FaultRule, FaultView

ENDPOINTS: dict[str, str] = {
    # GitHub REST (under /api/v3)
    "access_token": "G1",
    "registration_token": "G2",
    "runner_registration": "G3",
    "installation": "",
    # Actions service
    "get_runner_group": "A1",
    "get_scale_set_by_name": "A2",
    "get_scale_set": "A3",
    "create_scale_set": "A4",
    "update_scale_set": "A5",
    "delete_scale_set": "A6",
    "generate_jit_config": "A7",
    "get_runner": "A8",
    "get_runner_by_name": "A9",
    "remove_runner": "A10",
    "create_session": "S1",
    "refresh_session": "S2",
    "delete_session": "S3",
    "get_message": "Q1",
    "delete_message": "Q2",
    "acquire_jobs": "J1",
    "acquirable_jobs": "J2",
    # runner-side API
    "runner_connect": "",
    "runner_job": "",
    "runner_job_started": "",
    "runner_job_completed": "",
    "runner_disconnect": "",
}
_ALIASES = {alias: name for name, alias in ENDPOINTS.items() if alias}
# Simulator-only surface: reachable by name, but ``*`` leaves fake runners alone.
RUNNER_SIDE = frozenset(name for name in ENDPOINTS if name.startswith("runner_") and name != "runner_registration")


class FaultRuleError(ValueError):
    """A fault rule that cannot match or act; the message names the field."""


def canonical_endpoint(name: str) -> str:
    if name == "*":
        return name
    name = _ALIASES.get(name.upper(), name)
    if name not in ENDPOINTS:
        raise FaultRuleError(f"unknown endpoint {name!r} (field: endpoint); known: {', '.join(ENDPOINTS)}")
    return name


def validate(rule: FaultRule) -> FaultRule:
    """A copy of ``rule`` with its endpoint canonical; raises FaultRuleError naming a bad field."""
    endpoint = canonical_endpoint(rule.endpoint)
    if rule.count is not None and rule.count < 1:
        raise FaultRuleError("count must be ≥ 1, or null for unlimited (field: count)")
    if rule.kind in ("status", "after") and not 100 <= rule.status <= 599:
        raise FaultRuleError("status must be an HTTP status code (field: status)")
    if rule.kind == "delay" and rule.seconds <= 0:
        raise FaultRuleError("delay needs seconds > 0 (field: seconds)")
    if rule.kind in ("redeliver", "duplicate_events", "reorder") and endpoint != "get_message":
        raise FaultRuleError(f"kind {rule.kind} applies to get_message only (field: endpoint)")
    if rule.kind == "blank_queue_url" and endpoint not in ("create_session", "refresh_session"):
        raise FaultRuleError("kind blank_queue_url applies to create_session or refresh_session (field: endpoint)")
    if rule.kind == "drop" and rule.seconds < 0:
        raise FaultRuleError("seconds must not be negative (field: seconds)")
    return msgspec.structs.replace(rule, endpoint=endpoint, method=rule.method.upper())


class FaultBook:
    """The active rules, in insertion order; the first matching rule with budget left fires."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._rules: list[FaultView] = []

    def add(self, rule: FaultRule) -> int:
        view = FaultView(id=next(self._ids), rule=validate(rule), fired=0)
        self._rules.append(view)
        return view.id

    def take(self, endpoint: str, method: str) -> FaultView | None:
        for view in self._rules:
            rule = view.rule
            if rule.endpoint == "*" and endpoint in RUNNER_SIDE:
                continue
            if rule.endpoint not in ("*", endpoint) or (rule.method and rule.method != method):
                continue
            if rule.count is not None and view.fired >= rule.count:
                continue
            view.fired += 1
            return view
        return None

    def remove(self, fault_id: int) -> bool:
        before = len(self._rules)
        self._rules = [v for v in self._rules if v.id != fault_id]
        return len(self._rules) != before

    def clear(self) -> None:
        self._rules.clear()

    def views(self) -> list[FaultView]:
        return list(self._rules)
