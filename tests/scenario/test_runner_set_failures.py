"""Failed runners stop consuming capacity (TTL swap) and a spec that can never run backs off
(failure budget): the runner-set worker and the runner worker together against the emulator,
nats-server and the Actions simulator. The "broken spec" is a template without a container named
``runner``: the runner worker marks every runner Failed (InvalidPod) right after registering it."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from services.runner.worker import WORKER as RUNNER
from services.runner_set import failures
from services.runner_set.failures import ANNOTATION_REPLACES, FailurePolicy
from services.runner_set.worker import WORKER
from shared.api import EphemeralRunner
from shared.api.constants import ANNOTATION_ACTIONABLE_REVISION
from shared.bus import Bus, DesiredState, ResourceRef
from shared.kube import EPHEMERAL_RUNNER_SETS, EPHEMERAL_RUNNERS, EVENTS, ObjectKey
from shared.worker import WorkerSettings, running_worker
from tests.fixtures.actions_sim import ActionsSim
from tests.scenario.conftest import Kube, wait_for
from tests.scenario.runner_set_helpers import create_ers, get_ers, runners, sim_scale_set
from tests.scenario.test_runner_helpers import FAST

pytestmark = pytest.mark.anyio

BROKEN = {"containers": [{"name": "not-runner", "image": "x"}], "restartPolicy": "Never"}
FIXED = {"containers": [{"name": "runner", "image": "ghcr.io/actions/runner:v1"}], "restartPolicy": "Never"}


def desired(namespace: str, replicas: int, patch: int = 0) -> DesiredState:
    return DesiredState(
        scale_set_id=1, ers=ResourceRef(namespace, "set"), patch_id=patch, replicas=replicas, listener_epoch=1
    )


class Seen:
    """Every EphemeralRunner uid ever LISTed, with the time first seen (a Failed runner lives at
    least the TTL, far longer than the 20 ms poll, so no creation is missed)."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.objects: dict[str, EphemeralRunner] = {}
        self.runner_worker: Any = None

    def created_between(self, t0: float, t1: float) -> int:
        return sum(1 for t in self.first.values() if t0 <= t < t1)


@asynccontextmanager
async def both_workers(
    kube: Kube,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
    policy: FailurePolicy,
) -> AsyncIterator[tuple[Any, Seen]]:
    ss = await sim_scale_set(actions_sim)
    await create_ers(
        kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss, revision=1
    )
    # break the template after creation (create_ers builds a valid one)
    await kube.writer.patch_merge(
        EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "set"), {"spec": {"ephemeralRunnerSpec": {"spec": BROKEN}}}
    )
    await kube.writer.patch_status(
        EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "set"), {"status": {"appliedActionableRevision": 1}}
    )
    seen = Seen()

    async def watch() -> None:
        while True:
            for r in await runners(kube, namespace, include_deleting=True):
                if r.metadata.uid not in seen.first:
                    seen.first[r.metadata.uid] = anyio.current_time()
                seen.objects[r.metadata.uid] = r
            await anyio.sleep(0.02)  # an observer's poll, not synchronisation

    async with (
        running_worker(WORKER.name, worker_settings("rs"), WORKER.setup(policy)) as rs,
        running_worker("runner", worker_settings("rn", bus={"shards": 2}), RUNNER.setup(FAST)) as rn,
        anyio.create_task_group() as tg,
    ):
        await rs.wait_ready()
        await rn.wait_ready()
        seen.runner_worker = rn
        tg.start_soon(watch)
        try:
            yield rs, seen
        finally:
            tg.cancel_scope.cancel()


async def failed_runners(kube: Kube, namespace: str) -> list[EphemeralRunner]:
    return [r for r in await runners(kube, namespace) if r.status is not None and str(r.status.phase) == "Failed"]


async def ers_events(kube: Kube, namespace: str) -> list[Any]:
    items = (await kube.reader.list(EVENTS, namespace=namespace)).items
    return [e for e in items if e.involved_object.kind == "EphemeralRunnerSet" and e.involved_object.name == "set"]


async def test_failed_runner_is_replaced_after_the_ttl_and_not_before(
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
) -> None:
    ttl = 3.0
    policy = FailurePolicy(failed_runner_ttl=ttl, budget_failures=0)  # TTL only
    async with both_workers(kube, namespace, actions_sim, github_secret, worker_settings, policy) as (_, seen):
        await bus.publish(desired(namespace, 1, patch=5))  # a non-zero patch ID: ARC would never replace it
        first = (await wait_for(lambda: failed_runners(kube, namespace), what="a Failed runner"))[0]
        assert first.status is not None
        assert first.status.reason == "InvalidPod"
        failed_at = failures.failed_at(first)
        assert failed_at is not None and ("actions.github.com/failed-at" in first.metadata.annotations)
        # visible while kept: the set's status counts it
        await wait_for(lambda: _failed_count_is(kube, namespace, 1), what="status.failedEphemeralRunners == 1")

        # not before the TTL: the same single runner, nothing new created
        keep_until = failed_at + dt.timedelta(seconds=ttl - 0.7)
        while dt.datetime.now(dt.UTC) < keep_until:
            live = await runners(kube, namespace)
            assert [r.metadata.uid for r in live] == [first.metadata.uid], "replaced before the TTL"
            await anyio.sleep(0.05)

        # after the TTL: a replacement naming the failed runner, the failed one deleted
        async def replaced() -> EphemeralRunner | None:
            live = await runners(kube, namespace)
            repl = [r for r in live if r.metadata.annotations.get(ANNOTATION_REPLACES) == first.metadata.uid]
            return repl[0] if repl and first.metadata.uid not in {r.metadata.uid for r in live} else None

        repl = await wait_for(replaced, timeout=ttl + 10, what="replacement of the failed runner")
        # The observer polls on its own: wait for it to have recorded the replacement too.
        await wait_for(lambda: repl.metadata.uid in seen.first, what="the observer saw the replacement")
        assert repl.metadata.creation_timestamp is not None
        assert repl.metadata.creation_timestamp >= failed_at.replace(microsecond=0) + dt.timedelta(seconds=int(ttl) - 1)
        events = await wait_for(
            lambda: _events_with(kube, namespace, "FailedRunnerReplaced"), what="FailedRunnerReplaced event"
        )
        assert "InvalidPod" in events[0].message and first.metadata.name in events[0].message
        # counted by reason for the set (runner worker metric)
        value = seen.runner_worker.ctx.registry.get_sample_value(
            "runnerscale_runner_failures_total", {"namespace": namespace, "name": "set", "reason": "InvalidPod"}
        )
        assert value is not None and value >= 1
        # the registration of the failed runner is gone from the service
        service = {r.name for r in await actions_sim.control.runners()}
        assert first.metadata.name not in service


async def test_crash_looping_spec_backs_off_without_churn_and_a_revision_bump_resets_it(
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
) -> None:
    ttl, base = 0.3, 4.0
    policy = FailurePolicy(
        failed_runner_ttl=ttl, budget_failures=2, budget_window=120, backoff_base=base, backoff_max=8
    )
    async with both_workers(kube, namespace, actions_sim, github_secret, worker_settings, policy) as (rs, seen):
        start = anyio.current_time()
        await bus.publish(desired(namespace, 2))

        # the budget is exhausted: a Warning Event on the ERS, the metric, the record on the ERS
        ev = await wait_for(
            lambda: _events_with(kube, namespace, "RunnerFailureBackoff"), timeout=20, what="RunnerFailureBackoff event"
        )
        assert "not creating runners" in ev[0].message and ev[0].type == "Warning"
        registry = rs.ctx.registry
        labels = {
            "name": "set",
            "namespace": namespace,
            "repository": "",
            "organization": _org(actions_sim),
            "enterprise": "",
        }
        await wait_for(
            lambda: (registry.get_sample_value("runnerscale_runner_set_failure_backoffs_total", labels) or 0) >= 1,
            what="backoff metric",
        )
        record = failures.parse_record((await get_ers(kube, namespace)).metadata.annotations)
        assert record is not None and record.level >= 1 and record.revision == 1

        # no unbounded churn: with a 0.3 s TTL and no budget, 2 slots would be swapped ~every
        # 0.4 s (~60 creations in 12 s); the backoff (4 s, then 8 s) allows a handful
        await anyio.sleep_until(start + 12)  # a measurement window, not synchronisation
        made = seen.created_between(start, start + 12)
        assert 4 <= made <= 12, f"{made} runners created in 12 s"

        # a fixed spec (new actionable revision) resets the budget: runners of revision 2 are
        # created at once, not after the (up to 8 s) backoff
        await _patch_spec(kube, namespace, {"actionableRevision": 2, "ephemeralRunnerSpec": {"spec": FIXED}})
        bumped = anyio.current_time()

        async def new_revision() -> list[EphemeralRunner]:
            live = await runners(kube, namespace)
            fresh = [r for r in live if r.metadata.annotations.get(ANNOTATION_ACTIONABLE_REVISION) == "2"]
            return fresh if len(fresh) == 2 else []

        await wait_for(new_revision, timeout=6, what="2 runners of revision 2")
        assert anyio.current_time() - bumped < 6
        reset = await wait_for(
            lambda: _events_with(kube, namespace, "RunnerFailureBudgetReset"), what="RunnerFailureBudgetReset event"
        )
        assert "revision 2" in reset[0].message

        async def reset_recorded() -> bool:  # the Event may be visible before the pass's own writes
            ers = await get_ers(kube, namespace)
            record = failures.parse_record(ers.metadata.annotations)
            applied = ers.status is not None and ers.status.applied_actionable_revision == 2
            return record is not None and record.revision == 2 and record.level == 0 and applied

        await wait_for(reset_recorded, what="budget record reset and revision 2 applied in status")


# --- helpers ------------------------------------------------------------------------------------------


def _org(actions_sim: ActionsSim) -> str:
    from shared.actions import parse_config_url

    return parse_config_url(actions_sim.config_url()).organization


async def _failed_count_is(kube: Kube, namespace: str, n: int) -> bool:
    ers = await get_ers(kube, namespace)
    return ers.status is not None and ers.status.failed_ephemeral_runners == n


async def _events_with(kube: Kube, namespace: str, reason: str) -> list[Any]:
    return [e for e in await ers_events(kube, namespace) if e.reason == reason]


async def _patch_spec(kube: Kube, namespace: str, spec: dict[str, Any]) -> None:
    await kube.edit(EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "set"), {"spec": spec})


async def test_backoff_survives_a_runner_set_restart(
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
) -> None:
    """The backoff is a timestamp on the ERS, not a timer in a process: a new runner-set instance
    creates nothing until the recorded end, then resumes."""
    policy = FailurePolicy(failed_runner_ttl=0.3, budget_failures=1, budget_window=120, backoff_base=6, backoff_max=6)
    ss = await sim_scale_set(actions_sim)
    await create_ers(
        kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss, revision=1
    )
    await kube.writer.patch_merge(
        EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "set"), {"spec": {"ephemeralRunnerSpec": {"spec": BROKEN}}}
    )
    await kube.writer.patch_status(
        EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "set"), {"status": {"appliedActionableRevision": 1}}
    )
    async with running_worker("runner", worker_settings("rn", bus={"shards": 2}), RUNNER.setup(FAST)) as rn:
        await rn.wait_ready()
        async with running_worker(WORKER.name, worker_settings("rs-a"), WORKER.setup(policy)) as rs:
            await rs.wait_ready()
            await bus.publish(desired(namespace, 2))
            await wait_for(
                lambda: _events_with(kube, namespace, "RunnerFailureBackoff"),
                timeout=20,
                what="RunnerFailureBackoff event",
            )
        record = failures.parse_record((await get_ers(kube, namespace)).metadata.annotations)
        assert record is not None and record.until is not None and record.level == 1
        known = {r.metadata.uid for r in await runners(kube, namespace, include_deleting=True)}

        async with running_worker(WORKER.name, worker_settings("rs-b"), WORKER.setup(policy)) as rs2:
            await rs2.wait_ready()
            # the new instance honours the recorded backoff: nothing created before its end
            while dt.datetime.now(dt.UTC) < record.until - dt.timedelta(seconds=0.5):
                fresh = {r.metadata.uid for r in await runners(kube, namespace, include_deleting=True)} - known
                assert not fresh, "a runner was created during the recorded backoff"
                await anyio.sleep(0.05)

            # ... and resumes afterwards (the expired Failed runners are swapped)
            async def created_after() -> set[str]:
                return {r.metadata.uid for r in await runners(kube, namespace, include_deleting=True)} - known

            await wait_for(created_after, timeout=15, what="runners created after the backoff")


async def test_a_runner_that_gets_a_job_resets_the_budget(
    kube: Kube,
    bus: Bus,
    namespace: str,
    actions_sim: ActionsSim,
    github_secret: str,
    worker_settings: Callable[..., WorkerSettings],
) -> None:
    """Failures made by hand (as the runner worker would: failed-at stamp, then phase Failed); after
    the backoff the swapped-in runners are created, one gets a job → the budget is reset."""
    from tests.scenario.runner_set_helpers import fake_runner_worker, set_runner_status

    policy = FailurePolicy(failed_runner_ttl=0.5, budget_failures=1, budget_window=120, backoff_base=2, backoff_max=4)
    ss = await sim_scale_set(actions_sim)
    await create_ers(
        kube, namespace, config_url=actions_sim.config_url(), secret=github_secret, scale_set_id=ss, revision=1
    )
    await kube.writer.patch_status(
        EPHEMERAL_RUNNER_SETS, ObjectKey(namespace, "set"), {"status": {"appliedActionableRevision": 1}}
    )
    async with (
        running_worker(WORKER.name, worker_settings("rs"), WORKER.setup(policy)) as rs,
        fake_runner_worker(kube, namespace, actions_sim, ss, register=False),
    ):
        await rs.wait_ready()
        await bus.publish(desired(namespace, 2))
        first = await wait_for(lambda: _live_is(kube, namespace, 2), what="2 runners")
        for r in first:
            await kube.edit(
                EPHEMERAL_RUNNERS,
                EPHEMERAL_RUNNERS.key_of(r),
                {"metadata": {"annotations": {failures.ANNOTATION_FAILED_AT: dt.datetime.now(dt.UTC).isoformat()}}},  # type: ignore[attr-defined]  # imported there from shared.api.constants
            )
            await set_runner_status(kube, r, phase="Failed", reason="TooManyPodFailures", message="made by the test")
        await wait_for(lambda: _events_with(kube, namespace, "RunnerFailureBackoff"), what="RunnerFailureBackoff event")

        # after the backoff the failed runners are swapped; one replacement gets a job
        async def a_replacement() -> EphemeralRunner | None:
            live = await runners(kube, namespace)
            repl = [r for r in live if r.metadata.annotations.get(ANNOTATION_REPLACES)]
            return repl[0] if repl else None

        repl = await wait_for(a_replacement, timeout=10, what="a replacement runner")
        await set_runner_status(kube, repl, phase="Running", runnerId=77, jobId="job-1", ready=True)
        reset = await wait_for(
            lambda: _events_with(kube, namespace, "RunnerFailureBudgetReset"), what="RunnerFailureBudgetReset event"
        )
        assert "got a job" in reset[0].message and repl.metadata.name in reset[0].message
        record = failures.parse_record((await get_ers(kube, namespace)).metadata.annotations)
        assert record is not None and record.level == 0 and record.failures == {} and record.reset_at is not None


async def _live_is(kube: Kube, namespace: str, n: int) -> list[EphemeralRunner]:
    live = await runners(kube, namespace)
    return live if len(live) == n else []
