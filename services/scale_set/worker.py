"""Wiring of the scale-set worker into the common runtime (``shared.worker``).

async with running_worker("scale-set", settings, scale_set_setup(options)) as w: ...
runnerscale scale-set --controller-namespace arc-systems --listener-image IMAGE [worker flags]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import anyio

from services.scale_set.build import BuildOptions
from services.scale_set.reconciler import ScaleSetReconciler
from shared.api import AutoscalingListener
from shared.api.constants import KIND_AUTOSCALING_RUNNER_SET
from shared.bus import subjects
from shared.kube import (
    AUTOSCALING_LISTENERS,
    AUTOSCALING_RUNNER_SETS,
    EPHEMERAL_RUNNER_SETS,
    Controller,
    Informer,
    ObjectKey,
    Watches,
)
from shared.worker import SettingsError, WorkerContext, add_worker_arguments, load_worker_settings, run_worker

WORKER_NAME = "scale-set"
CONTROLLER_NAME = "autoscalingrunnerset"


def listener_owner_keys(al: AutoscalingListener) -> list[ObjectKey]:
    """An AL change wakes the ARS its spec names (it lives in another namespace: no owner ref)."""
    ns, name = al.spec.autoscaling_runner_set_namespace, al.spec.autoscaling_runner_set_name
    return [ObjectKey(ns, name)] if ns and name else []


def scale_set_setup(options: BuildOptions, *, verify_interval: float = 600.0, **reconciler_kw: Any):
    """The ``setup`` callable for ``run_worker`` / ``running_worker``."""

    def setup(ctx: WorkerContext) -> list[Controller]:
        reconciler = ScaleSetReconciler(
            ctx.reader,
            ctx.writer,
            ctx.events,
            ctx.actions,
            options,
            publish=ctx.bus.enqueue,
            registry=ctx.registry,
            verify_interval=verify_interval,
            **reconciler_kw,
        )
        ars = ctx.informers(AUTOSCALING_RUNNER_SETS)
        ers = ctx.informers(EPHEMERAL_RUNNER_SETS)
        listeners = Informer(ctx.kube, AUTOSCALING_LISTENERS, namespace=options.controller_namespace)
        controller = ctx.controller(
            CONTROLLER_NAME,
            reconciler.reconcile,
            [*ctx.for_(ars), *ctx.owns(ers, KIND_AUTOSCALING_RUNNER_SET), Watches(listeners, listener_owner_keys)],
        )
        # runner-set → scale-set: "revision N applied" (ERS name == ARS name) re-checks the Outdated guard.
        ctx.route(subjects.SCALE_SET_REVISIONS, controller)
        return [controller]

    return setup


# Environment fallbacks: runnerscale's names first, then the ones ARC's chart sets on its controller.
CONTROLLER_NAMESPACE_ENV = ("RUNNERSCALE_CONTROLLER_NAMESPACE", "CONTROLLER_MANAGER_POD_NAMESPACE")
LISTENER_IMAGE_ENV = ("RUNNERSCALE_LISTENER_IMAGE", "CONTROLLER_MANAGER_CONTAINER_IMAGE")


def _env(names: tuple[str, ...], environ: Any = None) -> str:
    env = os.environ if environ is None else environ
    return next((env[n] for n in names if env.get(n)), "")


def add_scale_set_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scale-set")
    group.add_argument(
        "--controller-namespace",
        default=None,
        help=f"namespace of the AutoscalingListeners (ARC's controller namespace) [env {' / '.join(CONTROLLER_NAMESPACE_ENV)}]",
    )
    group.add_argument(
        "--listener-image",
        default=None,
        help=f"container image of the listener pods [env {' / '.join(LISTENER_IMAGE_ENV)}]",
    )
    group.add_argument(
        "--listener-image-pull-secret",
        action="append",
        default=[],
        metavar="NAME",
        help="image pull Secret for listener pods (repeatable; ARC: --auto-scaler-image-pull-secrets)",
    )
    group.add_argument(
        "--exclude-label-propagation-prefix",
        action="append",
        default=[],
        metavar="PREFIX",
        help="ARS labels with this prefix are not copied to the ERS and listener (repeatable)",
    )
    group.add_argument(
        "--scale-set-verify-interval",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how often to check that the registered scale set still exists at the Actions service",
    )


class OptionsError(ValueError):
    """A scale-set flag is missing or invalid (exit code 2)."""


def options_from_args(args: argparse.Namespace, environ: Any = None) -> BuildOptions:
    """BuildOptions from flags, falling back to the environment; OptionsError names what is missing."""
    namespace = args.controller_namespace or _env(CONTROLLER_NAMESPACE_ENV, environ)
    image = args.listener_image or _env(LISTENER_IMAGE_ENV, environ)
    if not namespace or "/" in namespace:
        raise OptionsError(
            f"--controller-namespace (or {CONTROLLER_NAMESPACE_ENV[0]}) is required and must be a namespace name"
        )
    if not image:
        raise OptionsError(f"--listener-image (or {LISTENER_IMAGE_ENV[0]}) is required")
    if args.scale_set_verify_interval <= 0:
        raise OptionsError("--scale-set-verify-interval must be > 0")
    secrets: list[str] = []
    for item in args.listener_image_pull_secret:
        secrets.extend(s.strip() for s in item.split(",") if s.strip())
    return BuildOptions(
        controller_namespace=namespace,
        listener_image=image,
        image_pull_secrets=tuple(dict.fromkeys(secrets)),
        exclude_label_prefixes=tuple(args.exclude_label_propagation_prefix),
    )


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="runnerscale scale-set", description="runnerscale scale-set worker: reconciles AutoscalingRunnerSets"
    )
    add_worker_arguments(parser)
    add_scale_set_arguments(parser)
    args = parser.parse_args(list(argv))
    try:
        options = options_from_args(args)
        settings = load_worker_settings(args)
    except (OptionsError, SettingsError) as exc:
        print(f"runnerscale scale-set: {exc}", file=sys.stderr)
        return 2
    setup = scale_set_setup(options, verify_interval=args.scale_set_verify_interval)
    return anyio.run(run_worker, WORKER_NAME, settings, setup)
