"""Issue 10: the runner worker's writes per runner life, against the API emulator (or a real
control plane) and NATS.

- A runner pod that starts normally costs ONE status write for the runner id and its first phase
  that is not Pending; only a pod that stays Pending for ``--pending-status-after`` has Pending
  written (with the runner id) on its own.
- A runner that exits 0 after a short job ends with ONE metadata patch (the ``job-completed``
  mark it heard on the bus and both finalizers) and ONE status patch (the job fields of the
  deferred JobStarted and Succeeded); its deletion then needs no teardown pass.
- A JobCompleted that arrives before the EphemeralRunner shows its job is redelivered later
  (``shared.bus.Redeliver``) instead of writing the job fields a second time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from msgspec.structs import replace

from shared.api import EphemeralRunner
from shared.api.constants import ANNOTATION_JOB_COMPLETED
from shared.bus import Bus
from shared.bus.messages import JobCompleted, JobStarted
from shared.kube import EPHEMERAL_RUNNERS, ObjectKey, Resource
from shared.worker import WorkerSettings
from tests.bus.conftest import metric
from tests.fixtures.actions_sim import ActionsSim
from tests.scenario.conftest import Kube, wait_for
from tests.scenario.test_runner_helpers import FAST, RunnerEnv, start_runner_env
from tests.scenario.test_runner_jobs import _event

pytestmark = pytest.mark.anyio


class Writes:
    """The ER writes of the runner worker under test, in order: ("status" | "merge", body)."""

    def __init__(self, env: RunnerEnv, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.items: list[tuple[str, dict[str, Any]]] = []
        self.passes: list[float] = []
        rec = env.reconciler
        real_status, real_merge, real_pass = rec.writer.patch_status, rec.writer.patch_merge, rec._reconcile
        key = env.key(name)

        async def patch_status(resource: Resource[Any], k: ObjectKey | str, body: Any, *a: Any, **kw: Any) -> Any:
            if resource is EPHEMERAL_RUNNERS and k == key:
                self.items.append(("status", body))
            return await real_status(resource, k, body, *a, **kw)

        async def patch_merge(resource: Resource[Any], k: ObjectKey | str, body: Any, *a: Any, **kw: Any) -> Any:
            if resource is EPHEMERAL_RUNNERS and k == key:
                self.items.append(("merge", body))
            return await real_merge(resource, k, body, *a, **kw)

        async def one_pass(k: ObjectKey, **kw: Any) -> Any:
            started = anyio.current_time()
            try:
                return await real_pass(k, **kw)
            finally:
                if k == key:
                    self.passes.append(started)

        monkeypatch.setattr(rec.writer, "patch_status", patch_status)
        monkeypatch.setattr(rec.writer, "patch_merge", patch_merge)
        monkeypatch.setattr(rec, "_reconcile", one_pass)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [body for k, body in self.items if k == kind]


EnvOf = Callable[..., Any]


@pytest.fixture
def env_with(
    kube: Kube,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
) -> EnvOf:
    """``async with env_with(**settings) as env``: the runner worker with FAST and these settings."""

    def make(**settings: Any) -> Any:
        return start_runner_env(
            kube, namespace, actions_sim, github_secret, worker_settings, settings=replace(FAST, **settings)
        )

    return make


PENDING = {
    "phase": "Pending",
    "containerStatuses": [
        {"name": "runner", "ready": False, "restartCount": 0, "image": "x", "state": {"waiting": {}}}
    ],
}


async def test_a_runner_that_starts_normally_writes_its_id_with_running_in_one_status_patch(
    env_with: EnvOf,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = "er-normal"
    async with _pending_pod(env_with(pending_status_after=60.0), name, monkeypatch) as (env, writes, after):
        await wait_for(lambda: any(t >= after for t in writes.passes), what="a pass that saw the Pending pod")
        assert writes.of("status") == [], writes.items  # no Pending, no runner id alone
        er = await env.er(name)
        assert er is not None and (er.status is None or not er.status.runner_id)
        await env.run(name)

        async def running() -> EphemeralRunner | None:
            cur = await env.er(name)
            ok = cur is not None and cur.status is not None and cur.status.phase == "Running"
            return cur if ok else None

        er = await wait_for(running, what=f"{name} Running")
        assert er.status is not None
        runners = await env.service_runners()
        assert [r.id for r in runners] == [er.status.runner_id]  # registered once: the id was kept
        assert writes.of("status") == [
            {
                "status": {
                    "runnerId": er.status.runner_id,
                    "runnerName": name,
                    "phase": "Running",
                    "ready": True,
                    "reason": "",
                    "message": "",
                }
            }
        ]
        assert env.reconciler.metrics.jit_configs.labels("ok")._value.get() == 1


async def test_a_pod_that_stays_pending_has_pending_written_with_the_runner_id_after_the_setting(
    env_with: EnvOf,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No pod event comes after the Pending one: the worker looks again when the setting has passed."""
    name = "er-stuck"
    # The setting must outlast the gap between the worker's pod create and the test's Pending
    # write: once it passes on a pod with no phase yet, the worker rightly writes the runner id
    # on its own (seen on a loaded CI machine with 1 s).
    async with _pending_pod(env_with(pending_status_after=3.0), name, monkeypatch) as (env, writes, _):

        async def pending() -> EphemeralRunner | None:
            cur = await env.er(name)
            ok = cur is not None and cur.status is not None and cur.status.phase == "Pending"
            return cur if ok else None

        er = await wait_for(pending, timeout=20, what=f"{name} Pending written")
        assert er.status is not None and er.status.runner_id
        assert [set(body["status"]) for body in writes.of("status")] == [
            {"runnerId", "runnerName", "phase", "ready", "reason", "message"}
        ]


async def test_a_short_job_costs_one_status_and_one_metadata_patch_from_start_to_exit_0(
    env_with: EnvOf,
    bus: Bus,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """JobStarted and JobCompleted are deferred; the runner's exit 0 writes the end-of-life
    metadata patch (mark + finalizers) and then ONE status patch (job fields + Succeeded); the
    delete needs no teardown patch. The deferral is long here: the exit, not a redelivery, writes."""
    name = "er-exit0"
    async with _running_runner(env_with(job_event_defer=30.0), name, monkeypatch) as (env, er, writes):
        events = env.reconciler.metrics.job_events
        started_before = events.labels("started", "deferred")._value.get()
        completed_before = events.labels("completed", "deferred")._value.get()
        started = _event(JobStarted, env, er)
        await bus.publish(started)
        await wait_for(lambda: events.labels("started", "deferred")._value.get() > started_before, what="deferred")
        completed = _event(JobCompleted, env, er, result="succeeded")
        await bus.publish(completed)
        await wait_for(lambda: events.labels("completed", "deferred")._value.get() > completed_before, what="deferred")
        assert writes.items == []  # both wait for the runner's end
        await env.terminate(name, 0, phase="Succeeded")
        done = await env.wait_finished(name, "RunnerSucceeded")
        assert done.status is not None and done.status.finished_at is not None
        assert done.status.job_id == started.job_id and done.status.job_display_name == started.job_display_name
        assert [k for k, _ in writes.items] == ["merge", "status"], writes.items
        meta = writes.of("merge")[0]["metadata"]
        assert meta["finalizers"] == []
        assert meta["annotations"][ANNOTATION_JOB_COMPLETED].startswith(f"job={completed.job_key()};")
        assert writes.of("status")[0]["status"]["phase"] == "Succeeded"
        assert writes.of("status")[0]["status"]["jobId"] == started.job_id
        # the runner worker releases it itself here (no runner-set; FAST.finished_release_after):
        # the delete needs no teardown patch
        await env.wait_gone(name)
        assert [k for k, _ in writes.items] == ["merge", "status"], writes.items


async def test_job_completed_before_the_runner_shows_the_job_is_redelivered_not_written_twice(
    env_with: EnvOf,
    bus: Bus,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = "er-early"
    async with _running_runner(env_with(job_event_defer=0.3), name, monkeypatch) as (env, er, writes):
        bus_deferred = metric("runnerscale_bus_deferred_messages_total", subject_kind="job_completed")
        completed = _event(JobCompleted, env, er, result="failed")
        await bus.publish(completed)
        await wait_for(
            lambda: metric("runnerscale_bus_deferred_messages_total", subject_kind="job_completed") > bus_deferred,
            what="JobCompleted deferred by the bus",
        )
        assert writes.items == []  # neither the job fields nor the mark from the early JobCompleted
        await bus.publish(_event(JobStarted, env, er))

        async def marked() -> EphemeralRunner | None:
            cur = await env.er(name)
            return cur if cur is not None and ANNOTATION_JOB_COMPLETED in cur.metadata.annotations else None

        cur = await wait_for(marked, timeout=20, what="the redelivered JobCompleted's mark")
        assert cur.status is not None and cur.status.job_id == completed.job_id
        assert [k for k, _ in writes.items] == ["status", "merge"], writes.items  # the job's fields, the mark
        assert set(writes.of("merge")[0]["metadata"]) == {"annotations"}  # the runner is still up


@asynccontextmanager
async def _pending_pod(
    started: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[RunnerEnv, Writes, float]]:
    """In the runner env ``started``: a new runner whose pod the kubelet reports Pending; the env,
    its writes, and a time taken before the Pending write (the watch event may start the pass
    before the write's answer is back)."""
    async with started as env:
        writes = Writes(env, name, monkeypatch)
        await env.create_er(name)
        await env.wait_pod(name)
        after = anyio.current_time()
        await env.set_pod_status(name, PENDING)
        yield env, writes, after


@asynccontextmanager
async def _running_runner(
    started: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[RunnerEnv, EphemeralRunner, Writes]]:
    """In the runner env ``started``: a runner registered and Running; the env, the ER, and its
    writes from then on."""
    async with started as env:
        await env.create_er(name)
        er = await wait_for(lambda: _with_runner_id(env, name), what=f"{name} registered")
        await env.run(name)
        await wait_for(lambda: _running(env, name), what=f"{name} Running")
        yield env, er, Writes(env, name, monkeypatch)


async def _with_runner_id(env: RunnerEnv, name: str) -> EphemeralRunner | None:
    er = await env.er(name)
    return er if er is not None and er.status is not None and er.status.runner_id else None


async def _job_recorded(env: RunnerEnv, name: str) -> bool:
    er = await env.er(name)
    return er is not None and er.status is not None and bool(er.status.job_id)


async def _running(env: RunnerEnv, name: str) -> bool:
    er = await env.er(name)
    return er is not None and er.status is not None and er.status.phase == "Running"
