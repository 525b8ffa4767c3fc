"""Wiring of the runner worker into the common runtime (shared/worker), and its CLI.

    runnerscale runner [worker flags] [runner flags]

Controller ``ephemeralrunner``: For EphemeralRunners, Owns runner pods (label
``actions-ephemeral-runner=True``). Bus: the shared durable ``runner-jobs`` consumer of
JobStarted/JobCompleted (any replica may record a job event: every write carries the
resourceVersion it was decided on, so replicas cannot clobber each other).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from services.runner.decide import RunnerSettings
from services.runner.metrics import runner_metrics
from services.runner.reconciler import RunnerReconciler
from shared.api.constants import LABEL_EPHEMERAL_RUNNER
from shared.bus import Delivery, subjects
from shared.bus.messages import JobCompleted, JobStarted
from shared.kube import EPHEMERAL_RUNNERS, PODS, Controller
from shared.log import get_logger
from shared.version import version
from shared.worker import SettingsError, WorkerContext, add_worker_arguments, load_worker_settings, run_worker

log = get_logger(__name__)

WORKER_NAME = "runner"
CONTROLLER_NAME = "ephemeralrunner"


def make_setup(
    runner_settings: RunnerSettings | None = None,
    *,
    exclude_label_prefixes: tuple[str, ...] = (),
    holder: dict[str, Any] | None = None,
):
    """The ``setup`` for :func:`shared.worker.running_worker` / ``run_worker``.

    ``holder`` (tests) receives the reconciler under ``"reconciler"``.
    """
    settings = runner_settings or RunnerSettings()

    def setup(ctx: WorkerContext) -> list[Controller]:
        reconciler = RunnerReconciler(
            ctx.reader,
            ctx.writer,
            ctx.events,
            ctx.actions,
            settings,
            user_agent=f"runnerscale/{version()}",
            exclude_label_prefixes=exclude_label_prefixes,
            metrics=runner_metrics(ctx.registry),
        )
        if holder is not None:
            holder["reconciler"] = reconciler
        runners = ctx.informers(EPHEMERAL_RUNNERS)
        pods = ctx.informers(PODS, label_selector=f"{LABEL_EPHEMERAL_RUNNER}=True")
        controller = ctx.controller(
            CONTROLLER_NAME, reconciler.reconcile, [*ctx.for_(runners), *ctx.owns(pods, "EphemeralRunner")]
        )

        async def on_job(delivery: Delivery) -> None:
            message = delivery.message
            if not isinstance(message, (JobStarted, JobCompleted)):
                log.warning("unexpected message on the jobs consumer; ignored", subject=delivery.subject)
                return
            if not ctx.watched(message.scale_set.namespace):
                return
            await reconciler.handle_job_event(message)  # raising naks: redelivered with backoff

        async def consume_jobs() -> None:
            await ctx.bus.consume(subjects.RUNNER_JOBS, on_job, instance=None)

        ctx.add_task(consume_jobs)
        return [controller]

    return setup


# --- CLI ------------------------------------------------------------------------------------------

_RUNNER_OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    # (field, flag, env, help)
    (
        "failure_backoff",
        "--failure-backoff",
        "RUNNERSCALE_RUNNER_FAILURE_BACKOFF",
        "seconds to wait before recreating a failed pod, by failure count, comma-separated (ARC: 0,5,10,20,40,80)",
    ),
    (
        "max_failures",
        "--max-failures",
        "RUNNERSCALE_RUNNER_MAX_FAILURES",
        "pod failures tolerated without a job; one more deletes the EphemeralRunner (ARC: 5)",
    ),
    (
        "pod_start_deadline",
        "--pod-start-deadline",
        "RUNNERSCALE_RUNNER_POD_START_DEADLINE",
        "seconds a runner pod may stay Pending before its runner is deleted and unregistered (0 = never)",
    ),
    (
        "hung_after_job_grace",
        "--hung-after-job-grace",
        "RUNNERSCALE_RUNNER_HUNG_AFTER_JOB_GRACE",
        "seconds a runner may stay up after the service reported its job completed (0 = never)",
    ),
    (
        "job_still_running_requeue",
        "--job-still-running-requeue",
        "RUNNERSCALE_RUNNER_JOB_STILL_RUNNING_REQUEUE",
        "seconds between removal attempts of a deleting runner that still has a job",
    ),
    (
        "removal_give_up_after",
        "--removal-give-up-after",
        "RUNNERSCALE_RUNNER_REMOVAL_GIVE_UP_AFTER",
        "seconds after which a deleting runner whose pod is gone is released even if the service still refuses removal (0 = never)",
    ),
    (
        "quota_retry",
        "--quota-retry",
        "RUNNERSCALE_RUNNER_QUOTA_RETRY",
        "seconds between pod creation attempts refused by a ResourceQuota",
    ),
    (
        "quota_give_up_after",
        "--quota-give-up-after",
        "RUNNERSCALE_RUNNER_QUOTA_GIVE_UP_AFTER",
        "age of an EphemeralRunner after which a quota refusal deletes it",
    ),
)


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("runner")
    for field, flag, env, help_text in _RUNNER_OPTIONS:
        group.add_argument(flag, dest=f"runner_{field}", default=None, metavar=env, help=f"{help_text} [env {env}]")
    group.add_argument(
        "--exclude-label-propagation-prefix",
        dest="runner_exclude_label_prefixes",
        action="append",
        default=None,
        metavar="PREFIX",
        help="label key prefix not copied onto runner pods and secrets (repeatable) [env RUNNERSCALE_EXCLUDE_LABEL_PROPAGATION_PREFIXES]",
    )


def load_runner_settings(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> tuple[RunnerSettings, tuple[str, ...]]:
    """Defaults < environment < flags. Raises :class:`SettingsError` naming the flag."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field, flag, env_name, _ in _RUNNER_OPTIONS:
        raw = getattr(args, f"runner_{field}", None) if args is not None else None
        if raw is None:
            raw = env.get(env_name)
        if raw is None or raw == "":
            continue
        try:
            if field == "failure_backoff":
                values[field] = tuple(float(p) for p in str(raw).split(",") if p.strip())
            elif field == "max_failures":
                values[field] = int(raw)
            else:
                value = float(raw)
                if value < 0:
                    raise ValueError(raw)
                values[field] = value
        except ValueError:
            raise SettingsError(f"{env_name} / {flag}", f"cannot parse {raw!r}") from None
    try:
        settings = RunnerSettings(**values)
    except ValueError as exc:
        raise SettingsError("runner settings", str(exc)) from None
    raw_prefixes = getattr(args, "runner_exclude_label_prefixes", None) if args is not None else None
    if raw_prefixes is None:
        raw_prefixes = [env.get("RUNNERSCALE_EXCLUDE_LABEL_PROPAGATION_PREFIXES", "")]
    prefixes = tuple(p.strip() for item in raw_prefixes for p in item.split(",") if p.strip())
    return settings, prefixes


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="runnerscale runner", description="runnerscale runner worker: reconciles EphemeralRunners"
    )
    add_worker_arguments(parser)
    add_runner_arguments(parser)
    args = parser.parse_args(list(argv))
    try:
        settings = load_worker_settings(args)
        runner_settings, prefixes = load_runner_settings(args)
    except SettingsError as exc:
        print(f"runnerscale runner: {exc}", file=sys.stderr)
        return 2
    return anyio.run(run_worker, WORKER_NAME, settings, make_setup(runner_settings, exclude_label_prefixes=prefixes))
