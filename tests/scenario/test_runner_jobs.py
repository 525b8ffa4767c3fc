"""Job events from the bus land on EphemeralRunner status, idempotently and order-insensitively."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import pytest

from services.runner.jobs import ANNOTATION_JOB_COMPLETED  # type: ignore[attr-defined]  # imported there from shared.api
from services.runner.reconciler import RunnerReconciler
from shared.api import EphemeralRunner, EphemeralRunnerStatus
from shared.bus import Bus, Redeliver, ResourceRef
from shared.bus.messages import JobCompleted, JobStarted
from shared.bus.subjects import job_started_subject
from shared.kube import EPHEMERAL_RUNNERS
from shared.worker import WorkerSettings
from tests.fixtures.actions_sim import ActionsSim
from tests.scenario.conftest import Kube, wait_for
from tests.scenario.test_runner_helpers import SCALE_SET, CountingReader, RunnerEnv

pytestmark = pytest.mark.anyio

E = TypeVar("E", JobStarted, JobCompleted)


async def _registered(env: RunnerEnv, name: str) -> EphemeralRunner:
    async def rid() -> EphemeralRunner | None:
        er = await env.er(name)
        return er if er is not None and er.status is not None and er.status.runner_id else None

    return await wait_for(rid, what=f"{name} registered")


def _event(cls: type[E], env: RunnerEnv, er: EphemeralRunner, job_id: str = "job-77", **extra: Any) -> E:
    assert er.status is not None
    return cls(
        scale_set_id=env.scale_set_id,
        scale_set=ResourceRef(env.namespace, SCALE_SET),
        runner_name=er.metadata.name,
        runner_id=er.status.runner_id,
        job_id=job_id,
        runner_request_id=7701,
        workflow_run_id=9901,
        workflow_ref="octo-org/octo-repo/.github/workflows/ci.yml@refs/heads/main",
        job_display_name="build",
        repository="octo-org/octo-repo",
        **extra,
    )


def _job_fields(er: EphemeralRunner | None) -> tuple[object, ...]:
    assert er is not None and er.status is not None
    s = er.status
    return (
        s.job_id,
        s.job_request_id,
        s.workflow_run_id,
        s.job_workflow_ref,
        s.job_display_name,
        s.job_repository_name,
    )


EXPECTED = (
    "job-77",
    7701,
    9901,
    "octo-org/octo-repo/.github/workflows/ci.yml@refs/heads/main",
    "build",
    "octo-org/octo-repo",
)


async def test_job_started_from_the_bus_sets_status_fields(runner_env: RunnerEnv, bus: Bus) -> None:
    env = runner_env
    await env.create_er("er-job")
    er = await _registered(env, "er-job")
    await bus.publish(_event(JobStarted, env, er))

    async def recorded() -> EphemeralRunner | None:
        cur = await env.er("er-job")
        return cur if _job_fields(cur) == EXPECTED else None

    cur = await wait_for(recorded, what="job fields on status")
    # a duplicate (redelivery) changes nothing: no write, same resourceVersion
    assert await env.reconciler.handle_job_event(_event(JobStarted, env, er)) == "unchanged"
    assert cast(EphemeralRunner, await env.er("er-job")).metadata.resource_version == cur.metadata.resource_version
    # the job completes: annotation written once; a late JobStarted never undoes it
    await bus.publish(_event(JobCompleted, env, er, result="succeeded"))

    async def completed() -> EphemeralRunner | None:
        cur = await env.er("er-job")
        assert cur is not None
        return cur if ANNOTATION_JOB_COMPLETED in cur.metadata.annotations else None

    done = await wait_for(completed, what="completion recorded")
    assert await env.reconciler.handle_job_event(_event(JobStarted, env, er)) == "unchanged"
    after = await env.er("er-job")
    assert after is not None
    assert _job_fields(after) == EXPECTED
    assert after.metadata.annotations[ANNOTATION_JOB_COMPLETED] == done.metadata.annotations[ANNOTATION_JOB_COMPLETED]


async def test_completed_before_started_converges(runner_env: RunnerEnv) -> None:
    env = runner_env
    await env.create_er("er-ooo")
    er = await _registered(env, "er-ooo")
    assert await env.reconciler.handle_job_event(_event(JobCompleted, env, er, result="failed")) == "recorded"
    first = await env.er("er-ooo")
    assert first is not None
    assert _job_fields(first) == EXPECTED
    assert "result=failed" in first.metadata.annotations[ANNOTATION_JOB_COMPLETED]
    assert await env.reconciler.handle_job_event(_event(JobStarted, env, er)) == "unchanged"
    assert await env.reconciler.handle_job_event(_event(JobCompleted, env, er, result="failed")) == "unchanged"
    assert cast(EphemeralRunner, await env.er("er-ooo")).metadata.resource_version == first.metadata.resource_version


async def test_events_for_other_jobs_runners_and_garbage_are_ignored(runner_env: RunnerEnv, bus: Bus) -> None:
    env = runner_env
    await env.create_er("er-a1")
    er = await _registered(env, "er-a1")
    await env.reconciler.handle_job_event(_event(JobStarted, env, er))
    # another job for the same runner (an ephemeral runner runs one job): ignored
    assert await env.reconciler.handle_job_event(_event(JobStarted, env, er, job_id="job-other")) == "other_job"
    # an unknown runner name, a wrong runner id: ignored, not errors
    ghost = _event(JobStarted, env, er)
    ghost = JobStarted(**{**{f: getattr(ghost, f) for f in ghost.__struct_fields__}, "runner_name": "nobody"})
    assert await env.reconciler.handle_job_event(ghost) == "unknown_runner"
    wrong = _event(JobStarted, env, er, job_id="job-77")
    wrong = JobStarted(
        **{
            **{f: getattr(wrong, f) for f in wrong.__struct_fields__},
            "runner_id": cast(EphemeralRunnerStatus, er.status).runner_id + 1000,
        }
    )
    assert await env.reconciler.handle_job_event(wrong) == "mismatch"
    # garbage on the subject does not stop the consumer: a later good event still lands
    await bus.js.publish(job_started_subject(env.namespace, SCALE_SET), b"{not json")
    await env.create_er("er-a2")
    er2 = await _registered(env, "er-a2")
    await bus.publish(_event(JobStarted, env, er2, job_id="job-88"))

    async def landed() -> bool:
        cur = await env.er("er-a2")
        assert cur is not None and cur.status is not None
        return cur.status.job_id == "job-88"

    await wait_for(landed, what="event after garbage recorded")
    assert cast(EphemeralRunnerStatus, cast(EphemeralRunner, await env.er("er-a1")).status).job_id == "job-77"


async def test_runner_still_up_after_its_job_completed_is_reclaimed(
    kube: Kube,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
) -> None:
    from msgspec.structs import replace

    from tests.scenario.test_runner_helpers import FAST, start_runner_env

    async with start_runner_env(
        kube, namespace, actions_sim, github_secret, worker_settings, settings=replace(FAST, hung_after_job_grace=1.0)
    ) as env:
        await env.create_er("er-hung")
        er = await _registered(env, "er-hung")
        await env.wait_pod("er-hung")
        await env.run("er-hung")
        await env.reconciler.handle_job_event(_event(JobStarted, env, er))
        await env.reconciler.handle_job_event(_event(JobCompleted, env, er, result="succeeded"))
        # the runner never exits: after the grace period the worker gives the slot back
        await env.wait_finished("er-hung", "RunnerHungAfterJob", timeout=15)  # its pod is deleted
        await env.wait_gone("er-hung", timeout=15)
        await env.wait_events("er-hung", "RunnerHungAfterJob")


async def test_job_events_that_write_nothing_are_decided_on_the_cache(runner_env: RunnerEnv) -> None:
    """A deferral and an event the cached runner records already read no ER; a write, or a cached
    copy older than what the worker has seen, reads it from the server."""
    env = runner_env
    await env.create_er("er-cached")
    er = await _registered(env, "er-cached")
    worker = env.reconciler
    counting = CountingReader(env.kube.client, EPHEMERAL_RUNNERS)
    # A second reconciler on the worker's ER cache, driven only by this test (the worker's own
    # passes make their own reads).
    rec = RunnerReconciler(
        counting, worker.writer, worker.events, worker.clients, worker.settings, cached_er=worker._cached_er
    )
    key = env.key("er-cached")

    def cached_is(rv: str) -> bool:
        assert rec._cached_er is not None
        cur = rec._cached_er(key)
        return cur is not None and cur.metadata.resource_version == rv

    current = await env.er("er-cached")
    assert current is not None
    await wait_for(lambda: cached_is(current.metadata.resource_version), what="the cache caught up")
    # The first delivery of JobStarted on an active runner is deferred: no GET.
    with pytest.raises(Redeliver):
        await rec.handle_job_event(_event(JobStarted, env, er), delivery=1)
    assert counting.gets == 0
    # Its redelivery writes the fields: decided on a GET.
    assert await rec.handle_job_event(_event(JobStarted, env, er), delivery=2) == "recorded"
    assert counting.gets == 1
    recorded = await env.er("er-cached")
    assert recorded is not None and _job_fields(recorded) == EXPECTED
    await wait_for(lambda: cached_is(recorded.metadata.resource_version), what="the cache caught up")
    # A duplicate that the cached copy records already: unchanged, no GET.
    assert await rec.handle_job_event(_event(JobStarted, env, er), delivery=3) == "unchanged"
    assert counting.gets == 1
    # A cached copy older than what the reconciler has seen is not used.
    rec._seen_rv[key] = int(recorded.metadata.resource_version) + 1000
    assert await rec.handle_job_event(_event(JobStarted, env, er), delivery=3) == "unchanged"
    assert counting.gets == 2
