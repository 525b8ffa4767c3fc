"""The way back to ARC (README "Switching from ARC", "The way back"): after runnerscale adopted
ARC 0.14's leftovers, its workers are stopped following the README's steps, and what remains must
have the shapes ARC 0.14's controllers require of the objects they find. ARC itself does not run
here: the table below states, per object, what ARC 0.14 reads (facts from its source), checked
against the very objects ARC wrote (tests/data/arc/takeover/arc-0.14.yaml).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from services.scale_set.adopt import ANNOTATION_CHANGE_HASH, ANNOTATION_RUNNER_SPEC_HASH
from shared.api.constants import ANNOTATION_INTEGRITY_HASH, ANNOTATION_VALUES_HASH
from shared.kube import (
    AUTOSCALING_LISTENERS,
    AUTOSCALING_RUNNER_SETS,
    EPHEMERAL_RUNNER_SETS,
    EPHEMERAL_RUNNERS,
    PODS,
    ObjectKey,
    Resource,
)
from shared.worker import WorkerSettings
from tests.fixtures.actions_sim import ActionsSim
from tests.scenario.conftest import Kube, require_crds, wait_for
from tests.scenario.runner_set_helpers import fake_runner_worker
from tests.scenario.test_arc_takeover import NAME, install_arc_leftovers, listener_pod_worker, workers

pytestmark = pytest.mark.anyio

#: ARC's drift fingerprints: their absence is what makes ARC roll the set once (README).
FINGERPRINTS = {ANNOTATION_RUNNER_SPEC_HASH, ANNOTATION_CHANGE_HASH, ANNOTATION_INTEGRITY_HASH, ANNOTATION_VALUES_HASH}
#: ARC 0.14's EphemeralRunnerSet finalizer (its name says "ephemeralrunner": ARC's own constant).
ARC_ERS_FINALIZER = "ephemeralrunner.actions.github.com/finalizer"
#: README, "The way back": the finalizer swap on the set named like the ARS.
WAY_BACK_ERS_PATCH = {"metadata": {"finalizers": [ARC_ERS_FINALIZER]}}

IDLE, BUSY = "arc-runner-set-m4n8p-runner-x2k7f", "arc-runner-set-m4n8p-runner-p8w3z"

#: (resource, name runnerscale leaves, ARC's object it stands for, parent kind, parent name).
#: ARC 0.14 requires of each: its finalizers (ARC removes only its own, so any other would block a
#: deletion forever); the labels and non-fingerprint annotations ARC wrote (the scale-set id and
#: names, the version label its controller filters on); a controller owner reference of the kind
#: and name its field indexers key on (an ERS is found by its ARS, a runner by its set).
TABLE: list[tuple[Resource[Any], str, str, str | None, str | None]] = [
    (AUTOSCALING_RUNNER_SETS, NAME, NAME, None, None),
    (EPHEMERAL_RUNNER_SETS, NAME, "arc-runner-set-m4n8p", "AutoscalingRunnerSet", NAME),
    (EPHEMERAL_RUNNERS, IDLE, IDLE, "EphemeralRunnerSet", NAME),
    (EPHEMERAL_RUNNERS, BUSY, BUSY, "EphemeralRunnerSet", NAME),
]


def shape_problems(live: Any, arc: Any, parent_kind: str | None, parent: Any) -> list[str]:
    """What ARC 0.14 would not accept in ``live``, measured against ARC's own ``arc`` object."""
    out = []
    name = f"{type(live).__name__}/{live.metadata.name}"
    if sorted(live.metadata.finalizers) != sorted(arc.metadata.finalizers):
        out.append(f"{name}: finalizers {live.metadata.finalizers}, ARC writes {arc.metadata.finalizers}")
    for k, v in arc.metadata.labels.items():
        if live.metadata.labels.get(k) != v:
            out.append(f"{name}: label {k}={live.metadata.labels.get(k)!r}, ARC wrote {v!r}")
    for k, v in arc.metadata.annotations.items():
        if k not in FINGERPRINTS and live.metadata.annotations.get(k) != v:
            out.append(f"{name}: annotation {k}={live.metadata.annotations.get(k)!r}, ARC wrote {v!r}")
    if parent_kind is not None:
        ref = live.metadata.controller_reference()
        if ref is None or (ref.kind, ref.name, ref.uid) != (parent_kind, parent.metadata.name, parent.metadata.uid):
            out.append(f"{name}: controller {ref}, ARC needs {parent_kind}/{parent.metadata.name}")
    return out


async def test_way_back_leaves_objects_arc_014_accepts(
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    await require_crds(kube)
    arc = await install_arc_leftovers(
        kube, "arc-0.14.yaml", namespace, actions_sim, github_secret, more=("arc-0.14-listener.yaml",)
    )
    ss, rs = workers(worker_settings, namespace)
    async with (
        rs as r,
        listener_pod_worker(worker_settings) as p,
        fake_runner_worker(kube, namespace, actions_sim, 0, register=False),
    ):
        await r.wait_ready()
        await p.wait_ready()
        async with ss as s:
            await s.wait_ready()

            async def taken_over() -> bool:
                ers = await kube.reader.get_or_none(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, NAME))
                latest = await kube.reader.get_or_none(
                    EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "arc-runner-set-m4n8p")
                )
                listeners = (await kube.reader.list(AUTOSCALING_LISTENERS, namespace=namespace)).items
                return (
                    ers is not None
                    and latest is None
                    and ers.status is not None
                    and ers.status.applied_actionable_revision == 1
                    and any(al.spec.ephemeral_runner_set_name == NAME for al in listeners)
                )

            await wait_for(taken_over, timeout=30, what="runnerscale took over")

        # The way back, step 1: the scale-set worker is stopped first (it would recreate them),
        # then runnerscale's listeners are deleted while the listener-pod worker still runs: it
        # stops their pods (ending their Actions sessions) and removes its finalizer.
        for al in (await kube.reader.list(AUTOSCALING_LISTENERS, namespace=namespace)).items:
            await kube.writer.delete(AUTOSCALING_LISTENERS, AUTOSCALING_LISTENERS.key_of(al))

        async def listeners_gone() -> bool:
            if (await kube.reader.list(AUTOSCALING_LISTENERS, namespace=namespace)).items:
                return False
            pods = (await kube.reader.list(PODS, namespace=namespace)).items
            return not any("listener" in p.metadata.name for p in pods)

        await wait_for(listeners_gone, timeout=30, what="runnerscale's listeners and their pods gone")
    # Step 2: every worker stopped (above). Step 3: the finalizer swap on the set.
    ers = await kube.reader.get(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, NAME))
    await kube.writer.patch_merge(
        EPHEMERAL_RUNNER_SETS,
        ObjectKey(namespace, NAME),
        WAY_BACK_ERS_PATCH,
        resource_version=ers.metadata.resource_version,
    )

    problems: list[str] = []
    for resource, name, arc_name, parent_kind, parent_name in TABLE:
        live = await kube.reader.get(resource, ObjectKey(namespace, name))
        parent = None
        if parent_kind is not None:
            parent_resource: Resource[Any] = (
                AUTOSCALING_RUNNER_SETS if parent_kind == "AutoscalingRunnerSet" else EPHEMERAL_RUNNER_SETS
            )
            assert parent_name is not None
            parent = await kube.reader.get(parent_resource, ObjectKey(namespace, parent_name))
        problems += shape_problems(live, arc[f"{resource.kind}/{arc_name}"], parent_kind, parent)
    # ARC's draining set, if its busy runner still runs: nothing but ARC's finalizer on it.
    draining = await kube.reader.get_or_none(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "arc-runner-set-7xk2q"))
    if draining is not None and not set(draining.metadata.finalizers) <= {ARC_ERS_FINALIZER}:
        problems.append(f"EphemeralRunnerSet/arc-runner-set-7xk2q: finalizers {draining.metadata.finalizers}")
    # The scale set ARC re-attaches to is the one it created (same id: no second registration).
    ars = await kube.reader.get(AUTOSCALING_RUNNER_SETS, ObjectKey(namespace, NAME))
    assert ars.metadata.uid == arc[f"AutoscalingRunnerSet/{NAME}"].metadata.uid
    assert not problems, "\n".join(problems)
