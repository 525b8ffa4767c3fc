"""The listener-pod worker against the API emulator and a real nats-server (ARC's listener tests, plus pod drift by semantic comparison).

The AL lives in the test namespace (ARC's tests use one namespace too), so its Role and
RoleBinding (ARS namespace) land there as well. No node simulator runs here: pods stay Pending
unless a test writes their status, as ARC's envtest suite does.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest
from prometheus_client import CollectorRegistry

from services.listener_pod import decide
from services.listener_pod.metrics import listener_pod_metrics
from services.listener_pod.reconciler import ListenerPodReconciler
from services.listener_pod.worker import WORKER
from shared.api.constants import ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION, FINALIZER_AUTOSCALING_LISTENER
from shared.clock import ManualClock
from shared.kube import (
    AUTOSCALING_LISTENERS,
    AUTOSCALING_RUNNER_SETS,
    EVENTS,
    PODS,
    ROLE_BINDINGS,
    ROLES,
    SECRETS,
    SERVICE_ACCOUNTS,
    ObjectKey,
    ReconcileContext,
)
from shared.listener_config import parse_config
from shared.worker import WorkerHandle, WorkerSettings, running_worker
from tests.scenario.conftest import Kube, create_secret, require_crds, wait_for

pytestmark = pytest.mark.anyio

AL_NAME = "arc-set-abcd1234-listener"
ARS_NAME = "arc-set"
IMAGE = "example.com/runnerscale:test"


def make_options(**settings: Any) -> decide.ListenerPodSettings:
    base = decide.ListenerPodSettings(
        image=IMAGE,
        metrics_addr="127.0.0.1:18080",
        health_addr="127.0.0.1:18081",
        restart_backoff=0.2,
        restart_backoff_max=1.0,
        resync_seconds=30.0,
        cleanup_requeue_seconds=0.2,
    )
    return msgspec.structs.replace(base, **settings)


def ars_body(namespace: str, secret: str) -> dict[str, Any]:
    return {
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "AutoscalingRunnerSet",
        "metadata": {"name": ARS_NAME, "namespace": namespace},
        "spec": {
            "githubConfigUrl": "https://github.com/octo-org/octo-repo",
            "githubConfigSecret": secret,
            "minRunners": 0,
            "maxRunners": 3,
            "template": {
                "spec": {"containers": [{"name": "runner", "image": "ghcr.io/actions/actions-runner:latest"}]}
            },
        },
    }


def al_body(namespace: str, secret: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "actions.github.com/v1alpha1",
        "kind": "AutoscalingListener",
        "metadata": {
            "name": AL_NAME,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/component": "runner-scale-set-listener",
                "arc.test/listener-label": "initial",
            },
        },
        "spec": {
            "githubConfigUrl": "https://github.com/octo-org/octo-repo",
            "githubConfigSecret": secret,
            "runnerScaleSetId": 1,
            "autoscalingRunnerSetNamespace": namespace,
            "autoscalingRunnerSetName": ARS_NAME,
            "ephemeralRunnerSetName": ARS_NAME,
            "minRunners": 1,
            "maxRunners": 10,
            "serviceAccountMetadata": {"annotations": {"sa": "annotation"}},
            "roleMetadata": {"annotations": {"role": "annotation"}},
            "roleBindingMetadata": {"annotations": {"rb": "annotation"}},
            "configSecretMetadata": {"labels": {"cfg": "label"}, "annotations": {"cfg": "annotation"}},
        },
    }
    body["spec"].update(spec)
    return body


@asynccontextmanager
async def listener_pod_worker(
    settings: WorkerSettings, options: decide.ListenerPodSettings | None = None
) -> AsyncIterator[tuple[WorkerHandle, CollectorRegistry]]:
    registry = CollectorRegistry()
    async with running_worker(
        WORKER.name, settings, WORKER.setup(options or make_options()), registry=registry
    ) as handle:
        await handle.wait_ready()
        yield handle, registry


def metric(registry: CollectorRegistry, metric_name: str, **labels: str) -> float:
    return registry.get_sample_value(metric_name, labels) or 0.0


async def setup_objects(kube: Kube, namespace: str, **spec: Any) -> ObjectKey:
    await require_crds(kube)
    await create_secret(kube, namespace, "github-config", {"github_token": "ghp_first_token_value"})
    await kube.writer.create(AUTOSCALING_RUNNER_SETS, ars_body(namespace, "github-config"))
    await kube.writer.create(AUTOSCALING_LISTENERS, al_body(namespace, "github-config", **spec))
    return ObjectKey(namespace, AL_NAME)


async def get(kube: Kube, resource: Any, namespace: str, name: str) -> Any:
    return await kube.reader.get_or_none(resource, ObjectKey(namespace, name))


async def live_pod(kube: Kube, namespace: str) -> Any:
    return await get(kube, PODS, namespace, AL_NAME)


def kick(handle: WorkerHandle, key: ObjectKey) -> None:
    assert handle.ctx is not None
    (controller,) = [c for c in handle.ctx.controllers if c.name == WORKER.controller]
    controller.enqueue(key)


async def settled(handle: WorkerHandle) -> bool:
    assert handle.ctx is not None
    c = handle.ctx.controllers[0]
    return len(c.queue) == 0 and not c.queue.processing


async def config_of(kube: Kube, namespace: str) -> Any:
    secret = await get(kube, SECRETS, namespace, f"{AL_NAME}-config")
    return parse_config(secret.decoded("config.json"))


# --- creation -------------------------------------------------------------------------------------------


async def test_creates_service_account_role_binding_config_and_pod(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    key = await setup_objects(kube, namespace)
    async with listener_pod_worker(worker_settings()) as (_handle, registry):
        pod = await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        al = await kube.reader.get(AUTOSCALING_LISTENERS, key)
        assert FINALIZER_AUTOSCALING_LISTENER in al.metadata.finalizers

        sa = await get(kube, SERVICE_ACCOUNTS, namespace, AL_NAME)
        assert sa.metadata.annotations == {"sa": "annotation"}
        assert sa.metadata.owner_references[0].uid == al.metadata.uid

        role = await get(kube, ROLES, namespace, AL_NAME)
        assert role.metadata.annotations == {"role": "annotation"}
        assert not role.rules  # the runnerscale listener never talks to Kubernetes
        rb = await get(kube, ROLE_BINDINGS, namespace, AL_NAME)
        assert rb.role_ref.name == AL_NAME
        assert [(s.kind, s.name, s.namespace) for s in rb.subjects] == [("ServiceAccount", AL_NAME, namespace)]

        secret = await get(kube, SECRETS, namespace, f"{AL_NAME}-config")
        assert secret.metadata.labels == {"cfg": "label"} and secret.metadata.annotations == {"cfg": "annotation"}
        cfg = parse_config(secret.decoded("config.json"))
        assert cfg.github_token == "ghp_first_token_value"
        assert (cfg.runner_scale_set_id, cfg.runner_scale_set_name) == (1, ARS_NAME)
        assert (cfg.ephemeral_runner_set_namespace, cfg.ephemeral_runner_set_name) == (namespace, ARS_NAME)
        assert (cfg.min_runners, cfg.max_runners) == (1, 10)
        assert cfg.nats.servers == list(worker_settings().bus.nats_urls), "the worker passes its NATS settings through"
        assert cfg.metrics_addr == "127.0.0.1:18080" and cfg.health_addr == "127.0.0.1:18081"

        assert pod.metadata.annotations[ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION] == secret.metadata.resource_version
        assert pod.metadata.annotations["runnerscale.dev/node-sim-exec"] == "true"
        assert pod.metadata.labels["arc.test/listener-label"] == "initial"
        (c, *_) = pod.spec["containers"]
        assert c["image"] == IMAGE
        assert c["command"] == ["runnerscale", "listener", "--config", "/etc/gha-listener/config.json"]
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert pod.spec["serviceAccountName"] == AL_NAME
        assert (
            metric(
                registry,
                "gha_controller_running_listeners",
                name=AL_NAME,
                namespace=namespace,
                repository="octo-repo",
                organization="octo-org",
                enterprise="",
            )
            == 0
        )


async def test_server_defaulted_pod_is_not_recreated(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    """The emulator's admission adds dnsPolicy, tolerations, the kube-api-access volume, port
    protocols ...: a derivative comparison must leave that pod alone across many reconciles."""
    key = await setup_objects(kube, namespace)
    async with listener_pod_worker(worker_settings()) as (handle, registry):
        first = await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        assert first.spec.get("dnsPolicy") == "ClusterFirst"
        assert any(v["name"].startswith("kube-api-access") for v in first.spec["volumes"]), "admission ran"
        uids = {first.metadata.uid}
        for _ in range(5):
            kick(handle, key)
            await wait_for(lambda: settled(handle), what="reconcile done")
            pod = await live_pod(kube, namespace)
            assert pod is not None and not pod.metadata.is_deleting
            uids.add(pod.metadata.uid)
        assert uids == {first.metadata.uid}
        assert (
            metric(
                registry,
                "runnerscale_listener_pod_recreations_total",
                name=AL_NAME,
                namespace=namespace,
                reason="spec-drift",
            )
            == 0
        )


# --- drift ------------------------------------------------------------------------------------------------


async def wait_new_pod(kube: Kube, namespace: str, old_uid: str) -> Any:
    async def fresh() -> Any:
        pod = await live_pod(kube, namespace)
        return pod if pod is not None and pod.metadata.uid != old_uid and not pod.metadata.is_deleting else None

    return await wait_for(fresh, what="a recreated listener pod")


async def test_image_drift_recreates_exactly_once(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    key = await setup_objects(kube, namespace)
    async with listener_pod_worker(worker_settings()) as (handle, registry):
        first = await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        await kube.edit(AUTOSCALING_LISTENERS, key, {"spec": {"image": "example.com/runnerscale:v2"}})
        second = await wait_new_pod(kube, namespace, first.metadata.uid)
        assert second.spec["containers"][0]["image"] == "example.com/runnerscale:v2"
        for _ in range(3):
            kick(handle, key)
            await wait_for(lambda: settled(handle), what="reconcile done")
        third = await live_pod(kube, namespace)
        assert third.metadata.uid == second.metadata.uid, "exactly one recreation"
        assert (
            metric(
                registry,
                "runnerscale_listener_pod_recreations_total",
                name=AL_NAME,
                namespace=namespace,
                reason="spec-drift",
            )
            == 1
        )


async def test_added_template_container_recreates(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    key = await setup_objects(kube, namespace)
    async with listener_pod_worker(worker_settings()):
        first = await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        template = {
            "spec": {
                "containers": [
                    {"name": "listener", "resources": {"limits": {"memory": "256Mi"}}},
                    {"name": "sidecar", "image": "busybox:1"},
                ]
            }
        }
        await kube.edit(AUTOSCALING_LISTENERS, key, {"spec": {"template": template}})
        second = await wait_new_pod(kube, namespace, first.metadata.uid)
        assert [c["name"] for c in second.spec["containers"]] == ["listener", "sidecar"]
        assert second.spec["containers"][0]["resources"]["limits"]["memory"] == "256Mi"


async def test_credential_rotation_rewrites_secret_data_and_restarts_pod(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    """Better than ARC (which regressed to rewriting only an annotation): the config DATA follows
    the GitHub secret, and the pod restarts because the config resourceVersion moved."""
    key = await setup_objects(kube, namespace)
    async with listener_pod_worker(worker_settings()) as (handle, registry):
        first = await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        cfg_secret = await get(kube, SECRETS, namespace, f"{AL_NAME}-config")
        new_token = base64.b64encode(b"ghp_rotated_token_value").decode()
        await kube.edit(SECRETS, ObjectKey(namespace, "github-config"), {"data": {"github_token": new_token}})
        kick(handle, key)  # the resync in production; secrets are not watched
        second = await wait_new_pod(kube, namespace, first.metadata.uid)
        rotated = await get(kube, SECRETS, namespace, f"{AL_NAME}-config")
        assert rotated.metadata.uid == cfg_secret.metadata.uid, "the Secret is rewritten in place"
        assert parse_config(rotated.decoded("config.json")).github_token == "ghp_rotated_token_value"
        assert (
            second.metadata.annotations[ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION]
            == rotated.metadata.resource_version
        )
        assert (
            metric(
                registry,
                "runnerscale_listener_pod_recreations_total",
                name=AL_NAME,
                namespace=namespace,
                reason="config-changed",
            )
            == 1
        )
        assert (
            metric(
                registry,
                "runnerscale_listener_config_writes_total",
                name=AL_NAME,
                namespace=namespace,
                reason="changed",
            )
            == 1
        )


async def test_spec_change_rewrites_config(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    key = await setup_objects(kube, namespace)
    async with listener_pod_worker(worker_settings()):
        first = await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        await kube.edit(AUTOSCALING_LISTENERS, key, {"spec": {"maxRunners": 20}})
        await wait_new_pod(kube, namespace, first.metadata.uid)
        assert (await config_of(kube, namespace)).max_runners == 20


async def test_metadata_changes_propagate_without_recreation(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    """As ARC's tests: label/metadata updates reach SA, Role, RoleBinding, config Secret and pod."""
    key = await setup_objects(kube, namespace)
    async with listener_pod_worker(worker_settings()):
        first = await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        patch = {
            "metadata": {"labels": {"arc.test/listener-label": "updated"}},
            "spec": {
                "serviceAccountMetadata": {"annotations": {"sa": "updated", "sa2": "added"}},
                "roleMetadata": {"annotations": {"role": "updated"}},
            },
        }
        await kube.edit(AUTOSCALING_LISTENERS, key, patch)

        async def propagated() -> bool:
            sa = await get(kube, SERVICE_ACCOUNTS, namespace, AL_NAME)
            role = await get(kube, ROLES, namespace, AL_NAME)
            pod = await live_pod(kube, namespace)
            return bool(
                sa.metadata.annotations.get("sa2") == "added"
                and sa.metadata.labels.get("arc.test/listener-label") == "updated"
                and role.metadata.annotations.get("role") == "updated"
                and pod.metadata.labels.get("arc.test/listener-label") == "updated"
            )

        await wait_for(propagated, what="metadata on SA, Role and pod")
        assert (await live_pod(kube, namespace)).metadata.uid == first.metadata.uid


async def test_arc_listener_role_rules_are_taken_away(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    """A listener Role with ARC's rules (patch on the ERS and on runners) is patched empty: the
    runnerscale listener never talks to Kubernetes (least privilege)."""
    await setup_objects(kube, namespace)
    async with listener_pod_worker(worker_settings()):
        await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        arc_rules = [
            {"apiGroups": ["actions.github.com"], "resources": ["ephemeralrunners"], "verbs": ["patch"]},
        ]
        await kube.edit(ROLES, ObjectKey(namespace, AL_NAME), {"rules": arc_rules})

        async def emptied() -> bool:
            return not (await get(kube, ROLES, namespace, AL_NAME)).rules

        await wait_for(emptied, what="ARC's rules taken away")


# --- pod failures -----------------------------------------------------------------------------------------


async def set_pod_status(kube: Kube, namespace: str, status: dict[str, Any]) -> None:
    await kube.edit(PODS, ObjectKey(namespace, AL_NAME), {"status": status}, status=True)


async def test_terminated_listener_is_recreated_and_counted(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    """As ARC's tests: a terminated listener container or an evicted pod gets a new pod; the
    config Secret is kept."""
    await setup_objects(kube, namespace)
    async with listener_pod_worker(worker_settings()) as (handle, registry):
        first = await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        cfg_uid = (await get(kube, SECRETS, namespace, f"{AL_NAME}-config")).metadata.uid
        running = {
            "phase": "Running",
            "containerStatuses": [
                {"name": "listener", "ready": True, "state": {"running": {"startedAt": "2026-11-29T10:00:00Z"}}}
            ],
        }
        await set_pod_status(kube, namespace, running)
        labels = dict(name=AL_NAME, namespace=namespace, repository="octo-repo", organization="octo-org", enterprise="")

        def recreations(reason: str) -> float:
            return metric(
                registry, "runnerscale_listener_pod_recreations_total", name=AL_NAME, namespace=namespace, reason=reason
            )

        await wait_for(
            lambda: metric(registry, "gha_controller_running_listeners", **labels) == 1, what="running gauge 1"
        )

        await set_pod_status(
            kube,
            namespace,
            {
                "phase": "Failed",
                "containerStatuses": [
                    {"name": "listener", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
                ],
            },
        )
        second = await wait_new_pod(kube, namespace, first.metadata.uid)
        # the new pod can be visible before the worker's pass that created it updated its metrics
        # (README "Tests, benchmarks, real clusters": no value read once while it converges)
        await wait_for(lambda: recreations("terminated") == 1, what="terminated recreation counted")
        await wait_for(
            lambda: metric(registry, "gha_controller_running_listeners", **labels) == 0, what="running gauge 0"
        )

        await set_pod_status(
            kube,
            namespace,
            {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
        )
        await wait_new_pod(kube, namespace, second.metadata.uid)
        await wait_for(lambda: recreations("evicted") == 1, what="evicted recreation counted")
        assert (await get(kube, SECRETS, namespace, f"{AL_NAME}-config")).metadata.uid == cfg_uid

        async def pod_failed_event() -> bool:  # lists of Events lag their writes on a real API server
            events = await kube.reader.list(EVENTS, namespace=namespace)
            return any(e.reason == "ListenerPodFailed" for e in events.items if e.involved_object.name == AL_NAME)

        await wait_for(pod_failed_event, what="ListenerPodFailed event")
        assert handle.ctx is not None
        restarts = handle.ctx.reconciler.restarts
        await wait_for(
            lambda: restarts[ObjectKey(namespace, AL_NAME)].failures == 2,
            what="consecutive failures drive the recreation backoff",
        )


async def test_deleted_pod_is_recreated(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    await setup_objects(kube, namespace)
    async with listener_pod_worker(worker_settings()):
        first = await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        await kube.writer.delete(PODS, ObjectKey(namespace, AL_NAME), grace_period_seconds=0)
        await wait_new_pod(kube, namespace, first.metadata.uid)


# --- deletion -----------------------------------------------------------------------------------------------


async def test_deletion_chain(kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]) -> None:
    key = await setup_objects(kube, namespace)
    async with listener_pod_worker(worker_settings()):
        await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        await kube.writer.delete(AUTOSCALING_LISTENERS, key)

        async def all_gone() -> bool:
            for resource, name in (
                (PODS, AL_NAME),
                (SECRETS, f"{AL_NAME}-config"),
                (ROLE_BINDINGS, AL_NAME),
                (ROLES, AL_NAME),
                (SERVICE_ACCOUNTS, AL_NAME),
                (AUTOSCALING_LISTENERS, AL_NAME),
            ):
                if await get(kube, resource, namespace, name) is not None:
                    return False
            return True

        await wait_for(all_gone, timeout=30, what="pod, secret, role binding, role, SA and the AL gone")


async def test_listener_of_a_deleted_runner_set_is_deleted(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    await setup_objects(kube, namespace)
    async with listener_pod_worker(worker_settings()):
        await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        await kube.writer.delete(AUTOSCALING_RUNNER_SETS, ObjectKey(namespace, ARS_NAME))
        await wait_for(
            lambda: _gone(kube, namespace),
            timeout=30,
            what="AL and its objects gone after the ARS was deleted",
        )


async def _gone(kube: Kube, namespace: str) -> bool:
    return (
        await get(kube, AUTOSCALING_LISTENERS, namespace, AL_NAME) is None
        and await get(kube, ROLES, namespace, AL_NAME) is None
    )


# --- bad input and conflicts ----------------------------------------------------------------------------------


async def test_missing_github_secret_is_an_event_not_a_crash(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    await require_crds(kube)
    await kube.writer.create(AUTOSCALING_RUNNER_SETS, ars_body(namespace, "nope"))
    await kube.writer.create(AUTOSCALING_LISTENERS, al_body(namespace, "nope"))
    async with listener_pod_worker(worker_settings()) as (handle, _):

        async def warned() -> bool:
            events = await kube.reader.list(EVENTS, namespace=namespace)
            return any(e.reason == "GitHubSecretMissing" and e.type == "Warning" for e in events.items)

        await wait_for(warned, what="GitHubSecretMissing event")
        assert await live_pod(kube, namespace) is None
        await create_secret(kube, namespace, "nope", {"github_token": "ghp_late_token_value"})
        kick(handle, ObjectKey(namespace, AL_NAME))
        await wait_for(lambda: live_pod(kube, namespace), what="pod once the secret exists")


async def test_conflicts_on_writes_converge(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings], kube_api: Any
) -> None:
    """409 on the finalizer patch, the config Secret rewrite and the pod create path: re-read, decide
    again, converge to one pod carrying the latest config revision."""
    control = kube_api.require_emulator()
    key = await setup_objects(kube, namespace)
    ids = [
        control.add_fault(
            action="error", code=409, verb="patch", resource="autoscalinglisteners", namespace=namespace, times=2
        ),
        control.add_fault(action="error", code=409, verb="create", resource="pods", namespace=namespace, times=1),
    ]
    try:
        async with listener_pod_worker(worker_settings()) as (handle, _):
            first = await wait_for(lambda: live_pod(kube, namespace), what="listener pod despite conflicts")
            ids.append(
                control.add_fault(
                    action="error", code=409, verb="patch", resource="secrets", namespace=namespace, times=1
                )
            )
            await kube.edit(AUTOSCALING_LISTENERS, key, {"spec": {"minRunners": 2}})
            second = await wait_new_pod(kube, namespace, first.metadata.uid)
            secret = await get(kube, SECRETS, namespace, f"{AL_NAME}-config")
            assert parse_config(secret.decoded("config.json")).min_runners == 2
            await wait_for(lambda: settled(handle), what="settled")
            pods = await kube.reader.list(PODS, namespace=namespace)
            assert [p.metadata.uid for p in pods.items] == [second.metadata.uid]
            assert (
                second.metadata.annotations[ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION]
                == secret.metadata.resource_version
            )
            active = {rule.id for rule in control.faults()}
            assert not active & set(ids), "every injected 409 was hit"
    finally:
        for rule_id in ids:
            with contextlib.suppress(Exception):  # already spent
                control.remove_fault(rule_id)


async def test_worker_restart_keeps_a_current_pod_and_recreates_a_legacy_one_once(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    """Restart safety: a fresh worker (no memory) leaves a current pod alone; a pod without the
    config-revision annotation (started by an older controller) is recreated exactly once (sparing it would record a config the listener never read)."""
    key = await setup_objects(kube, namespace)
    async with listener_pod_worker(worker_settings()):
        first = await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
    async with listener_pod_worker(worker_settings()) as (handle, _):
        kick(handle, key)
        await wait_for(lambda: settled(handle), what="settled")
        assert (await live_pod(kube, namespace)).metadata.uid == first.metadata.uid
    pod = await live_pod(kube, namespace)
    await kube.writer.patch_merge(
        PODS,
        ObjectKey(namespace, AL_NAME),
        {"metadata": {"annotations": {ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION: None}}},
        resource_version=pod.metadata.resource_version,
    )
    async with listener_pod_worker(worker_settings()) as (handle, registry):
        second = await wait_new_pod(kube, namespace, first.metadata.uid)
        assert second.metadata.annotations[ANNOTATION_LISTENER_CONFIG_RESOURCE_VERSION]
        for _ in range(3):
            kick(handle, key)
            await wait_for(lambda: settled(handle), what="settled")
        assert (await live_pod(kube, namespace)).metadata.uid == second.metadata.uid
        assert (
            metric(
                registry,
                "runnerscale_listener_pod_recreations_total",
                name=AL_NAME,
                namespace=namespace,
                reason="config-changed",
            )
            == 1
        )


async def test_two_replicas_do_not_fight_over_the_pod(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    """Two replicas: the AL's shard belongs to one of them, so there is exactly one pod and no
    recreation, whichever replica a wake-up reaches."""
    key = await setup_objects(kube, namespace)
    async with (
        listener_pod_worker(worker_settings("r0")) as (h0, reg0),
        listener_pod_worker(worker_settings("r1")) as (h1, reg1),
    ):
        first = await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        for _ in range(3):
            kick(h0, key)
            kick(h1, key)
            await wait_for(lambda: settled(h0), what="r0 settled")
            await wait_for(lambda: settled(h1), what="r1 settled")
        pods = await kube.reader.list(PODS, namespace=namespace)
        assert [p.metadata.uid for p in pods.items] == [first.metadata.uid]
        for reg in (reg0, reg1):
            for reason in ("spec-drift", "config-changed", "foreign-owner"):
                assert (
                    metric(
                        reg,
                        "runnerscale_listener_pod_recreations_total",
                        name=AL_NAME,
                        namespace=namespace,
                        reason=reason,
                    )
                    == 0
                )


async def test_config_the_listener_would_reject_is_never_shipped(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    """runnerScaleSetId 0 passes the AL schema but not the listener's parser: Warning Event, no
    Secret, no pod (ARC validates the config before writing it, too)."""
    await setup_objects(kube, namespace, runnerScaleSetId=0)
    async with listener_pod_worker(worker_settings()):

        async def warned() -> bool:
            events = await kube.reader.list(EVENTS, namespace=namespace)
            return any(e.reason == "InvalidListenerConfig" and "runner_scale_set_id" in e.message for e in events.items)

        await wait_for(warned, what="InvalidListenerConfig event naming the field")
        assert await get(kube, SECRETS, namespace, f"{AL_NAME}-config") is None
        assert await live_pod(kube, namespace) is None


async def test_tls_ca_and_proxy_credentials_reach_the_config(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings]
) -> None:
    """As ARC's tests: the CA from the ConfigMap becomes server_root_ca; proxy credentials from
    their Secret become URL user-info (runnerscale keeps them in the config Secret, no proxy Secret)."""
    from shared.kube import CONFIG_MAPS

    ca = "-----BEGIN CERTIFICATE-----\nMIIBtest\n-----END CERTIFICATE-----\n"
    await kube.writer.create(
        CONFIG_MAPS, {"metadata": {"name": "ca-bundle", "namespace": namespace}, "data": {"ca.crt": ca}}
    )
    await create_secret(kube, namespace, "proxy-creds", {"username": "proxyuser", "password": "proxy pass"})
    await setup_objects(
        kube,
        namespace,
        githubServerTLS={"certificateFrom": {"configMapKeyRef": {"name": "ca-bundle", "key": "ca.crt"}}},
        proxy={
            "https": {"url": "http://proxy.example.com:3128", "credentialSecretRef": "proxy-creds"},
            "noProxy": ["example.org"],
        },
    )
    async with listener_pod_worker(worker_settings()):
        await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        cfg = await config_of(kube, namespace)
        assert cfg.server_root_ca == ca
        assert cfg.proxy.https_proxy == "http://proxyuser:proxy%20pass@proxy.example.com:3128"
        assert cfg.proxy.no_proxy == "example.org"
        assert await get(kube, SECRETS, namespace, f"{AL_NAME}-proxy") is None


async def test_recreation_waits_for_the_backoff(kube: Kube, namespace: str) -> None:
    """A listener that keeps failing is not recreated in a hot loop: after the Nth failure in a
    row the next pod waits base * 2^(N-2) (the reconciler alone, with a fake clock)."""
    key = await setup_objects(kube, namespace)
    clock = ManualClock()
    opts = make_options(restart_backoff=10.0, restart_backoff_max=100.0)
    rec = ListenerPodReconciler(
        kube.reader, kube.writer, opts, metrics=listener_pod_metrics(CollectorRegistry()), clock=clock
    )
    await rec.reconcile(key, ReconcileContext.direct())
    assert await live_pod(kube, namespace) is not None
    for failures in (1, 2, 3):
        await set_pod_status(
            kube,
            namespace,
            {"phase": "Failed", "containerStatuses": [{"name": "listener", "state": {"terminated": {"exitCode": 2}}}]},
        )
        result = await rec.reconcile(key, ReconcileContext.direct())  # deletes the failed pod
        assert result.requeue_after == max(opts.cleanup_requeue_seconds, decide.restart_delay(failures, opts.restart))
        await kube.writer.delete(
            PODS, ObjectKey(namespace, AL_NAME), grace_period_seconds=0, missing_ok=True
        )  # no kubelet here
        result = await rec.reconcile(key, ReconcileContext.direct())
        if failures == 1:
            assert await live_pod(kube, namespace) is not None, "the first failure is recreated at once"
            continue
        assert await live_pod(kube, namespace) is None, "inside the backoff window: no pod"
        assert result.requeue_after == pytest.approx(decide.restart_delay(failures, opts.restart))
        clock.advance(decide.restart_delay(failures, opts.restart))
        await rec.reconcile(key, ReconcileContext.direct())
        assert await live_pod(kube, namespace) is not None, "after the window the pod is recreated"


async def test_bus_wake_up_reconciles_the_listener(
    kube: Kube, namespace: str, worker_settings: Callable[..., WorkerSettings], bus: Any
) -> None:
    """``ResourceChanged`` on ``runnerscale.changes.autoscalinglistener.<ns>.<name>`` (e.g. the
    scale-set worker after rotating something the AL does not show) wakes the worker at once."""
    from shared.bus import ResourceChanged, ResourceRef

    key = await setup_objects(kube, namespace)
    async with listener_pod_worker(worker_settings()):
        first = await wait_for(lambda: live_pod(kube, namespace), what="listener pod")
        new_token = base64.b64encode(b"ghp_woken_by_the_bus").decode()
        await kube.edit(SECRETS, ObjectKey(namespace, "github-config"), {"data": {"github_token": new_token}})
        await bus.publish(
            ResourceChanged(resource_kind="AutoscalingListener", ref=ResourceRef(key.namespace, key.name))
        )
        await wait_new_pod(kube, namespace, first.metadata.uid)
        assert (await config_of(kube, namespace)).github_token == "ghp_woken_by_the_bus"
