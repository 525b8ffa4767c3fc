"""Flags and environment of the runner-set worker beyond the common worker flags (README "runner-set worker").

Defaults < environment < flags; a bad value raises :class:`shared.worker.SettingsError` naming the
environment variable and the flag (``main`` exits 2).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from services.runner_set.failures import FailurePolicy
from shared.worker import SettingsError

# (field, flag, env, type, help)
OPTIONS: tuple[tuple[str, str, str, type, str], ...] = (
    (
        "failed_runner_ttl",
        "--failed-runner-ttl",
        "RUNNERSCALE_FAILED_RUNNER_TTL",
        float,
        "seconds a Failed EphemeralRunner is kept (visible, counted) before it is removed and replaced; 0 = never (ARC) [default 300]",
    ),
    (
        "budget_failures",
        "--failure-budget",
        "RUNNERSCALE_FAILURE_BUDGET",
        int,
        "runner failures of one set tolerated within --failure-budget-window; one more backs runner creation off; 0 = no budget [default 5]",
    ),
    (
        "budget_window",
        "--failure-budget-window",
        "RUNNERSCALE_FAILURE_BUDGET_WINDOW",
        float,
        "seconds over which failures are counted [default 600]",
    ),
    (
        "backoff_base",
        "--failure-budget-backoff",
        "RUNNERSCALE_FAILURE_BUDGET_BACKOFF",
        float,
        "seconds of the first creation backoff; doubled per escalation [default 30]",
    ),
    (
        "backoff_max",
        "--failure-budget-backoff-max",
        "RUNNERSCALE_FAILURE_BUDGET_BACKOFF_MAX",
        float,
        "cap of the creation backoff in seconds [default 600]",
    ),
)


def add_runner_set_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("runner-set")
    for field, flag, env, _, help_text in OPTIONS:
        group.add_argument(flag, dest=f"runner_set_{field}", default=None, metavar=env, help=f"{help_text} [env {env}]")


def load_failure_policy(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> FailurePolicy:
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field, flag, env_name, kind, _ in OPTIONS:
        raw = getattr(args, f"runner_set_{field}", None) if args is not None else None
        if raw is None:
            raw = env.get(env_name)
        if raw is None or str(raw).strip() == "":
            continue
        try:
            value = kind(str(raw).strip())
        except ValueError:
            raise SettingsError(f"{env_name} / {flag}", f"cannot parse {raw!r}") from None
        if value < 0:
            raise SettingsError(f"{env_name} / {flag}", f"must be >= 0, got {raw!r}")
        values[field] = value
    try:
        return FailurePolicy(**values)
    except ValueError as exc:
        raise SettingsError("runner-set failure settings", str(exc)) from None
