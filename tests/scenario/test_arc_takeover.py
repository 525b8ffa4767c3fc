"""Switching from Go ARC in place (README "Switching from ARC"): ARC's objects, shaped exactly as
ARC 0.14.2 and the integrity-hash era write them (tests/data/arc/takeover/), are created while no
worker runs ("ARC stopped"); then the scale-set and runner-set workers start ("runnerscale
started") against the Actions simulator. A stand-in for the runner worker only strips the
finalizers of deleting runners (no kubelet here, as in ARC's envtest suites).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import anyio
import msgspec
import pytest
import yaml

from services.runner_set.failures import FailurePolicy
from services.runner_set.worker import WORKER as RUNNER_SET
from services.scale_set.build import ars_listener_name
from services.scale_set.worker import WORKER as SCALE_SET
from services.scale_set.worker import ScaleSetSettings
from shared.actions import ActionsClient, PersonalAccessToken
from shared.api import OwnerReference
from shared.api.constants import ANNOTATION_ACTIONABLE_REVISION, FINALIZER_EPHEMERAL_RUNNER_SET
from shared.api.names import listener_name
from shared.kube import (
    AUTOSCALING_LISTENERS,
    AUTOSCALING_RUNNER_SETS,
    EPHEMERAL_RUNNER_SETS,
    EPHEMERAL_RUNNERS,
    PODS,
    ROLE_BINDINGS,
    ROLES,
    SECRETS,
    SERVICE_ACCOUNTS,
    ObjectKey,
    Resource,
)
from shared.worker import WorkerSettings, running_worker
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.apiserver import KubeApi
from tests.scenario.conftest import Kube, require_crds, wait_for
from tests.scenario.runner_set_helpers import fake_runner_worker, runners, sim_scale_set

pytestmark = pytest.mark.anyio

DATA = Path(__file__).resolve().parents[1] / "data" / "arc" / "takeover"
ARC_HASHES = ("actions.github.com/runner-spec-hash", "actions.github.com/integrity-hash")
NAME = "arc-runner-set"


async def install_arc_leftovers(
    kube: Any,
    fixture: str,
    namespace: str,
    actions_sim: Any,
    secret: str,
    *,
    listener_hash_of_url: bool = False,
    more: tuple[str, ...] = (),
    jits: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Create the fixture's objects as ARC left them: ids, URL, secret and namespaces pointed at
    this test; owner uids remapped to the ones the API server assigns; runners registered at the
    simulator (their ids in the status; their JIT configs into ``jits``, to play them); sets ARC
    was deleting deleted. Returns kind/name → object."""
    scale_set_id = await sim_scale_set(actions_sim, NAME)
    text = "\n---\n".join((DATA / name).read_text() for name in (fixture, *more))
    text = text.replace("https://github.com/octo-org/octo-repo", actions_sim.config_url())
    text = text.replace("arc-runner-set-gha-rs-github-secret", secret)
    text = text.replace("runnerScaleSetId: 17", f"runnerScaleSetId: {scale_set_id}")
    text = text.replace('runner-scale-set-id: "17"', f'runner-scale-set-id: "{scale_set_id}"')
    text = text.replace("arc-runners", namespace).replace("arc-systems", namespace)
    docs = [d for d in yaml.safe_load_all(text) if d]
    if listener_hash_of_url:  # the integrity-hash era's name hashes the URL, which now is the simulator's
        for doc in docs:
            if doc["kind"] == "AutoscalingListener":
                doc["metadata"]["name"] = listener_name(NAME, namespace, "", actions_sim.config_url())
    uids: dict[str, str] = {}
    created: dict[str, Any] = {}
    deleting: list[Any] = []
    resources: dict[str, Resource[Any]] = {
        "AutoscalingRunnerSet": AUTOSCALING_RUNNER_SETS,
        "EphemeralRunnerSet": EPHEMERAL_RUNNER_SETS,
        "EphemeralRunner": EPHEMERAL_RUNNERS,
        "AutoscalingListener": AUTOSCALING_LISTENERS,
        "ServiceAccount": SERVICE_ACCOUNTS,
        "Role": ROLES,
        "RoleBinding": ROLE_BINDINGS,
        "Secret": SECRETS,
        "Pod": PODS,
    }
    async with ActionsClient.from_config(actions_sim.config_url(), PersonalAccessToken(actions_sim.pat)) as client:
        for doc in docs:
            meta = doc["metadata"]
            fixture_uid = meta.pop("uid")
            status = doc.pop("status", None)
            if meta.pop("deletionTimestamp", None):
                deleting.append(doc)
            for k in ("creationTimestamp", "generation", "generateName"):
                meta.pop(k, None)
            for ref in meta.get("ownerReferences", []):
                ref["uid"] = uids[ref["uid"]]
            resource = resources[doc["kind"]]
            obj = await kube.writer.create(resource, doc)
            uids[fixture_uid] = obj.metadata.uid
            if doc["kind"] == "EphemeralRunner":
                jit = await client.generate_jit_config(scale_set_id, meta["name"])
                status = {**status, "runnerId": jit.runner.id}
                if jits is not None:
                    jits[meta["name"]] = jit.encoded_jit_config
            if status and doc["kind"] not in ("AutoscalingRunnerSet", "Pod"):
                obj = await kube.writer.patch_status(
                    resource, resource.key_of(obj), {"status": status}, resource_version=obj.metadata.resource_version
                )
            created[f"{doc['kind']}/{meta['name']}"] = obj
    for doc in deleting:
        await kube.writer.delete(resources[doc["kind"]], ObjectKey(namespace, doc["metadata"]["name"]))
    return created


async def uids_of_runners(kube: Any, namespace: str) -> set[str]:
    return {r.metadata.uid for r in await runners(kube, namespace, include_deleting=True)}


async def no_churn_for(kube: Any, namespace: str, expected: set[str], seconds: float = 1.5) -> None:
    """Nothing created, nothing deleted, for a while (the negative side)."""
    with anyio.move_on_after(seconds):
        while True:
            assert await uids_of_runners(kube, namespace) == expected
            await anyio.sleep(0.1)


def workers(worker_settings: Any, namespace: str) -> Any:
    settings = ScaleSetSettings(controller_namespace=namespace, listener_image="ghcr.io/example/runnerscale:test")
    return (
        running_worker(SCALE_SET.name, worker_settings("ss0"), SCALE_SET.setup(settings)),
        running_worker(RUNNER_SET.name, worker_settings("rs0"), RUNNER_SET.setup(FailurePolicy())),
    )


def listener_pod_worker(worker_settings: Any) -> Any:
    """ARC's listeners go through it (their pods stop), which 0.14 adoption waits for."""
    from services.listener_pod import decide as lp_decide
    from services.listener_pod.worker import WORKER as LISTENER_POD

    options = lp_decide.ListenerPodSettings(
        image="ghcr.io/example/runnerscale:test", metrics_addr="127.0.0.1:18080", health_addr="127.0.0.1:18081"
    )
    return running_worker(LISTENER_POD.name, worker_settings("lp0"), LISTENER_POD.setup(options))


async def test_arc_014_mid_rollout_with_runners_mid_job(
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
    old_busy, idle, busy = (
        arc["EphemeralRunner/arc-runner-set-7xk2q-runner-4vq9d"],
        arc["EphemeralRunner/arc-runner-set-m4n8p-runner-x2k7f"],
        arc["EphemeralRunner/arc-runner-set-m4n8p-runner-p8w3z"],
    )
    before = await uids_of_runners(kube, namespace)
    registered_before = {r.id for r in await actions_sim.control.runners()}
    ss, rs = workers(worker_settings, namespace)
    async with (
        ss as s,
        rs as r,
        listener_pod_worker(worker_settings) as p,
        fake_runner_worker(kube, namespace, actions_sim, 0, register=False),
    ):
        for w in (s, r, p):
            await w.wait_ready()

        async def taken_over() -> Any:
            ers = await kube.reader.get_or_none(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, NAME))
            latest = await kube.reader.get_or_none(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "arc-runner-set-m4n8p"))
            if ers is None or latest is not None or ers.status is None or ers.status.applied_actionable_revision != 1:
                return None
            return ers

        ers = await wait_for(taken_over, timeout=30, what="ERS named like the ARS applied, ARC's latest set retired")
        assert ers.spec.actionable_revision == 1
        assert ers.metadata.finalizers == [FINALIZER_EPHEMERAL_RUNNER_SET]

        # The matching runners, idle and busy, are the same objects, now runnerscale's.
        for er in (idle, busy):
            now = await kube.reader.get(EPHEMERAL_RUNNERS, EPHEMERAL_RUNNERS.key_of(er))
            assert now.metadata.uid == er.metadata.uid
            assert cast(OwnerReference, now.metadata.controller_reference()).uid == ers.metadata.uid
            assert now.metadata.annotations[ANNOTATION_ACTIONABLE_REVISION] == "1"
            assert not any(k in now.metadata.annotations for k in ARC_HASHES)
        busy_now = await kube.reader.get(EPHEMERAL_RUNNERS, EPHEMERAL_RUNNERS.key_of(busy))
        assert busy_now.status is not None and busy_now.status.job_id

        # The old-spec runner mid-job is untouched on ARC's draining set.
        now = await kube.reader.get(EPHEMERAL_RUNNERS, EPHEMERAL_RUNNERS.key_of(old_busy))
        assert now.metadata.uid == old_busy.metadata.uid and not now.metadata.is_deleting
        assert cast(OwnerReference, now.metadata.controller_reference()).name == "arc-runner-set-7xk2q"
        await no_churn_for(kube, namespace, before)

        # ARC's listener (0.14 naming) gives way to runnerscale's, which feeds the ERS named like the ARS.
        ars = await kube.reader.get(AUTOSCALING_RUNNER_SETS, ObjectKey(namespace, NAME))
        assert "actions.github.com/change-hash" not in ars.metadata.annotations
        al = await kube.reader.get(AUTOSCALING_LISTENERS, ObjectKey(namespace, ars_listener_name(ars)))
        assert al.spec.ephemeral_runner_set_name == NAME
        # ARC's listener was gone before any runner moved (it could scale the frozen set up again).
        assert (
            await kube.reader.get_or_none(
                AUTOSCALING_LISTENERS, ObjectKey(namespace, "arc-runner-set-754b578d-listener")
            )
            is None
        )

        # The old job finishes: the runner goes (as the runner worker does), and ARC's draining set
        # is released by the runner-set worker, ARC's finalizer included.
        await kube.writer.delete(EPHEMERAL_RUNNERS, EPHEMERAL_RUNNERS.key_of(old_busy))

        async def old_set_gone() -> bool:
            return (
                await kube.reader.get_or_none(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "arc-runner-set-7xk2q"))
                is None
            )

        await wait_for(old_set_gone, timeout=20, what="ARC's draining set released")
        assert await uids_of_runners(kube, namespace) == {idle.metadata.uid, busy.metadata.uid}

    # Nothing orphaned at the service: every registration is a runner that still exists (the
    # finished one's registration goes with its runner worker, not simulated here).
    registered = {r.id for r in await actions_sim.control.runners()}
    assert registered <= registered_before
    kept = {idle.status.runner_id, busy.status.runner_id}
    assert kept <= registered


async def test_arc_integrity_era_set_is_seeded_without_churn(
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    await require_crds(kube)
    arc = await install_arc_leftovers(
        kube, "arc-integrity.yaml", namespace, actions_sim, github_secret, listener_hash_of_url=True
    )
    set_uid = arc[f"EphemeralRunnerSet/{NAME}"].metadata.uid
    before = await uids_of_runners(kube, namespace)
    ss, rs = workers(worker_settings, namespace)
    async with ss as s, rs as r, fake_runner_worker(kube, namespace, actions_sim, 0, register=False):
        await s.wait_ready()
        await r.wait_ready()

        async def seeded() -> Any:
            ers = await kube.reader.get(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, NAME))
            ok = ers.spec.actionable_revision == 1 and ers.status and ers.status.applied_actionable_revision == 1
            return ers if ok else None

        ers = await wait_for(seeded, timeout=30, what="ARC's set seeded at revision 1 and applied")
        assert ers.metadata.uid == set_uid
        assert "actions.github.com/integrity-hash" not in ers.metadata.annotations
        await no_churn_for(kube, namespace, before)
        for er in await runners(kube, namespace):
            assert er.metadata.annotations[ANNOTATION_ACTIONABLE_REVISION] == "1"
            assert "actions.github.com/integrity-hash" not in er.metadata.annotations
        al_name = listener_name(NAME, namespace, "", actions_sim.config_url())
        al = await kube.reader.get(AUTOSCALING_LISTENERS, ObjectKey(namespace, al_name))
        assert al.metadata.uid == arc[f"AutoscalingListener/{al_name}"].metadata.uid
        assert "actions.github.com/integrity-hash" not in al.metadata.annotations
        assert al.spec.image == "ghcr.io/example/runnerscale:test"  # patched in place, same AL


async def test_dry_run_prints_every_change_and_writes_nothing(
    kube: Kube, kube_api: KubeApi, namespace: str, github_secret: str, actions_sim: ActionsSim
) -> None:
    import argparse

    from services.scale_set.adopt_cli import preview

    await require_crds(kube)
    await install_arc_leftovers(kube, "arc-0.14.yaml", namespace, actions_sim, github_secret)

    async def versions() -> dict[str, str]:
        out = {}
        kinds: tuple[Resource[Any], ...] = (
            AUTOSCALING_RUNNER_SETS,
            EPHEMERAL_RUNNER_SETS,
            EPHEMERAL_RUNNERS,
            AUTOSCALING_LISTENERS,
        )
        for resource in kinds:
            for o in (await kube.reader.list(resource, namespace=namespace)).items:
                out[f"{resource.kind}/{o.metadata.name}"] = o.metadata.resource_version
        return out

    before = await versions()
    args = argparse.Namespace(
        kubeconfig=str(kube_api.kubeconfig),
        kube_context=None,
        controller_namespace=namespace,
        namespace=[namespace],
        listener_image="ghcr.io/example/runnerscale:test",
        exclude_label_propagation_prefix=[],
    )
    lines = await preview(args)
    text = "\n".join(lines)
    ns = namespace
    expected = [
        f"AutoscalingRunnerSet {ns}/arc-runner-set:",
        f"  patch     AutoscalingRunnerSet {ns}/arc-runner-set: drop ARC annotation(s) actions.github.com/change-hash",
        f"  create    EphemeralRunnerSet {ns}/arc-runner-set: replaces ARC's arc-runner-set-7xk2q, arc-runner-set-m4n8p;"
        " actionableRevision 1, replicas 0, patchID 1 until the listener publishes",
        f"  freeze    EphemeralRunnerSet {ns}/arc-runner-set-m4n8p: replicas 2→0, patchID 3→3 (creates and removes no runner any more)",
        f"  leave     EphemeralRunner {ns}/arc-runner-set-7xk2q-runner-4vq9d: busy, spec differs: finishes its job, then goes",
        f"  keep      EphemeralRunner {ns}/arc-runner-set-m4n8p-runner-p8w3z: busy, spec matches: kept at revision 1"
        " (moves from arc-runner-set-m4n8p to arc-runner-set)",
        f"  keep      EphemeralRunner {ns}/arc-runner-set-m4n8p-runner-x2k7f: idle, spec matches: kept at revision 1"
        " (moves from arc-runner-set-m4n8p to arc-runner-set)",
        f"  delete    EphemeralRunnerSet {ns}/arc-runner-set-m4n8p: ARC's set, once its matching runners moved;",
        f"  drain     EphemeralRunnerSet {ns}/arc-runner-set-7xk2q: ARC was deleting it",
        f"  delete    AutoscalingListener {ns}/arc-runner-set-754b578d-listener: named as ARC 0.12-0.14 named it;",
        "  create    AutoscalingListener",
    ]
    position = 0
    for want in expected:  # in this order
        found = text.find(want, position)
        assert found >= 0, f"missing (in order): {want!r}\n{text}"
        position = found + len(want)
    assert await versions() == before  # a dry run writes nothing


def test_adopt_without_dry_run_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    from services.scale_set.adopt_cli import main

    assert main(["--controller-namespace", "arc-systems"]) == 2
    assert "only --dry-run" in capsys.readouterr().err


async def test_arc_014_listener_and_its_objects_are_replaced_by_runnerscales(
    kube: Kube,
    namespace: str,
    worker_settings: Callable[..., WorkerSettings],
    github_secret: str,
    actions_sim: ActionsSim,
) -> None:
    from services.listener_pod.build import role_rules
    from shared.api.constants import ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION
    from shared.listener_config import parse_config

    await require_crds(kube)
    arc = await install_arc_leftovers(
        kube, "arc-0.14.yaml", namespace, actions_sim, github_secret, more=("arc-0.14-listener.yaml",)
    )
    old = "arc-runner-set-754b578d-listener"
    ss, rs = workers(worker_settings, namespace)
    lp = listener_pod_worker(worker_settings)
    async with ss as s, rs as r, lp as p, fake_runner_worker(kube, namespace, actions_sim, 0, register=False):
        for w in (s, r, p):
            await w.wait_ready()
        ars = await kube.reader.get(AUTOSCALING_RUNNER_SETS, ObjectKey(namespace, NAME))
        new = ars_listener_name(ars)
        assert new != old

        async def runnerscales_pod() -> Any:
            pod = await kube.reader.get_or_none(PODS, ObjectKey(namespace, new))
            return (
                pod
                if pod is not None and ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION in pod.metadata.annotations
                else None
            )

        pod = await wait_for(runnerscales_pod, timeout=30, what="runnerscale's listener pod")
        assert pod.spec["containers"][0]["image"] == "ghcr.io/example/runnerscale:test"
        role = await kube.reader.get(ROLES, ObjectKey(namespace, new))
        assert [msgspec.to_builtins(rule) for rule in role.rules or []] == role_rules(NAME)  # ARC's named its old set
        config = await kube.reader.get(SECRETS, ObjectKey(namespace, f"{new}-config"))
        assert parse_config(cast(bytes, config.decoded("config.json"))).ephemeral_runner_set_name == NAME
        assert await kube.reader.get_or_none(SERVICE_ACCOUNTS, ObjectKey(namespace, new)) is not None
        assert await kube.reader.get_or_none(ROLE_BINDINGS, ObjectKey(namespace, new)) is not None

        async def arcs_objects_going() -> bool:
            objects: tuple[tuple[Resource[Any], str], ...] = (
                (PODS, old),
                (SERVICE_ACCOUNTS, old),
                (ROLES, old),
                (ROLE_BINDINGS, old),
                (SECRETS, f"{old}-config"),
            )
            for resource, name in objects:
                o = await kube.reader.get_or_none(resource, ObjectKey(namespace, name))
                if o is not None and not o.metadata.is_deleting:
                    return False
            return True

        await wait_for(arcs_objects_going, timeout=30, what="ARC's listener pod, RBAC and config Secret removed")
        assert arc[f"Pod/{old}"].metadata.uid != pod.metadata.uid
