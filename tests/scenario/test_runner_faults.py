"""The runner worker under faults: JIT name collisions, a garbled JIT answer, 409s from the API
server, a pod that never starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import msgspec
import pytest

from services.runner.reconciler import OWN_FINALIZERS
from shared.actions import ActionsClient, PersonalAccessToken
from shared.api import EphemeralRunner, EphemeralRunnerStatus
from shared.kube import EPHEMERAL_RUNNERS, PODS, SECRETS, ObjectKey
from shared.worker import WorkerSettings
from tests.fixtures.actions_sim import ActionsSim
from tests.fixtures.apiserver import KubeApi
from tests.scenario.conftest import Kube, wait_for
from tests.scenario.test_runner_helpers import FAST, RunnerEnv, register_scale_set, start_runner_env

pytestmark = pytest.mark.anyio


async def _runner_id(env: RunnerEnv, name: str) -> int | None:
    er = await env.er(name)
    return er.status.runner_id if er is not None and er.status is not None and er.status.runner_id else None


async def test_runner_exists_in_same_scale_set_is_removed_and_registered_again(runner_env: RunnerEnv) -> None:
    env = runner_env
    async with ActionsClient.from_config(env.sim.config_url(), PersonalAccessToken(env.sim.pat)) as client:
        stale = await client.generate_jit_config(env.scale_set_id, "er-dup")
    await env.create_er("er-dup")
    runner_id = await wait_for(lambda: _runner_id(env, "er-dup"), what="registered again")
    assert runner_id != stale.runner.id
    named = [r for r in await env.service_runners() if r.name == "er-dup"]
    assert [r.id for r in named] == [runner_id]
    await env.wait_events("er-dup", "StaleRegistrationRemoved")
    await env.wait_pod("er-dup")


async def test_runner_name_taken_by_another_scale_set_deletes_the_er(runner_env: RunnerEnv) -> None:
    env = runner_env
    other = await register_scale_set(env.sim, "another-set")
    async with ActionsClient.from_config(env.sim.config_url(), PersonalAccessToken(env.sim.pat)) as client:
        theirs = await client.generate_jit_config(other, "er-taken")
    await env.create_er("er-taken")
    await env.wait_gone("er-taken")
    await env.wait_events("er-taken", "RunnerNameTaken")
    # the other scale set's runner is untouched
    assert theirs.runner.id in {r.id for r in await env.sim.control.runners()}


async def test_garbled_jit_config_is_an_event_and_recovers(runner_env: RunnerEnv) -> None:
    env = runner_env
    await env.sim.control.set_fault(
        "generate_jit_config", kind="status", status=200, body='{"runner": "garbage"', count=None
    )
    await env.create_er("er-garbled")

    async def warned() -> bool:
        return "JitConfigFailed" in await env.event_reasons("er-garbled")

    await wait_for(warned, what="JitConfigFailed event")
    assert await env.secret_of("er-garbled") is None
    # the worker stays healthy: another runner in another state still gets handled meanwhile
    assert not env.worker.done
    await env.sim.control.clear_faults()
    await wait_for(lambda: _runner_id(env, "er-garbled"), timeout=30, what="registered after the fault cleared")
    await env.wait_pod("er-garbled")
    # well-formed JSON, but an unusable answer (no runner id, no config): same treatment
    await env.sim.control.set_fault(
        "generate_jit_config",
        kind="status",
        status=200,
        body='{"runner": {"id": 0}, "encodedJITConfig": ""}',
        count=None,
    )
    await env.create_er("er-empty")

    async def unusable() -> bool:
        return any(e.reason == "JitConfigFailed" and "unusable" in e.message for e in await env.events("er-empty"))

    await wait_for(unusable, what="unusable JIT config event")
    assert await env.secret_of("er-empty") is None
    await env.sim.control.clear_faults()
    await wait_for(lambda: _runner_id(env, "er-empty"), timeout=30, what="registered after the second fault cleared")


async def test_conflicts_on_status_patch_converge(runner_env: RunnerEnv, kube_api: KubeApi) -> None:
    env = runner_env
    control = kube_api.require_emulator()
    await control.add_fault_async(
        action="error",
        code=409,
        verb="patch",
        resource="ephemeralrunners",
        subresource="status",
        namespace=env.namespace,
        times=3,
    )
    await env.create_er("er-409")
    await wait_for(lambda: _runner_id(env, "er-409"), what="runnerId despite 409s")
    _, pod = await _pod(env, "er-409")
    await control.add_fault_async(
        action="error",
        code=409,
        verb="patch",
        resource="ephemeralrunners",
        subresource="status",
        namespace=env.namespace,
        times=2,
    )
    await env.terminate("er-409", 1)
    await env.wait_pod("er-409", other_than=pod.metadata.uid)
    assert len(cast(EphemeralRunnerStatus, cast(EphemeralRunner, await env.er("er-409")).status).failures) == 1


async def test_503_on_the_jit_secret_create_registers_the_runner_once(runner_env: RunnerEnv, kube_api: KubeApi) -> None:
    """The JIT config from the service is kept until its Secret is written: an API-server error on
    the create is retried with the same registration, never a new one (issue 11)."""
    env = runner_env
    control = kube_api.require_emulator()
    await control.add_fault_async(
        action="error", code=503, verb="create", resource="secrets", namespace=env.namespace, times=2
    )
    await env.sim.control.clear_requests()
    await env.create_er("er-503")
    runner_id = await wait_for(lambda: _runner_id(env, "er-503"), what="runnerId despite 503s")
    await env.wait_pod("er-503")
    named = [r for r in await env.service_runners() if r.name == "er-503"]
    assert [r.id for r in named] == [runner_id]
    endpoints = [r.endpoint for r in await env.sim.control.requests() if r.method != "GET"]
    assert endpoints.count("generate_jit_config") == 1, endpoints
    assert "remove_runner" not in endpoints
    assert "StaleRegistrationRemoved" not in await env.event_reasons("er-503")


async def test_credentials_gone_on_deletion_is_quiet_bounded_and_released(
    kube: Kube,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
) -> None:
    """The GitHub Secret is gone (its namespace is being deleted) while a registered runner is
    deleted: no reconcile-error loop, one Event, and the ER is released once its pod is gone and
    --removal-give-up-after has passed (issue 11)."""
    settings = msgspec.structs.replace(FAST, removal_give_up_after=1.0)
    async with start_runner_env(kube, namespace, actions_sim, github_secret, worker_settings, settings=settings) as env:
        await env.create_er("er-nocreds")
        await env.wait_pod("er-nocreds")
        await wait_for(lambda: _runner_id(env, "er-nocreds"), what="registered")
        registry = env.worker.ctx.registry
        errors = {"controller": "ephemeralrunner"}
        before = registry.get_sample_value("controller_runtime_reconcile_errors_total", errors) or 0.0
        # The pool uses a credentials read up to its max_age old (README "`ActionsClientPool`"):
        # with 0 the deletion is seen by the very next call, as this test needs.
        env.worker.ctx.actions.max_age = 0
        await kube.writer.delete(SECRETS, ObjectKey(namespace, github_secret))
        await kube.writer.delete(EPHEMERAL_RUNNERS, env.key("er-nocreds"))
        await kube.writer.delete(PODS, env.key("er-nocreds"))  # as the namespace controller does
        await env.wait_gone("er-nocreds")
        after = registry.get_sample_value("controller_runtime_reconcile_errors_total", errors) or 0.0
        assert after == before
        await env.wait_events("er-nocreds", "RunnerRemovalAbandoned")  # Event lists lag their writes
        reasons = [e.reason for e in await env.events("er-nocreds")]
        assert reasons.count("ActionsCredentialsUnavailable") == 1 and "RunnerRemovalFailed" not in reasons
        assert "RunnerRemovalAbandoned" in reasons


async def test_pod_lost_right_after_a_job_started_deletes_the_runner(
    runner_env: RunnerEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race behind test_pod_lost_while_running_a_job_deletes_the_runner timing out under load:
    the worker's ER (from its cache) has no job yet, the job is recorded and the pod vanishes, then
    the worker finds no pod (its informer already saw the deletion). It must not create a new pod
    (for a spent JIT config) from the stale ER: it re-reads the ER from the server first, sees the
    job, and finishes the runner (issue 11). Here the worker's ER cache is held at the version
    without the job for the rest of the test (a cache that lags as long as it likes)."""
    env = runner_env
    await env.create_er("er-race")
    await wait_for(lambda: _runner_id(env, "er-race"), what="registered")
    pod = await env.wait_pod("er-race")
    stale = await env.er("er-race")  # no job yet: what the worker's cache will keep answering
    assert stale is not None and stale.status is not None and not stale.status.job_id
    real_cached: Callable[[ObjectKey], EphemeralRunner | None] = env.reconciler._cached_er

    def cached(key: ObjectKey) -> EphemeralRunner | None:
        return stale if key == env.key("er-race") else real_cached(key)

    monkeypatch.setattr(env.reconciler, "_cached_er", cached)
    await env.kube.edit(
        EPHEMERAL_RUNNERS, env.key("er-race"), {"status": {"jobId": "job-1", "jobRequestId": 11}}, status=True
    )
    await env.kube.writer.delete(PODS, env.key("er-race"), uid=pod.metadata.uid)
    await env.wait_finished("er-race", "PodLostWithJob")
    await env.wait_gone("er-race")
    await env.wait_events("er-race", "PodLostWithJob")  # a list of Events lags its writes (real API server)


async def test_cache_lagging_the_workers_own_writes_does_not_register_again(
    runner_env: RunnerEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read-your-writes (issue 10, module docstring of services/runner/reconciler.py): the ER
    cache is held at the version the worker first saw (finalizers set, no runner id: the ER as the
    runner-set worker creates it). After the worker's own status patch with the runner id, its
    later passes must not decide on that older copy, which would call the Actions service for a
    JIT config again (answered RunnerExists)."""
    env = runner_env
    frozen: dict[ObjectKey, EphemeralRunner] = {}
    real_cached: Callable[[ObjectKey], EphemeralRunner | None] = env.reconciler._cached_er

    def cached(key: ObjectKey) -> EphemeralRunner | None:
        if key != env.key("er-ryw"):
            return real_cached(key)
        if key not in frozen:
            found = real_cached(key)
            if found is None:
                return None
            frozen[key] = found
        return frozen[key]

    monkeypatch.setattr(env.reconciler, "_cached_er", cached)
    registry = env.worker.ctx.registry
    exists = ("runnerscale_runner_jit_configs_total", {"result": "runner_exists"})
    before = registry.get_sample_value(*exists) or 0.0
    await env.create_er("er-ryw", finalizers=OWN_FINALIZERS)
    runner_id = await wait_for(lambda: _runner_id(env, "er-ryw"), what="registered")
    await env.wait_pod("er-ryw")
    await env.run("er-ryw")  # the worker's next pass records phase Running

    async def running() -> bool:
        er = await env.er("er-ryw")
        return er is not None and er.status is not None and er.status.phase == "Running"

    await wait_for(running, what="phase Running recorded")
    assert frozen, "the worker never read its ER cache"
    assert (registry.get_sample_value(*exists) or 0.0) == before
    final = await env.er("er-ryw")
    assert final is not None and final.status is not None and final.status.runner_id == runner_id


async def _pod(env: RunnerEnv, name: str) -> tuple[EphemeralRunner | None, Any]:
    pod = await env.wait_pod(name)
    return await env.er(name), pod


async def test_pod_that_never_starts_is_deleted_and_unregistered(
    kube: Kube,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
) -> None:
    from msgspec.structs import replace

    settings = replace(FAST, pod_start_deadline=1.0)
    async with start_runner_env(kube, namespace, actions_sim, github_secret, worker_settings, settings=settings) as env:
        await env.create_er("er-stuck")
        runner_id = await wait_for(lambda: _runner_id(env, "er-stuck"), what="registered")
        await env.wait_pod("er-stuck")
        await env.wait_gone("er-stuck", timeout=15)
        assert runner_id not in {r.id for r in await env.service_runners()}
        await env.wait_events("er-stuck", "PodStartTimeout")


async def test_invalid_pod_template_marks_failed(runner_env: RunnerEnv) -> None:
    env = runner_env
    template = {"metadata": {}, "spec": {"containers": [{"name": "not-runner", "image": "x"}]}}
    await env.create_er("er-invalid", template=template)

    async def failed() -> EphemeralRunner | None:
        er = await env.er("er-invalid")
        assert er is not None
        return er if er.status is not None and er.status.phase == "Failed" else None

    er = await wait_for(failed, what="phase Failed")
    assert er.status is not None
    assert er.status.reason == "InvalidPod"
    assert await env.pod("er-invalid") is None
    # found before registering: no runner at the service, no finalizers, no Secret (one metadata
    # patch — the failed-at stamp — and one status patch in that pass)
    assert "er-invalid" not in {r.name for r in await env.service_runners()}
    assert er.metadata.finalizers == []
    assert await env.secret_of("er-invalid") is None
    await env.kube.writer.delete(EPHEMERAL_RUNNERS, env.key("er-invalid"))
    await env.wait_gone("er-invalid")


async def test_invalid_spec_is_failed_with_an_event_and_deletes_cleanly(runner_env: RunnerEnv) -> None:
    env = runner_env
    await env.create_er("er-bad", scale_set_id=-1)

    async def failed() -> EphemeralRunner | None:
        er = await env.er("er-bad")
        assert er is not None
        return er if er.status is not None and er.status.phase == "Failed" else None

    er = await wait_for(failed, what="phase Failed")
    assert er.status is not None
    assert er.status.reason == "InvalidSpec" and "runnerScaleSetId" in er.status.message
    await env.wait_events("er-bad", "InvalidSpec")
    assert await env.secret_of("er-bad") is None
    await env.kube.writer.delete(EPHEMERAL_RUNNERS, env.key("er-bad"))
    await env.wait_gone("er-bad")
