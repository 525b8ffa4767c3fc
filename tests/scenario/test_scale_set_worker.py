"""The scale-set worker against the API emulator, a real nats-server and the Actions simulator.

No runner-set, runner or listener-pod worker runs here: ERS status is patched by hand where a
scenario needs one (as ARC's envtest suites do), so every assertion is about this worker alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
import yaml

from services.embedded.actions_sim.world import Seed
from services.scale_set.build import ars_listener_name
from services.scale_set.worker import WORKER, ScaleSetSettings
from shared.api import AutoscalingRunnerSet, AutoscalingRunnerSetStatus, OwnerReference, to_dict
from shared.api.constants import (
    ANNOTATION_RUNNER_GROUP_NAME,
    ANNOTATION_RUNNER_SCALE_SET_ID,
    ANNOTATION_RUNNER_SCALE_SET_NAME,
    FINALIZER_AUTOSCALING_RUNNER_SET,
    LABEL_ORGANIZATION,
)
from shared.bus import Bus, RevisionPublished, subjects
from shared.kube import (
    AUTOSCALING_LISTENERS,
    AUTOSCALING_RUNNER_SETS,
    EPHEMERAL_RUNNER_SETS,
    EVENTS,
    Invalid,
    ObjectKey,
)
from shared.worker import WorkerSettings, running_worker
from tests.fixtures.actions_sim import ActionsSim, start_actions_sim
from tests.fixtures.apiserver import KubeApi
from tests.scenario.conftest import Kube, create_secret, require_crds, wait_for

pytestmark = pytest.mark.anyio

DATA = Path(__file__).resolve().parents[1] / "data" / "arc"
LISTENER_IMAGE = "ghcr.io/example/runnerscale-listener:test"


def manifest(namespace: str, config_url: str, secret: str, *, name: str = "minimal", **spec: Any) -> dict[str, Any]:
    """tests/data/arc/ars-minimal.yaml (an ARC chart-shaped ARS) pointed at the simulator."""
    tree: dict[str, Any] = yaml.safe_load((DATA / "ars-minimal.yaml").read_text())
    tree["metadata"].update(name=name, namespace=namespace)
    tree["metadata"]["labels"] = {"app.kubernetes.io/version": "0.14.2", "team": "platform"}
    tree["spec"].update(
        githubConfigUrl=config_url,
        githubConfigSecret=secret,
        runnerScaleSetLabels=["linux", "x64"],
        minRunners=1,
        maxRunners=5,
    )
    tree["spec"].update(spec)
    return tree


@asynccontextmanager
async def scale_set_worker(
    worker_settings: Callable[..., Any], namespace: str, *, replica: str = "ss0", shards: int = 1, **kw: Any
) -> AsyncIterator[Any]:
    settings = ScaleSetSettings(controller_namespace=namespace, listener_image=LISTENER_IMAGE, **kw)
    async with running_worker(
        WORKER.name, worker_settings(replica, bus={"shards": shards}), WORKER.setup(settings)
    ) as w:
        await w.wait_ready()
        yield w


def metric(w: Any, name: str, **labels: str) -> float:
    """A sample of the worker's own Prometheus registry (what /metrics serves)."""
    return w.ctx.registry.get_sample_value(name, labels) or 0.0


async def get_ars(kube: Kube, key: ObjectKey) -> AutoscalingRunnerSet | None:
    return await kube.reader.get_or_none(AUTOSCALING_RUNNER_SETS, key)


async def settled(kube: Any, key: ObjectKey, *, phase: str = "Running") -> AutoscalingRunnerSet:
    """Wait until the worker has acted on the ARS's current generation."""

    async def check() -> AutoscalingRunnerSet | None:
        ars = await get_ars(kube, key)
        if (
            ars is not None
            and ars.status is not None
            and ars.status.observed_generation == ars.metadata.generation
            and ars.status.phase == phase
        ):
            return ars
        return None

    return await wait_for(check, timeout=20, what=f"ARS {key} acted upon, phase {phase}")


async def consistently(check: Callable[[], Any], *, seconds: float = 1.5, interval: float = 0.1) -> None:
    """Assert that ``check`` holds for ``seconds`` (the negative side of a guard)."""
    with anyio.move_on_after(seconds):
        while True:
            assert await check()
            await anyio.sleep(interval)


async def events_for(kube: Any, namespace: str, name: str) -> list[Any]:
    listed = await kube.reader.list(EVENTS, namespace=namespace)
    return [e for e in listed.items if e.involved_object.name == name]


async def patch_template_container(kube: Any, key: ObjectKey, **fields: Any) -> None:
    ars = await get_ars(kube, key)
    assert ars is not None
    template = to_dict(ars)["spec"]["template"]
    template["spec"]["containers"][0].update(fields)
    await kube.edit(AUTOSCALING_RUNNER_SETS, key, {"spec": {"template": template}})


# --- registration and children -------------------------------------------------------------------


async def test_arc_manifest_registers_scale_set_and_creates_ers_and_listener(
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    await require_crds(kube)
    key = ObjectKey(namespace, "minimal")
    async with scale_set_worker(worker_settings, namespace):
        await kube.writer.create(AUTOSCALING_RUNNER_SETS, manifest(namespace, actions_sim.config_url(), github_secret))
        ars = await settled(kube, key)

        # Finalizer, registration annotations, URL labels.
        assert FINALIZER_AUTOSCALING_RUNNER_SET in ars.metadata.finalizers
        scale_set_id = int(ars.metadata.annotations[ANNOTATION_RUNNER_SCALE_SET_ID])
        assert ars.metadata.annotations[ANNOTATION_RUNNER_SCALE_SET_NAME] == "minimal"
        assert ars.metadata.annotations[ANNOTATION_RUNNER_GROUP_NAME].lower() == "default"
        assert ars.metadata.labels[LABEL_ORGANIZATION] == actions_sim.org
        assert ars.spec.runner_scale_set_name == ""  # the defaulted name is not written into the user's spec

        # The scale set exists at the service with ARC's labels (name first, then the extra labels).
        sets = await actions_sim.control.scale_sets()
        assert [(s.id, s.name, s.labels, s.runner_group_id) for s in sets] == [
            (scale_set_id, "minimal", ["minimal", "linux", "x64"], 1)
        ]

        # ERS at revision 1, owned by the ARS, pointing at the scale set.
        ers = await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)
        assert ers.spec.actionable_revision == 1
        assert ers.spec.ephemeral_runner_spec.runner_scale_set_id == scale_set_id
        assert cast(OwnerReference, ers.metadata.controller_reference()).uid == ars.metadata.uid
        assert ers.spec.ephemeral_runner_spec.spec["containers"][0]["image"] == "ghcr.io/actions/actions-runner:latest"

        # Listener in the controller namespace with ARC's spec fields.
        al = await kube.reader.get(AUTOSCALING_LISTENERS, ObjectKey(namespace, ars_listener_name(ars)))
        assert (
            al.spec.autoscaling_runner_set_namespace,
            al.spec.autoscaling_runner_set_name,
            al.spec.ephemeral_runner_set_name,
        ) == (namespace, "minimal", "minimal")
        assert (al.spec.runner_scale_set_id, al.spec.min_runners, al.spec.max_runners, al.spec.image) == (
            scale_set_id,
            1,
            5,
            LISTENER_IMAGE,
        )
        assert al.spec.github_config_secret == github_secret

        # No-op stability: a webhook's label on the ERS and a metadata-only change of the ARS
        # reconcile again without touching the children (subset check, no patch loop).
        ers = await kube.edit(
            EPHEMERAL_RUNNER_SETS,
            key,
            {
                "metadata": {
                    "labels": {"webhook.example.com/injected": "yes"},
                    "annotations": {"example.com/foreign": "x"},
                }
            },
        )
        ers_rv, al_rv = ers.metadata.resource_version, al.metadata.resource_version
        await kube.edit(AUTOSCALING_RUNNER_SETS, key, {"metadata": {"annotations": {"example.com/touch": "1"}}})

        async def unchanged() -> bool:
            e = await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)
            a = await kube.reader.get(AUTOSCALING_LISTENERS, AUTOSCALING_LISTENERS.key_of(al))
            return e.metadata.resource_version == ers_rv and a.metadata.resource_version == al_rv

        await consistently(unchanged)
        assert len(await actions_sim.control.scale_sets()) == 1


# --- the actionable revision -----------------------------------------------------------------------


async def test_noop_reencoding_keeps_revision_and_image_change_bumps_once(
    kube: Kube,
    bus: Bus,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    key = ObjectKey(namespace, "minimal")
    async with scale_set_worker(worker_settings, namespace) as w:
        await kube.writer.create(AUTOSCALING_RUNNER_SETS, manifest(namespace, actions_sim.config_url(), github_secret))
        ars = await settled(kube, key)
        ers = await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)
        al_key = ObjectKey(namespace, ars_listener_name(ars))
        al = await kube.reader.get(AUTOSCALING_LISTENERS, al_key)

        # A template re-encoded with explicit empties: generation moves, the runner spec does not.
        await patch_template_container(kube, key, env=[], volumeMounts=[], resources={})
        ars2 = await wait_for(
            lambda: _acted_on_new_generation(kube, key, ars.metadata.generation), what="re-encoded template acted upon"
        )
        assert ars2.metadata.generation > ars.metadata.generation
        ers_now = await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)
        assert ers_now.spec.actionable_revision == 1
        assert ers_now.metadata.resource_version == ers.metadata.resource_version

        # An image change: exactly one bump, the same ERS and listener objects (no teardown).
        await patch_template_container(kube, key, image="ghcr.io/actions/actions-runner:2.330.0")
        await wait_for(
            lambda: _acted_on_new_generation(kube, key, ars2.metadata.generation), what="image change acted upon"
        )
        ers_new = await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)
        assert ers_new.spec.actionable_revision == 2
        assert (
            ers_new.spec.ephemeral_runner_spec.spec["containers"][0]["image"]
            == "ghcr.io/actions/actions-runner:2.330.0"
        )
        assert ers_new.metadata.uid == ers.metadata.uid
        al_new = await kube.reader.get(AUTOSCALING_LISTENERS, al_key)
        assert (
            al_new.metadata.uid == al.metadata.uid and al_new.metadata.resource_version == al.metadata.resource_version
        )

        async def revision_stays() -> bool:
            return (await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)).spec.actionable_revision == 2

        await consistently(revision_stays)
        assert metric(w, "runnerscale_scale_set_revision_bumps_total") == 1

        # RevisionPublished appears on the bus for revision 2.
        subject = subjects.revision_published_subject(namespace, "minimal")

        async def published() -> Any:
            msg = await bus.last_message(subject)
            return msg if isinstance(msg, RevisionPublished) and msg.revision == 2 else None

        msg = await wait_for(published, what="RevisionPublished(revision=2)")
        assert (msg.ers.namespace, msg.ers.name) == (namespace, "minimal")


async def _acted_on_new_generation(kube: Any, key: ObjectKey, old_generation: int) -> AutoscalingRunnerSet | None:
    ars = await get_ars(kube, key)
    if (
        ars
        and ars.metadata.generation > old_generation
        and ars.status
        and ars.status.observed_generation == ars.metadata.generation
        and ars.status.phase == "Running"
    ):
        return ars
    return None


async def test_min_max_change_patches_the_listener_in_place(
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    """ARC deletes and re-creates the listener on any listener spec change; runnerscale patches it."""
    key = ObjectKey(namespace, "minimal")
    async with scale_set_worker(worker_settings, namespace):
        await kube.writer.create(AUTOSCALING_RUNNER_SETS, manifest(namespace, actions_sim.config_url(), github_secret))
        ars = await settled(kube, key)
        al_key = ObjectKey(namespace, ars_listener_name(ars))
        al = await kube.reader.get(AUTOSCALING_LISTENERS, al_key)
        ers = await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)
        await kube.edit(AUTOSCALING_RUNNER_SETS, key, {"spec": {"maxRunners": 20, "minRunners": 2}})
        await wait_for(
            lambda: _acted_on_new_generation(kube, key, ars.metadata.generation), what="min/max change acted upon"
        )
        al_new = await kube.reader.get(AUTOSCALING_LISTENERS, al_key)
        assert al_new.metadata.uid == al.metadata.uid
        assert (al_new.spec.min_runners, al_new.spec.max_runners) == (2, 20)
        ers_new = await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)
        assert ers_new.metadata.resource_version == ers.metadata.resource_version  # not a runner spec change


# --- the Outdated guard -----------------------------------------------------------------


async def test_outdated_guard_waits_for_applied_revision_then_parks(
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    key = ObjectKey(namespace, "minimal")
    async with scale_set_worker(worker_settings, namespace):
        await kube.writer.create(AUTOSCALING_RUNNER_SETS, manifest(namespace, actions_sim.config_url(), github_secret))
        ars = await settled(kube, key)
        al_key = ObjectKey(namespace, ars_listener_name(ars))
        # The desired-state flow had scaled the set up.
        await kube.edit(EPHEMERAL_RUNNER_SETS, key, {"spec": {"replicas": 3, "patchID": 7}})

        # Outdated, but the runner-set worker has not applied the current revision yet: hold.
        status = {
            "currentReplicas": 1,
            "pendingEphemeralRunners": 0,
            "runningEphemeralRunners": 0,
            "failedEphemeralRunners": 0,
            "phase": "Outdated",
            "appliedActionableRevision": 0,
        }
        await kube.edit(EPHEMERAL_RUNNER_SETS, key, {"status": status}, status=True)

        async def still_serving() -> bool:
            a = await kube.reader.get_or_none(AUTOSCALING_LISTENERS, al_key)
            e = await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)
            s = await get_ars(kube, key)
            return (
                a is not None
                and not a.metadata.is_deleting
                and e.spec.replicas == 3
                and cast(AutoscalingRunnerSetStatus, cast(AutoscalingRunnerSet, s).status).phase == "Running"
            )

        await wait_for(lambda: _ars_current_runners(kube, key, 1), what="ERS status seen by the worker")
        await consistently(still_serving)

        # Applied caught up with the spec revision: the verdict is about the current spec → park.
        await kube.edit(EPHEMERAL_RUNNER_SETS, key, {"status": {**status, "appliedActionableRevision": 1}}, status=True)
        await settled(kube, key, phase="Outdated")
        await wait_for(lambda: _gone(kube, AUTOSCALING_LISTENERS, al_key), what="listener deleted")
        ers = await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)
        assert (ers.spec.replicas, ers.spec.patch_id) == (0, 0)  # drained, not deleted
        assert ers.metadata.uid == (await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)).metadata.uid
        await wait_for(lambda: _events_with(kube, namespace, "minimal", "RunnerOutdated"), what="RunnerOutdated event")

        # A runner spec change un-parks: new revision, applied lags, listener back.
        await patch_template_container(kube, key, image="ghcr.io/actions/actions-runner:2.331.0")
        await settled(kube, key, phase="Running")
        assert (await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)).spec.actionable_revision == 2
        await wait_for(lambda: kube.reader.get_or_none(AUTOSCALING_LISTENERS, al_key), what="listener recreated")


async def _ars_current_runners(kube: Any, key: ObjectKey, n: int) -> bool:
    ars = await get_ars(kube, key)
    return bool(ars and ars.status and ars.status.current_runners == n)


async def _gone(kube: Any, resource: Any, key: ObjectKey) -> bool:
    return await kube.reader.get_or_none(resource, key) is None


# --- runner group change -----------------------------------------------------------------------------


async def test_runner_group_change_updates_the_service_and_moves_the_listener(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    sim = start_actions_sim(seed=Seed(runner_groups=["team-a", "team-b"]))
    try:
        await create_secret(kube, namespace, "gh", {"github_token": sim.pat})
        key = ObjectKey(namespace, "grouped")
        async with scale_set_worker(worker_settings, namespace):
            await kube.writer.create(
                AUTOSCALING_RUNNER_SETS,
                manifest(namespace, sim.config_url(), "gh", name="grouped", runnerGroup="team-a"),
            )
            ars = await settled(kube, key)
            assert ars.metadata.annotations[ANNOTATION_RUNNER_GROUP_NAME] == "team-a"
            [scale_set] = await sim.control.scale_sets()
            assert scale_set.runner_group_id == 2
            old_listener = ObjectKey(namespace, ars_listener_name(ars))

            fresh = await get_ars(kube, key)
            assert fresh is not None
            await kube.edit(AUTOSCALING_RUNNER_SETS, key, {"spec": {"runnerGroup": "team-b"}})
            ars = await wait_for(
                lambda: _acted_on_new_generation(kube, key, fresh.metadata.generation), what="group change acted upon"
            )
            assert ars.metadata.annotations[ANNOTATION_RUNNER_GROUP_NAME] == "team-b"
            [moved] = await sim.control.scale_sets()
            assert (moved.id, moved.runner_group_id) == (scale_set.id, 3)  # updated in place, not re-created
            # The listener name hashes the runner group: the old listener is removed (ARC orphans it).
            new_listener = ObjectKey(namespace, ars_listener_name(ars))
            assert new_listener != old_listener
            assert await kube.reader.get_or_none(AUTOSCALING_LISTENERS, new_listener) is not None
            await wait_for(lambda: _gone(kube, AUTOSCALING_LISTENERS, old_listener), what="old listener deleted")
    finally:
        sim.stop()


# --- deletion ------------------------------------------------------------------------------------------


async def test_delete_removes_listener_ers_scale_set_then_finalizer(
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    key = ObjectKey(namespace, "minimal")
    async with scale_set_worker(worker_settings, namespace):
        await kube.writer.create(AUTOSCALING_RUNNER_SETS, manifest(namespace, actions_sim.config_url(), github_secret))
        ars = await settled(kube, key)
        al_key = ObjectKey(namespace, ars_listener_name(ars))
        assert len(await actions_sim.control.scale_sets()) == 1
        await kube.writer.delete(AUTOSCALING_RUNNER_SETS, key)
        await wait_for(lambda: _gone(kube, AUTOSCALING_RUNNER_SETS, key), what="ARS gone (finalizer removed)")
        assert await kube.reader.get_or_none(AUTOSCALING_LISTENERS, al_key) is None
        assert await kube.reader.get_or_none(EPHEMERAL_RUNNER_SETS, key) is None
        assert await actions_sim.control.scale_sets() == []


# --- optimistic locking ------------------------------------------------------------------------------


async def test_conflict_on_ers_patch_rereads_and_converges(
    kube_api: KubeApi,
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    control = kube_api.require_emulator()
    key = ObjectKey(namespace, "minimal")
    async with scale_set_worker(worker_settings, namespace) as w:
        await kube.writer.create(AUTOSCALING_RUNNER_SETS, manifest(namespace, actions_sim.config_url(), github_secret))
        ars = await settled(kube, key)
        await control.add_fault_async(
            action="error", code=409, verb="patch", resource="ephemeralrunnersets", namespace=namespace, times=2
        )
        await patch_template_container(kube, key, image="ghcr.io/actions/actions-runner:2.330.0")
        await wait_for(
            lambda: _acted_on_new_generation(kube, key, ars.metadata.generation),
            what="image change acted upon despite 409s",
        )
        ers = await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)
        assert ers.spec.actionable_revision == 2  # bumped once, not once per attempt
        assert ers.spec.ephemeral_runner_spec.spec["containers"][0]["image"] == "ghcr.io/actions/actions-runner:2.330.0"
        # the 409s ran before the write that acted on the new generation; a wait, not a read, so a
        # counter bumped by a trailing pass is not a race either
        await wait_for(
            lambda: metric(w, "runnerscale_controller_conflicts_total", controller=WORKER.controller) >= 2,
            what="two conflicts counted",
        )


# --- invalid input -----------------------------------------------------------------------------------


async def test_invalid_manifest_gets_an_event_and_no_service_call(
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    key = ObjectKey(namespace, "broken")
    async with scale_set_worker(worker_settings, namespace) as w:
        await actions_sim.control.clear_requests()
        bad = manifest(
            namespace,
            actions_sim.config_url() + "/repo/extra",
            github_secret,
            name="broken",
            minRunners=9,
            maxRunners=2,
        )
        await kube.writer.create(AUTOSCALING_RUNNER_SETS, bad)

        async def warned() -> Any:
            return [e for e in await events_for(kube, namespace, "broken") if e.reason == "InvalidSpec"]

        [event] = await wait_for(warned, what="InvalidSpec event")
        assert event.type == "Warning" and "githubConfigUrl" in event.message and "minRunners" in event.message
        ars = await wait_for(lambda: _with_phase(kube, key, "Invalid"), what="status Invalid")
        assert ars.status is not None and ars.status.conditions is not None
        assert ars.status.observed_generation == 0
        [condition] = ars.status.conditions
        assert (condition.type, condition.status, condition.reason) == ("SpecValid", "False", "InvalidSpec")
        assert "minRunners" in condition.message and condition.observed_generation == ars.metadata.generation
        assert await kube.reader.get_or_none(EPHEMERAL_RUNNER_SETS, key) is None
        assert await actions_sim.control.requests() == []
        assert metric(w, "runnerscale_scale_set_invalid_total") >= 1
        # Fixed: the condition goes, the set runs.
        await kube.edit(
            AUTOSCALING_RUNNER_SETS, key, {"spec": {"githubConfigUrl": actions_sim.config_url(), "minRunners": 1}}
        )
        fixed = await settled(kube, key)
        assert fixed.status is not None
        assert not fixed.status.conditions


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "bad-" + "x" * 60}, "metadata.name"),
        ({"maxRunners": 1_000_000_000_000}, "spec.maxRunners"),
        ({"minRunners": 2_147_483_648}, "spec.minRunners"),
    ],
)
async def test_crd_schema_refuses_what_no_component_accepts(
    kube: Kube, namespace: str, github_secret: str, change: dict[str, Any], field: str
) -> None:
    """Names become label values (<= 63) and runner counts int32 everywhere: refused at the door,
    never half-accepted (an ARS that says Running but whose listener can never start)."""
    await require_crds(kube)
    change = dict(change)  # the parameter is shared by the [emulator] and [real] runs: never mutate it
    name = change.pop("name", "huge")
    tree = manifest(namespace, "https://github.com/org", github_secret, name=name, **change)
    with pytest.raises(Invalid) as refused:
        await kube.writer.create(AUTOSCALING_RUNNER_SETS, tree)
    assert field in str(refused.value)


async def test_ars_with_an_over_long_name_stored_earlier_is_reported_and_deletes(
    kube_api: KubeApi,
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    """An ARS stored before the CRD bounded names (label values max 63): reported on the ARS, and its
    deletion completes (cleanup never lists with a label selector the API server refuses)."""
    kube_api.require_emulator("storing an object the current CRD schema refuses")
    name = "bad-" + "x" * 60
    key = ObjectKey(namespace, name)

    def schema_of(emu: Any) -> dict[str, Any]:
        rt = emu.api.registry.lookup("actions.github.com", "v1alpha1", "autoscalingrunnersets")
        return rt.schema["properties"]["metadata"]  # type: ignore[no-any-return]

    metadata_schema = kube_api.call(lambda emu: dict(schema_of(emu)))
    kube_api.call(lambda emu: schema_of(emu).pop("properties", None))
    try:
        await kube.writer.create(
            AUTOSCALING_RUNNER_SETS, manifest(namespace, actions_sim.config_url(), github_secret, name=name)
        )
    finally:
        kube_api.call(lambda emu: schema_of(emu).update(metadata_schema))
    async with scale_set_worker(worker_settings, namespace):
        ars = await wait_for(lambda: _with_phase(kube, key, "Invalid"), what="status Invalid")
        assert ars.status is not None and ars.status.conditions is not None
        assert "63" in ars.status.conditions[0].message
        assert FINALIZER_AUTOSCALING_RUNNER_SET in ars.metadata.finalizers
        await kube.writer.delete(AUTOSCALING_RUNNER_SETS, key)
        await wait_for(lambda: _gone(kube, AUTOSCALING_RUNNER_SETS, key), what="over-long ARS deleted")


async def test_missing_secret_gets_an_event_and_recovers_when_created(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings], actions_sim: ActionsSim
) -> None:
    key = ObjectKey(namespace, "nosecret")
    async with scale_set_worker(worker_settings, namespace, credentials_requeue=0.5):
        await kube.writer.create(
            AUTOSCALING_RUNNER_SETS, manifest(namespace, actions_sim.config_url(), "later", name="nosecret")
        )

        async def warned() -> Any:
            return [e for e in await events_for(kube, namespace, "nosecret") if e.reason == "CredentialsUnavailable"]

        [event] = await wait_for(warned, what="CredentialsUnavailable event")
        assert "later" in event.message and actions_sim.pat not in event.message
        assert await actions_sim.control.scale_sets() == []
        await create_secret(kube, namespace, "later", {"github_token": actions_sim.pat})
        await settled(kube, key)
        assert len(await actions_sim.control.scale_sets()) == 1


async def _with_phase(kube: Any, key: ObjectKey, phase: str) -> AutoscalingRunnerSet | None:
    ars = await get_ars(kube, key)
    return ars if ars and ars.status and ars.status.phase == phase else None


# --- re-registration (a stale scale set id is a permanent outage in ARC) ----------


async def test_scale_set_deleted_at_the_service_is_re_registered(
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    key = ObjectKey(namespace, "minimal")
    async with scale_set_worker(worker_settings, namespace, verify_interval=0.5):
        await kube.writer.create(AUTOSCALING_RUNNER_SETS, manifest(namespace, actions_sim.config_url(), github_secret))
        ars = await settled(kube, key)
        old_id = int(ars.metadata.annotations[ANNOTATION_RUNNER_SCALE_SET_ID])
        await actions_sim.control.delete_scale_set(old_id)

        async def re_registered() -> Any:
            a = await get_ars(kube, key)
            assert a is not None
            new = int(a.metadata.annotations.get(ANNOTATION_RUNNER_SCALE_SET_ID, "0"))
            return new if new not in (0, old_id) else None

        new_id = await wait_for(re_registered, what="new scale set id")
        assert [s.id for s in await actions_sim.control.scale_sets()] == [new_id]

        async def children_follow() -> bool:
            e = await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)
            a = await kube.reader.get(AUTOSCALING_LISTENERS, ObjectKey(namespace, ars_listener_name(ars)))
            return (
                e.spec.ephemeral_runner_spec.runner_scale_set_id == new_id
                and e.spec.actionable_revision == 2
                and a.spec.runner_scale_set_id == new_id
            )

        await wait_for(children_follow, what="ERS and listener point at the new scale set")


# --- horizontal scale ----------------------------------------------------------------------


async def test_two_replicas_register_each_scale_set_once_and_survive_a_crash(
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    names = ["set-a", "set-b", "set-c", "set-d"]
    async with (
        scale_set_worker(worker_settings, namespace, replica="a", shards=4) as a,
        scale_set_worker(worker_settings, namespace, replica="b", shards=4) as b,
    ):
        for n in names:
            await kube.writer.create(
                AUTOSCALING_RUNNER_SETS, manifest(namespace, actions_sim.config_url(), github_secret, name=n)
            )
        for n in names:
            await settled(kube, ObjectKey(namespace, n))
        sets = await actions_sim.control.scale_sets()
        assert sorted(s.name for s in sets) == names  # one registration per ARS, no duplicates

        a.kill()  # a crash: a's shards move to b once their leases expire
        for n in names:
            await patch_template_container(kube, ObjectKey(namespace, n), image="ghcr.io/actions/actions-runner:9.9.9")
        for n in names:
            await settled(kube, ObjectKey(namespace, n))

        async def all_at_revision_two() -> bool:
            for n in names:
                ers = await kube.reader.get(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, n))
                if ers.spec.actionable_revision != 2:
                    return False
            return True

        await wait_for(all_at_revision_two, timeout=30, what="every ERS at revision 2 after the takeover")
        assert len(b.ctx.shards.owned_shards()) == 4
        assert sorted(s.name for s in await actions_sim.control.scale_sets()) == names


# --- dependencies that fail ----------------------------------------------------------------------------


async def test_unknown_runner_group_gets_an_event_and_no_scale_set(
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    async with scale_set_worker(worker_settings, namespace):
        await kube.writer.create(
            AUTOSCALING_RUNNER_SETS,
            manifest(namespace, actions_sim.config_url(), github_secret, name="nogroup", runnerGroup="does-not-exist"),
        )

        async def warned() -> Any:
            return [e for e in await events_for(kube, namespace, "nogroup") if e.reason == "RunnerGroupNotFound"]

        await wait_for(warned, what="RunnerGroupNotFound event")
        assert await actions_sim.control.scale_sets() == []
        assert (await _with_phase(kube, ObjectKey(namespace, "nogroup"), "Pending")) is not None


async def test_service_error_is_reported_and_retried(
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    key = ObjectKey(namespace, "minimal")
    await actions_sim.control.set_fault("get_scale_set_by_name", kind="status", status=400, count=2)
    async with scale_set_worker(worker_settings, namespace):
        await kube.writer.create(AUTOSCALING_RUNNER_SETS, manifest(namespace, actions_sim.config_url(), github_secret))
        ars = await settled(kube, key)
        assert int(ars.metadata.annotations[ANNOTATION_RUNNER_SCALE_SET_ID]) > 0
        events = await wait_for(
            lambda: _events_with(kube, namespace, "minimal", "ActionsServiceError"), what="ActionsServiceError event"
        )
        assert events[0].type == "Warning" and actions_sim.pat not in events[0].message
        assert len(await actions_sim.control.scale_sets()) == 1


async def test_child_rejected_by_the_api_server_is_an_event_not_a_crash_loop(
    kube_api: KubeApi,
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    control = kube_api.require_emulator()
    key = ObjectKey(namespace, "minimal")
    await control.add_fault_async(
        action="error", code=422, verb="create", resource="ephemeralrunnersets", namespace=namespace, times=1
    )
    async with scale_set_worker(worker_settings, namespace, credentials_requeue=0.5):
        await kube.writer.create(AUTOSCALING_RUNNER_SETS, manifest(namespace, actions_sim.config_url(), github_secret))

        async def rejected() -> Any:
            return [e for e in await events_for(kube, namespace, "minimal") if e.reason == "ChildRejected"]

        [event] = await wait_for(rejected, what="ChildRejected event")
        assert event.type == "Warning" and "ephemeralrunnersets" in event.message
        await settled(kube, key)  # the next attempt (slow requeue) succeeds
        assert (await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)).spec.actionable_revision == 1


async def _events_with(kube: Kube, namespace: str, name: str, reason: str) -> list[Any]:
    return [e for e in await events_for(kube, namespace, name) if e.reason == reason]


async def test_worker_dying_between_ers_spec_and_status_writes_moves_the_revision_by_one(
    kube_api: KubeApi,
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    """Issue #14 item 4 (seeds 001/003: the status is written last, so a crash redoes the work
    without repeating it): a worker writes the ERS spec (revision + 1) and never gets its ARS status
    written (every status write fails), then stops. The next worker finds the ERS spec already
    semantically equal to the template and does not bump again: the revision moved by exactly one."""
    control = kube_api.require_emulator()
    key = ObjectKey(namespace, "minimal")
    async with scale_set_worker(worker_settings, namespace):
        await kube.writer.create(AUTOSCALING_RUNNER_SETS, manifest(namespace, actions_sim.config_url(), github_secret))
        ars = await settled(kube, key)
    before = (await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)).spec.actionable_revision
    # The phase is already Pending (as a previous pass leaves it), so the only status write the
    # next pass makes is the last one, after the ERS spec.
    await kube.writer.patch_status(
        AUTOSCALING_RUNNER_SETS, key, {"status": {"phase": "Pending"}}, resource_version=ars.metadata.resource_version
    )
    await patch_template_container(kube, key, image="ghcr.io/actions/actions-runner:2.331.0")
    await control.add_fault_async(
        action="error",
        code=500,
        verb="patch",
        resource="autoscalingrunnersets",
        subresource="status",
        namespace=namespace,
        times=0,
    )

    async def revision_is(n: int) -> bool:
        return (await kube.reader.get(EPHEMERAL_RUNNER_SETS, key)).spec.actionable_revision == n

    async with scale_set_worker(worker_settings, namespace, replica="ss1"):
        await wait_for(lambda: revision_is(before + 1), what="ERS spec written with the next revision")
        current = await get_ars(kube, key)
        assert current is not None and current.status is not None
        assert current.status.observed_generation == ars.metadata.generation  # its status write never landed
    await control.clear_faults_async()
    async with scale_set_worker(worker_settings, namespace, replica="ss2"):
        acted = await settled(kube, key)
        assert acted.metadata.generation == ars.metadata.generation + 1
        await consistently(lambda: revision_is(before + 1), seconds=1.0)
