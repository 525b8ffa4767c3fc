"""The runner worker against the API emulator + nats-server + Actions simulator: creation,
pod outcomes, deletion."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, cast

import anyio
import msgspec
import pytest

from shared.api import EphemeralRunner, EphemeralRunnerStatus
from shared.api.constants import (
    ANNOTATION_ACTIONABLE_REVISION,
    ANNOTATION_FINISHED_AT,
    ENV_RUNNER_CONTAINER_HOOKS,
    ENV_RUNNER_JIT_CONFIG,
    ENV_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE,
    FINALIZER_EPHEMERAL_RUNNER,
    FINALIZER_RUNNER_REGISTRATION,
    LABEL_EPHEMERAL_RUNNER,
    LABEL_RUNNER_POD,
)
from shared.kube import EPHEMERAL_RUNNERS, PODS, SECRETS, ObjectKey, Resource
from shared.worker import WorkerSettings
from tests.fixtures.actions_sim import ActionsSim
from tests.scenario.conftest import Kube, wait_for
from tests.scenario.test_runner_helpers import FAST, RunnerEnv, runner_template, start_runner_env

pytestmark = pytest.mark.anyio


async def test_er_gets_finalizers_secret_pod_and_runner_id(runner_env: RunnerEnv) -> None:
    env = runner_env
    await env.create_er("er-a")
    pod = await env.wait_pod("er-a")
    er = await wait_for(lambda: _with_runner_id(env, "er-a"), what="status.runnerId")
    assert er.metadata.finalizers == [FINALIZER_EPHEMERAL_RUNNER, FINALIZER_RUNNER_REGISTRATION]
    assert cast(EphemeralRunnerStatus, er.status).runner_name == "er-a"
    secret = await env.secret_of("er-a")
    assert base64.b64decode(secret.data["runnerId"]).decode() == str(cast(EphemeralRunnerStatus, er.status).runner_id)
    assert secret.data["jitToken"]
    assert secret.metadata.owner_references[0].uid == er.metadata.uid
    # the pod: ARC's shape, owned by the ER, revision annotation propagated
    assert pod.metadata.owner_references[0].uid == er.metadata.uid
    assert pod.metadata.labels[LABEL_EPHEMERAL_RUNNER] == "True"
    assert pod.metadata.labels["tmpl"] == "yes"
    assert pod.metadata.annotations[ANNOTATION_ACTIONABLE_REVISION] == "3"
    assert pod.spec["restartPolicy"] == "Never"
    runner = next(c for c in pod.spec["containers"] if c["name"] == "runner")
    env_by_name = {e["name"]: e for e in runner["env"]}
    assert env_by_name[ENV_RUNNER_JIT_CONFIG]["valueFrom"]["secretKeyRef"] == {"name": "er-a", "key": "jitToken"}
    assert env_by_name[ENV_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE]["value"] == "1"
    runners = await env.service_runners()
    assert [r.id for r in runners] == [cast(EphemeralRunnerStatus, er.status).runner_id]


async def test_creation_is_the_jit_call_plus_minimal_writes(
    runner_env: RunnerEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10: creating a runner reads no Secret (create it; only a RunnerExists answer makes
    the worker read it) and writes one finalizer patch, the Secret, the pod and ONE status patch
    (runner id with phase Pending); the pod's own Pending needs no further status copy."""
    env = runner_env
    rec = env.reconciler
    name = "er-new"
    writes, secret_reads, passes = [], [], []
    real_status, real_merge = rec.writer.patch_status, rec.writer.patch_merge
    real_get, real_pass = rec.reader.get_or_none, rec._reconcile

    async def patch_status(resource: Resource[Any], key: ObjectKey | str, body: Any, *args: Any, **kwargs: Any) -> Any:
        if key == env.key(name):
            writes.append(("status", body))
        return await real_status(resource, key, body, *args, **kwargs)

    async def patch_merge(resource: Resource[Any], key: ObjectKey | str, body: Any, *args: Any, **kwargs: Any) -> Any:
        if key == env.key(name):
            writes.append(("merge", body))
        return await real_merge(resource, key, body, *args, **kwargs)

    async def get_or_none(resource: Resource[Any], key: ObjectKey | str, *args: Any, **kwargs: Any) -> Any:
        if resource is SECRETS and key == env.key(name):
            secret_reads.append(key)
        return await real_get(resource, key, *args, **kwargs)

    async def one_pass(key: ObjectKey, **kw: Any) -> Any:
        started = anyio.current_time()
        try:
            return await real_pass(key, **kw)
        finally:
            if key == env.key(name):
                passes.append(started)

    monkeypatch.setattr(rec.writer, "patch_status", patch_status)
    monkeypatch.setattr(rec.writer, "patch_merge", patch_merge)
    monkeypatch.setattr(rec.reader, "get_or_none", get_or_none)
    monkeypatch.setattr(rec, "_reconcile", one_pass)
    await env.create_er(name)
    er, _ = await _registered(env, name)
    # Taken before the write: on a real API server the watch event can start the pass before the
    # write's own answer is back here.
    after = anyio.current_time()
    # the kubelet's part: the runner container is waiting for its image, pod phase Pending
    await env.set_pod_status(
        name,
        {
            "phase": "Pending",
            "containerStatuses": [
                {"name": "runner", "ready": False, "restartCount": 0, "image": "x", "state": {"waiting": {}}}
            ],
        },
    )
    await wait_for(lambda: any(t >= after for t in passes), what="a pass that saw the Pending pod")
    assert secret_reads == []
    assert [kind for kind, _ in writes] == ["merge", "status"], writes
    assert writes[1][1]["status"] == {
        "runnerId": cast(EphemeralRunnerStatus, er.status).runner_id,
        "runnerName": name,
        "phase": "Pending",
        "ready": False,
    }


async def _with_runner_id(env: RunnerEnv, name: str) -> EphemeralRunner | None:
    er = await env.er(name)
    return er if er is not None and er.status is not None and er.status.runner_id else None


async def _registered(env: RunnerEnv, name: str) -> tuple[EphemeralRunner, Any]:
    er = await wait_for(lambda: _with_runner_id(env, name), what=f"{name} registered")
    pod = await env.wait_pod(name)
    return er, pod


async def _service_ids(env: RunnerEnv) -> set[int]:
    return {r.id for r in await env.service_runners()}


async def test_exit_0_deletes_runner_and_unregisters(runner_env: RunnerEnv) -> None:
    env = runner_env
    await env.create_er("er-ok")
    er, _ = await _registered(env, "er-ok")
    await env.terminate("er-ok", 0)

    # finished, not deleted: Succeeded with the finished-at stamp, pod gone (the runner-set worker
    # deletes it once the listener accounted for the job; here there is none, so the runner
    # worker releases it itself after finished_release_after)
    await env.wait_finished("er-ok", "RunnerSucceeded")
    await env.wait_gone("er-ok")
    assert cast(EphemeralRunnerStatus, er.status).runner_id not in await _service_ids(env)
    await _wait_collected(env, "er-ok")


async def _owned_gone(env: RunnerEnv, name: str) -> bool:
    """The ER's pod and JIT Secret are gone (or going): owner-reference garbage collection."""
    pod, secret = await env.pod(name), await env.secret_of(name)
    return (pod is None or pod.metadata.is_deleting) and (secret is None or secret.metadata.is_deleting)


async def _wait_collected(env: RunnerEnv, name: str) -> None:
    """kube-controller-manager's garbage collector watches a CRD only after its next discovery
    pass (every 30 s), so right after the suite installs the CRDs collection can lag that long."""
    await wait_for(lambda: _owned_gone(env, name), timeout=60, what="pod and Secret collected with the ER")


def _spy_writes(env: RunnerEnv, monkeypatch: pytest.MonkeyPatch, name: str) -> list[tuple[str, str, Any]]:
    """Record the runner worker's own writes about ``name``: (verb, resource plural, body)."""
    writer = env.reconciler.writer
    seen: list[tuple[str, str, Any]] = []
    real_patch, real_delete = writer.patch_merge, writer.delete

    async def patch_merge(resource: Resource[Any], key: ObjectKey | str, body: Any, *args: Any, **kwargs: Any) -> Any:
        if key == env.key(name):
            seen.append(("patch", resource.plural, body))
        return await real_patch(resource, key, body, *args, **kwargs)

    async def delete(resource: Resource[Any], key: ObjectKey | str, *args: Any, **kwargs: Any) -> Any:
        if key == env.key(name):
            seen.append(("delete", resource.plural, None))
        return await real_delete(resource, key, *args, **kwargs)

    monkeypatch.setattr(writer, "patch_merge", patch_merge)
    monkeypatch.setattr(writer, "delete", delete)
    return seen


async def test_teardown_is_one_finalizer_patch_and_gc_takes_pod_and_secret(
    runner_env: RunnerEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10: deleting a runner is one pass: unregister, then ONE patch dropping both
    finalizers; the pod and the JIT Secret are not deleted by the worker but collected by the
    garbage collector (controller ownerReference to the ER)."""
    env = runner_env
    await env.create_er("er-td")
    er, _ = await _registered(env, "er-td")
    assert (await env.secret_of("er-td")).metadata.owner_references[0].controller
    seen = _spy_writes(env, monkeypatch, "er-td")
    await env.kube.writer.delete(EPHEMERAL_RUNNERS, env.key("er-td"))
    await env.wait_gone("er-td")
    assert [(verb, plural) for verb, plural, _ in seen] == [("patch", "ephemeralrunners")], seen
    assert seen[0][2] == {"metadata": {"finalizers": []}}
    assert cast(EphemeralRunnerStatus, er.status).runner_id not in await _service_ids(env)
    await _wait_collected(env, "er-td")


async def test_finished_runner_after_its_job_is_not_removed_again_at_the_service(runner_env: RunnerEnv) -> None:
    """An ephemeral runner that exited 0 after its job has deregistered at the service (which then
    answers 404 to a removal): its deletion makes no Actions call, and one status patch marked it
    finished (phase Succeeded with finishedAt, no finished-at annotation write)."""
    env = runner_env
    await env.create_er("er-fin")
    er, _ = await _registered(env, "er-fin")
    await env.kube.edit(EPHEMERAL_RUNNERS, env.key("er-fin"), {"status": {"jobId": "job-9"}}, status=True)
    from shared.actions import ActionsClient, PersonalAccessToken

    async with ActionsClient.from_config(env.sim.config_url(), PersonalAccessToken(env.sim.pat)) as client:
        await client.remove_runner(
            cast(EphemeralRunnerStatus, er.status).runner_id
        )  # the service drops it when its job ends
    await env.sim.control.clear_requests()
    await env.terminate("er-fin", 0, phase="Succeeded")
    done = await env.wait_finished("er-fin", "RunnerSucceeded")
    assert ANNOTATION_FINISHED_AT not in done.metadata.annotations
    await env.wait_gone("er-fin")  # released by the runner worker (no runner-set worker here)
    endpoints = [r.endpoint for r in await env.sim.control.requests() if r.method != "GET"]
    assert "remove_runner" not in endpoints, endpoints
    await _wait_collected(env, "er-fin")


async def test_exit_7_marks_outdated_and_removes_from_service(runner_env: RunnerEnv) -> None:
    env = runner_env
    await env.create_er("er-old")
    er, _ = await _registered(env, "er-old")
    await env.terminate("er-old", 7)

    async def outdated() -> EphemeralRunner | None:
        cur = await env.er("er-old")
        assert cur is not None and cur.status is not None
        return cur if cur.status.phase == "Outdated" else None

    cur = await wait_for(outdated, what="phase Outdated")
    assert cur is not None and cur.status is not None
    assert cur.status.reason == "Outdated"
    await wait_for(
        lambda: _not_registered(env, cast(EphemeralRunnerStatus, er.status).runner_id),
        what="runner removed from the service",
    )
    await wait_for(lambda: _pod_gone(env, "er-old"), what="pod of the outdated runner deleted")
    await env.wait_events("er-old", "RunnerOutdated")
    # the ER itself stays (the runner-set worker decides about Outdated runners)
    assert await env.er("er-old") is not None


async def _not_registered(env: RunnerEnv, runner_id: int) -> bool:
    return runner_id not in await _service_ids(env)


async def _pod_gone(env: RunnerEnv, name: str) -> bool:
    pod = await env.pod(name)
    return pod is None or pod.metadata.is_deleting


async def test_crash_backoff_then_failed_after_more_than_5_failures(runner_env: RunnerEnv) -> None:
    """ARC deletes the ER after the 6th failure; here it becomes Failed (TooManyPodFailures), is
    unregistered and its pod removed, so the set sees and counts it and replaces it after
    --failed-runner-ttl (tests/scenario/test_runner_set_failures.py)."""
    env = runner_env
    await env.create_er("er-crash")
    er, pod = await _registered(env, "er-crash")
    seen = set()
    for n in range(1, 7):
        seen.add(pod.metadata.uid)
        await env.terminate("er-crash", 1)
        if n <= 5:
            pod = await env.wait_pod("er-crash", other_than=pod.metadata.uid)
            assert pod.metadata.uid not in seen
            cur = await env.er("er-crash")
            assert cur is not None and cur.status is not None
            assert len(cur.status.failures) == n
            assert set(cur.status.failures) <= seen

    async def failed() -> EphemeralRunner | None:
        cur = await env.er("er-crash")
        return cur if cur is not None and cur.status is not None and cur.status.phase == "Failed" else None

    cur = await wait_for(failed, what="phase Failed")
    assert cur is not None and cur.status is not None
    assert cur.status.reason == "TooManyPodFailures" and "actions.github.com/failed-at" in cur.metadata.annotations
    await wait_for(
        lambda: _not_registered(env, cast(EphemeralRunnerStatus, er.status).runner_id),
        what="runner removed from the service",
    )
    await wait_for(lambda: _pod_gone(env, "er-crash"), what="pod removed")
    await env.wait_events("er-crash", "RunnerPodFailed", "TooManyPodFailures")


async def test_evicted_pod_is_recorded_and_recreated(runner_env: RunnerEnv) -> None:
    env = runner_env
    await env.create_er("er-evict")
    _, pod = await _registered(env, "er-evict")
    await env.set_pod_status(
        "er-evict", {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}
    )
    new = await env.wait_pod("er-evict", other_than=pod.metadata.uid)
    cur = await env.er("er-evict")
    assert cur is not None and cur.status is not None
    assert list(cur.status.failures) == [pod.metadata.uid]
    assert cur.status.reason == "Evicted"
    assert new.metadata.uid != pod.metadata.uid


async def test_init_container_failure_counts_as_failure(runner_env: RunnerEnv) -> None:
    env = runner_env
    await env.create_er("er-init")
    _, pod = await _registered(env, "er-init")
    await env.set_pod_status(
        "er-init",
        {
            "phase": "Pending",
            "initContainerStatuses": [
                {"name": "setup", "state": {"terminated": {"exitCode": 1, "reason": "StartError"}}}
            ],
        },
    )
    await env.wait_pod("er-init", other_than=pod.metadata.uid)
    assert len(cast(EphemeralRunnerStatus, cast(EphemeralRunner, await env.er("er-init")).status).failures) == 1


async def test_pod_deleted_externally_is_recreated_exactly_once(runner_env: RunnerEnv) -> None:
    env = runner_env
    await env.create_er("er-del")
    er, pod = await _registered(env, "er-del")
    created_before = env.reconciler.metrics.pods_created._value.get()
    from shared.kube import PODS

    await env.kube.writer.delete(PODS, env.key("er-del"), uid=pod.metadata.uid)
    new = await env.wait_pod("er-del", other_than=pod.metadata.uid)
    # let any late wake-ups (the DELETED event, the create's own ADDED) be processed
    await wait_for(
        lambda: len(env.worker.ctx.controllers[0].queue) == 0 and not env.worker.ctx.controllers[0].queue.processing,
        what="queue drained",
    )
    assert env.reconciler.metrics.pods_created._value.get() == created_before + 1
    assert (await env.pod("er-del")).metadata.uid == new.metadata.uid
    cur = await env.er("er-del")
    assert cur is not None and cur.status is not None
    assert cur.status.failures == {}  # not a failure
    assert await _service_ids(env) == {cast(EphemeralRunnerStatus, er.status).runner_id}  # no second registration


async def test_pod_lost_while_running_a_job_deletes_the_runner(runner_env: RunnerEnv) -> None:
    env = runner_env
    await env.create_er("er-lost")
    _er, pod = await _registered(env, "er-lost")
    await env.kube.edit(
        EPHEMERAL_RUNNERS, env.key("er-lost"), {"status": {"jobId": "job-1", "jobRequestId": 11}}, status=True
    )
    from shared.kube import PODS

    await env.kube.writer.delete(PODS, env.key("er-lost"), uid=pod.metadata.uid)
    await env.wait_finished("er-lost", "PodLostWithJob")  # finished: never a new pod for a spent JIT config
    await env.wait_gone("er-lost")
    await env.wait_events("er-lost", "PodLostWithJob")


async def test_failure_with_job_deletes_the_runner(runner_env: RunnerEnv) -> None:
    env = runner_env
    await env.create_er("er-jobfail")
    await _registered(env, "er-jobfail")
    await env.kube.edit(EPHEMERAL_RUNNERS, env.key("er-jobfail"), {"status": {"jobId": "job-2"}}, status=True)
    await env.terminate("er-jobfail", 1, phase="Running")
    await env.wait_finished("er-jobfail", "PodFailedWithJob")
    await env.wait_gone("er-jobfail")


async def test_running_pod_status_is_copied(runner_env: RunnerEnv) -> None:
    env = runner_env
    await env.create_er("er-run")
    await _registered(env, "er-run")
    await env.run("er-run")

    async def running() -> bool:
        cur = await env.er("er-run")
        assert cur is not None and cur.status is not None
        return cur.status.phase == "Running" and cur.status.ready

    await wait_for(running, what="ER Running and ready")
    # pod phase Succeeded while the runner container still runs: the ER stays Running
    await env.set_pod_status("er-run", {"phase": "Succeeded"})
    await wait_for(running, what="still Running")


async def test_deletion_unregisters_and_releases_finalizers(runner_env: RunnerEnv) -> None:
    env = runner_env
    await env.create_er("er-gone")
    er, _ = await _registered(env, "er-gone")
    await env.kube.writer.delete(EPHEMERAL_RUNNERS, env.key("er-gone"))
    await env.wait_gone("er-gone")
    assert cast(EphemeralRunnerStatus, er.status).runner_id not in await _service_ids(env)


async def test_deletion_when_service_no_longer_knows_the_runner(runner_env: RunnerEnv) -> None:
    env = runner_env
    await env.create_er("er-unknown")
    er, _ = await _registered(env, "er-unknown")
    from shared.actions import ActionsClient, PersonalAccessToken

    async with ActionsClient.from_config(env.sim.config_url(), PersonalAccessToken(env.sim.pat)) as client:
        await client.remove_runner(cast(EphemeralRunnerStatus, er.status).runner_id)
    await env.kube.writer.delete(EPHEMERAL_RUNNERS, env.key("er-unknown"))
    await env.wait_gone("er-unknown")
    assert "RunnerRemovalFailed" not in await env.event_reasons("er-unknown")


# --- container-hook leftovers (README "runner worker", container-hook cleanup) ----------------------------


async def _hook_leftovers(env: RunnerEnv, name: str) -> None:
    """What Kubernetes-mode container hooks leave for runner ``name``: a job pod and an env Secret
    labelled only ``runner-pod=<name>`` (no ownerReference), plus a Secret of someone else."""
    labels = {LABEL_RUNNER_POD: name}
    await env.kube.writer.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{name}-workflow", "namespace": env.namespace, "labels": labels},
            "spec": {"containers": [{"name": "job", "image": "busybox"}], "restartPolicy": "Never"},
        },
    )
    for secret, secret_labels in ((f"{name}-env", labels), (f"{name}-other", {LABEL_RUNNER_POD: "someone-else"})):
        await env.kube.writer.create(
            SECRETS,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret, "namespace": env.namespace, "labels": secret_labels},
                "data": {"K": base64.b64encode(b"v").decode()},
            },
        )


async def _delete_hook_runner(env: RunnerEnv, name: str) -> None:
    hooks = runner_template(env=[{"name": ENV_RUNNER_CONTAINER_HOOKS, "value": "/home/runner/k8s/index.js"}])
    await env.create_er(name, template=hooks)
    await _registered(env, name)
    await _hook_leftovers(env, name)
    await env.kube.writer.delete(EPHEMERAL_RUNNERS, env.key(name))
    await env.wait_gone(name)

    async def hook_pod_gone() -> bool:
        pod = await env.pod(f"{name}-workflow")
        return pod is None or pod.metadata.is_deleting

    await wait_for(hook_pod_gone, what="hook pod deleted")


async def test_deletion_leaves_hook_secrets_alone_by_default(runner_env: RunnerEnv) -> None:
    """Default: no Secret list (least privilege); the hook's own pruneSecrets handles its Secrets.
    The cleanup ran before the finalizer went, so the ER being gone settles it."""
    env = runner_env
    assert env.reconciler.settings.cleanup_hook_secrets is False
    await _delete_hook_runner(env, "er-hooks")
    assert await env.secret_of("er-hooks-env") is not None
    assert await env.secret_of("er-hooks-other") is not None


async def test_deletion_removes_hook_secrets_when_enabled(
    kube: Kube,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
) -> None:
    settings = msgspec.structs.replace(FAST, cleanup_hook_secrets=True)
    async with start_runner_env(kube, namespace, actions_sim, github_secret, worker_settings, settings=settings) as env:
        await _delete_hook_runner(env, "er-hooks")

        async def env_secret_gone() -> bool:
            secret = await env.secret_of("er-hooks-env")
            return secret is None or secret.metadata.is_deleting

        await wait_for(env_secret_gone, what="hook Secret deleted")
        assert await env.secret_of("er-hooks-other") is not None  # another runner's: label-selected away
