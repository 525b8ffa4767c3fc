"""``runnerscale adopt --dry-run``: what switching a cluster from Go ARC to runnerscale changes,
object by object (README "Switching from ARC"). Read-only: it only GETs and LISTs.

The switch itself needs no command: the scale-set and runner-set workers adopt ARC's objects
on their own (services/scale_set/adopt.py), so a crash or a restart half-way simply resumes.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import anyio

from services.scale_set import adopt
from services.scale_set.build import BuildOptions, desired_ephemeral_runner_set, desired_listener
from shared.api import AutoscalingListener, AutoscalingRunnerSet
from shared.api.constants import LABEL_SCALE_SET_NAME, LABEL_SCALE_SET_NAMESPACE
from shared.kube import (
    AUTOSCALING_LISTENERS,
    AUTOSCALING_RUNNER_SETS,
    EPHEMERAL_RUNNER_SETS,
    EPHEMERAL_RUNNERS,
    PODS,
    ApiReader,
    Forbidden,
    KubeClient,
)
from shared.kube.client import user_agent_for

TIMEOUT = 30.0  # seconds for each request


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="runnerscale adopt",
        description="Print what runnerscale's workers change when they take over what Go ARC left "
        "(AutoscalingRunnerSets, EphemeralRunnerSets, EphemeralRunners, AutoscalingListeners).",
    )
    p.add_argument("--dry-run", action="store_true", help="required: print the changes, write nothing")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig path (default: $KUBECONFIG / ~/.kube/config)")
    p.add_argument("--kube-context", default=None, help="kubeconfig context")
    p.add_argument(
        "--controller-namespace",
        required=True,
        help="namespace of the AutoscalingListeners (ARC's controller namespace)",
    )
    p.add_argument(
        "--namespace", action="append", default=[], help="only AutoscalingRunnerSets in this namespace (repeatable)"
    )
    p.add_argument("--listener-image", default="", help="runnerscale's listener image (default: leave the image out)")
    p.add_argument(
        "--exclude-label-propagation-prefix", action="append", default=[], help="as the scale-set worker's flag"
    )
    return p


def _mine(al: AutoscalingListener, ars: AutoscalingRunnerSet) -> bool:
    by_spec = (al.spec.autoscaling_runner_set_namespace, al.spec.autoscaling_runner_set_name)
    by_label = (al.metadata.labels.get(LABEL_SCALE_SET_NAMESPACE), al.metadata.labels.get(LABEL_SCALE_SET_NAME))
    want = (ars.metadata.namespace, ars.metadata.name)
    return want in (by_spec, by_label)


async def preview(args: argparse.Namespace) -> list[str]:
    """The dry run's lines: per ARS a header, then one line per change."""
    async with await KubeClient.connect(
        args.kubeconfig, context=args.kube_context, request_timeout=TIMEOUT, user_agent=user_agent_for("adopt")
    ) as client:
        reader = ApiReader(client)
        namespaces: Sequence[str | None] = args.namespace or [None]
        sets_all = []
        runners_all = []
        ars_all: list[AutoscalingRunnerSet] = []
        for ns in namespaces:
            ars_all += (await reader.list(AUTOSCALING_RUNNER_SETS, namespace=ns)).items
            sets_all += (await reader.list(EPHEMERAL_RUNNER_SETS, namespace=ns)).items
            runners_all += (await reader.list(EPHEMERAL_RUNNERS, namespace=ns)).items
        listeners = (await reader.list(AUTOSCALING_LISTENERS, namespace=args.controller_namespace)).items
        pods = (await reader.list(PODS, namespace=args.controller_namespace)).items
        try:  # ARC's listeners in another namespace than runnerscale's controller namespace
            everywhere = (await reader.list(AUTOSCALING_LISTENERS, namespace=None)).items
            elsewhere_note = ""
        except Forbidden:
            everywhere = []
            elsewhere_note = (
                "note: listing AutoscalingListeners cluster-wide is forbidden to these credentials: ARC listeners"
                f' outside {args.controller_namespace} are not shown (README "Switching from ARC", step 3)'
            )
    elsewhere = [al for al in everywhere if al.metadata.namespace != args.controller_namespace]
    pod_annotations = {p.metadata.name: dict(p.metadata.annotations) for p in pods}
    lines: list[str] = []
    for ars in sorted(ars_all, key=lambda a: (a.metadata.namespace, a.metadata.name)):
        ns = ars.metadata.namespace
        mine = [al for al in listeners if _mine(al, ars)]
        image = args.listener_image or next((al.spec.image for al in mine), "") or "(listener image)"
        options = BuildOptions(
            controller_namespace=args.controller_namespace,
            listener_image=image,
            exclude_label_prefixes=tuple(args.exclude_label_propagation_prefix),
        )
        desired = desired_ephemeral_runner_set(ars, options, actionable_revision=1)
        sets = [e for e in sets_all if e.metadata.namespace == ns]
        runners = [r for r in runners_all if r.metadata.namespace == ns]
        changes = adopt.preview_runner_sets(ars, desired, sets, runners)
        changes += adopt.preview_listener(ars, desired_listener(ars, options), mine, pod_annotations)
        changes += adopt.preview_listeners_elsewhere(
            ars, [al for al in elsewhere if _mine(al, ars)], args.controller_namespace
        )
        lines.append(f"AutoscalingRunnerSet {ns}/{ars.metadata.name}:")
        lines += [c.line() for c in changes] or ["  nothing to take over"]
    if not ars_all:
        lines.append("no AutoscalingRunnerSet found")
    if elsewhere_note:
        lines.append(elsewhere_note)
    return lines


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not args.dry_run:
        print(
            "runnerscale adopt: only --dry-run exists; the scale-set and runner-set workers take ARC's "
            'objects over by themselves once ARC\'s controller is stopped (README "Switching from ARC")',
            file=sys.stderr,
        )
        return 2
    for line in anyio.run(preview, args):
        print(line)
    return 0
